"""Configuration: flags > environment > file > defaults, every source checked, and the
documentation lists every setting."""
import json
from pathlib import Path

import pytest

from tryll_fast.server.config import SETTINGS, ConfigError, describe, load_config

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_defaults():
    cfg = load_config(environ={})
    assert (cfg.host, cfg.port, cfg.dev, cfg.mode) == ("127.0.0.1", 9100, False, "release")
    assert cfg.transport_send_queue_high_bytes == 4 << 20
    assert cfg.transport_stall_timeout_ms == 30000
    assert cfg.storage_root.name == "storage"
    assert all(v == "default" for v in cfg.sources.values())


def test_a_source_checkout_serves_with_a_short_tool_call_pause():
    # make serve reads data/server-config.json: a ToolCall pause nobody resumes ends after
    # 2 s there, while the released server's default waits for ever
    root = DOCS.parents[1]
    cfg = load_config(config_file=root / "data" / "server-config.json", environ={})
    assert cfg.workflow_tool_call_pause_timeout_ms == 2000
    assert load_config(environ={}).workflow_tool_call_pause_timeout_ms == 0
    make = (root / "Makefile").read_text()
    assert "SERVE_CONFIG ?= data/server-config.json" in make and "--config $(SERVE_CONFIG)" in make


def test_precedence_flags_over_env_over_file(tmp_path):
    f = tmp_path / "server.json"
    f.write_text(json.dumps({"port": 9200, "host": "127.0.0.2",
                             "transport": {"stall_timeout_ms": 1234},
                             "llama.n_slots": 4}))
    env = {"TRYLL_PORT": "9300", "TRYLL_TRANSPORT_STALL_TIMEOUT_MS": "2000", "TRYLL_DEV": "yes"}
    cfg = load_config(flags={"port": 9400}, config_file=f, environ=env)
    assert cfg.port == 9400 and cfg.sources["port"] == "flag"
    assert cfg.transport_stall_timeout_ms == 2000 and cfg.sources[
        "transport.stall_timeout_ms"] == "env"
    assert cfg.host == "127.0.0.2" and cfg.sources["host"] == f"file {f}"
    assert cfg.llama_n_slots == 4
    assert cfg.dev is True and cfg.mode == "dev"


def test_toml_file_and_config_from_environment(tmp_path):
    f = tmp_path / "server.toml"
    f.write_text('log_level = "debug"\n[transport]\nmax_connections = 8\n'
                 '[models]\npreload = ["SmolLM2-135M-Instruct"]\n')
    cfg = load_config(environ={"TRYLL_CONFIG": str(f)})
    assert cfg.log_level == "debug" and cfg.transport_max_connections == 8
    assert cfg.models_preload == ("SmolLM2-135M-Instruct",)
    cfg = load_config(environ={"TRYLL_MODELS_PRELOAD": "a, b"})
    assert cfg.models_preload == ("a", "b")


def test_set_overrides(tmp_path):
    cfg = load_config(environ={}, overrides=["shutdown.deadline_ms=5", "transport.direct_send=0"])
    assert cfg.shutdown_deadline_ms == 5 and cfg.transport_direct_send is False


@pytest.mark.parametrize("kwargs,words", [
    ({"overrides": ["nope=1"]}, "nope: unknown setting"),
    ({"overrides": ["port"]}, "expected key=value"),
    ({"overrides": ["port=abc"]}, "port: expected an integer"),
    ({"overrides": ["port=70000"]}, "above the maximum"),
    ({"overrides": ["log_level=loud"]}, "not one of debug"),
    ({"environ": {"TRYLL_DEV": "maybe"}}, "TRYLL_DEV: dev: expected true or false"),
    ({"overrides": ["transport.send_queue_low_bytes=9000000"]}, "must be <="),
    ({"overrides": ["llama.n_batch=8", "llama.n_slots=16"]}, "llama.n_batch"),
])
def test_bad_values_name_the_key_and_the_constraint(kwargs, words):
    kwargs.setdefault("environ", {})
    with pytest.raises(ConfigError) as info:
        load_config(**kwargs)
    assert words in str(info.value)


@pytest.mark.parametrize("name,text,words", [
    ("a.json", '{"transport": {"bogus": 1}}', "transport.bogus: unknown setting"),
    ("b.json", "[1, 2]", "top level must be"),
    ("c.json", "{nope", "not valid JSON"),
    ("d.toml", "port = 'x'", "port: expected an integer"),
    ("e.yaml", "port: 1", "must end in .json or .toml"),
])
def test_bad_files(tmp_path, name, text, words):
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(environ={}, config_file=f)
    assert words in str(info.value) and str(f) in str(info.value)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(environ={}, config_file=tmp_path / "none.json")


def test_docs_list_every_setting():
    text = DOCS.read_text()
    for setting in SETTINGS:
        assert describe(setting) in text, f"docs/configuration.md misses {setting.key}"


def test_kv_eviction_settings(tmp_path):
    cfg = load_config(environ={})
    assert cfg.workflow_kv_evict_tier == "file" and cfg.llama_kv_spill_dir is None
    opts = cfg.engine_options()["llama-cpp"]
    assert (opts["evict_to"], opts["spill_dir"]) == ("file", None)
    cfg = load_config(environ={"TRYLL_LLAMA_KV_SPILL_DIR": str(tmp_path)},
                      overrides=["workflow.kv_evict_tier=host"])
    assert cfg.workflow_kv_evict_tier == "host" and cfg.llama_kv_spill_dir == tmp_path
    assert cfg.engine_options()["llama-cpp"]["evict_to"] == "host"
    assert cfg.engine_options()["llama-cpp"]["spill_dir"] == tmp_path
    # "free" only changes EvictAgentKvCache: a full slot table still spills to a file
    cfg = load_config(environ={}, overrides=["workflow.kv_evict_tier=free"])
    assert cfg.engine_options()["llama-cpp"]["evict_to"] == "file"
    with pytest.raises(ConfigError, match="not one of file, host, free"):
        load_config(environ={}, overrides=["workflow.kv_evict_tier=disk"])
