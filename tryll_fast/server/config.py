"""Server configuration: one table of settings, four sources, one precedence.

flags > environment > config file > defaults. Every setting has a dotted key (the name in
the config file), an environment variable (`TRYLL_` + the key in upper case, dots as
underscores) and, for the common ones, a command-line flag; any setting can also be given on
the command line as `--set key=value`. The config file is JSON (`.json`) or TOML (`.toml`),
nested sections or dotted keys. An unknown key or a bad value is a `ConfigError` naming the
source, the key and the constraint. docs/configuration.md lists every setting (a test keeps
the two in step).
"""
from __future__ import annotations

import json
import math
import os
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from tryll_fast.models.fetch import resolve_models_dir
from tryll_fast.prompting.character import CHARACTER_FRAME

ENV_PREFIX = "TRYLL_"
ENV_CONFIG = "TRYLL_CONFIG"
LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


class ConfigError(ValueError):
    def __init__(self, source: str, key: str, problem: str) -> None:
        self.source = source
        self.key = key
        super().__init__(f"config: {source}: {key}: {problem}" if key else
                         f"config: {source}: {problem}")


def default_storage_root() -> Path:
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "tryll_fast" / "storage"


@dataclass(frozen=True)
class Setting:
    key: str
    kind: str                 # int | float | bool | str | path | list
    default: Any              # a value, or a zero-argument callable for computed defaults
    doc: str
    flag: str | None = None
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper().replace(".", "_")

    @property
    def attr(self) -> str:
        return self.key.replace(".", "_")

    def default_value(self) -> Any:
        return self.default() if callable(self.default) else self.default

    def parse(self, raw: Any, source: str) -> Any:
        """A value from a file (typed) or from the environment / a flag (a string)."""
        def bad(problem: str) -> ConfigError:
            return ConfigError(source, self.key, problem)

        value: Any
        if self.kind == "bool":
            if isinstance(raw, bool):
                value = raw
            elif isinstance(raw, str) and raw.strip().lower() in _TRUE + _FALSE:
                value = raw.strip().lower() in _TRUE
            else:
                raise bad(f"expected true or false, got {raw!r}")
        elif self.kind == "int":
            if isinstance(raw, bool) or not isinstance(raw, (int, str)):
                raise bad(f"expected an integer, got {raw!r}")
            try:
                value = int(raw)
            except ValueError:
                raise bad(f"expected an integer, got {raw!r}") from None
        elif self.kind == "float":
            if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
                raise bad(f"expected a number, got {raw!r}")
            try:
                value = float(raw)
            except ValueError:
                raise bad(f"expected a number, got {raw!r}") from None
            if not math.isfinite(value):
                raise bad(f"must be finite, got {raw!r}")
        elif self.kind == "list":
            if isinstance(raw, str):
                value = tuple(x.strip() for x in raw.split(",") if x.strip())
            elif isinstance(raw, (list, tuple)) and all(isinstance(x, str) for x in raw):
                value = tuple(raw)
            else:
                raise bad(f"expected a list of strings, got {raw!r}")
        else:  # str, path
            if not isinstance(raw, str):
                raise bad(f"expected a string, got {raw!r}")
            value = raw
            if self.kind == "path":
                value = Path(raw).expanduser() if raw else None
        if self.choices and value not in self.choices:
            raise bad(f"{value!r} is not one of {', '.join(self.choices)}")
        if self.minimum is not None and value < self.minimum:
            raise bad(f"{value!r} is below the minimum {self.minimum:g}")
        if self.maximum is not None and value > self.maximum:
            raise bad(f"{value!r} is above the maximum {self.maximum:g}")
        return value


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
MiB = 1 << 20
EVICT_TIERS = ("file", "host", "free")

SETTINGS: tuple[Setting, ...] = (
    Setting("host", "str", "127.0.0.1", "address to listen on", "--host"),
    Setting("port", "int", 9100, "TCP port (0 = any free port)", "--port", minimum=0,
            maximum=65535),
    Setting("storage_root", "path", default_storage_root,
            "process-wide root for storage files and dialog saves", "--storage-root"),
    Setting("models_dir", "path", lambda: resolve_models_dir(None),
            "where model files live (also read by `tryll-fast models`)", "--models-dir"),
    Setting("catalog", "path", None, "model catalog TOML (empty = the packaged catalog)",
            "--catalog"),
    Setting("dev", "bool", False, "development mode: DebugCommandRequest is served, "
            "ConnectionReady.mode = \"dev\"", "--dev"),
    Setting("log_level", "str", "info", "debug, info, warning or error", "--log-level",
            choices=LOG_LEVELS),
    Setting("log_format", "str", "text", "text (key=value) or json (one object per line)",
            "--log-format", choices=LOG_FORMATS),
    Setting("pipeline.port", "int", 9101,
            "port of the pipeline transport (WebSocket `/pipeline`, Socket.IO "
            "`/socket.io/`; docs/pipeline.md); 0 = no pipeline server", "--pipeline-port",
            minimum=0, maximum=65535),
    Setting("pipeline.host", "str", "127.0.0.1", "address the pipeline transport listens on"),
    Setting("pipeline.config", "path", None,
            "pipeline agents and action mappers, TOML (empty = the packaged example: "
            "`innkeeper` and `bard`)", "--pipeline-config"),
    Setting("pipeline.allowed_origins", "list", (),
            "web page origins (scheme://host:port) that may open pipeline connections from "
            "a browser, besides the pipeline's own page; `*` = any. Clients that send no "
            "Origin (games, scripts) are always served"),
    Setting("transport.send_queue_high_bytes", "int", 4 * MiB,
            "outbound bytes queued for one connection at which its producers pause and its "
            "requests stop being read", minimum=64 * 1024),
    Setting("transport.send_queue_low_bytes", "int", 1 * MiB,
            "queued bytes at which a paused connection resumes", minimum=1),
    Setting("transport.stall_timeout_ms", "int", 30_000,
            "a connection paused this long (the client reads nothing) is closed and its "
            "session destroyed", minimum=1),
    Setting("transport.max_connections", "int", 1024,
            "connections beyond this are closed on accept", minimum=1),
    Setting("transport.max_frames_per_second", "int", 10_000,
            "frames one connection may send per second (a bucket of one second's worth); a "
            "connection past it is not read until it has budget again, so one flooding client "
            "cannot take the reactor's CPU from the others. 0 = no budget", minimum=0),
    Setting("transport.refused_frame_cost", "float", 10.0,
            "frames' worth of transport.max_frames_per_second a request refused on arrival "
            "(undecodable, unknown, over a cap, invalid: any ErrorResponse sent before it "
            "runs) takes on top of its own frame, so a client sending what can only be "
            "refused is read about this many times slower (the debt stops at one second's "
            "worth). 0 = refused frames cost what served ones do", minimum=0.0),
    Setting("transport.direct_send", "bool", True,
            "a frame sent from another thread onto an empty queue is written by that thread, "
            "unless the connection had such a write < 50 µs ago (a burst: queued for one "
            "batched write); false: always queued and written by the reactor after an eventfd "
            "wakeup"),
    Setting("shutdown.deadline_ms", "int", 10_000,
            "on SIGINT/SIGTERM, how long running turns and operations may finish before they "
            "are cancelled", minimum=0),
    Setting("workers.threads", "int", 4,
            "threads for blocking work (model loads, memory snapshots, teardown)", minimum=1,
            maximum=64),
    Setting("workers.max_downloads", "int", 2, "model downloads running at once", minimum=1,
            maximum=16),
    Setting("models.preload", "list", (),
            "models to load and pin at startup (comma-separated in the environment)"),
    Setting("workflow.default_llm", "str", "",
            "the language model of a graph that names none (CreateAgent's "
            "default_model_name and the node's model_name both empty), and of the example "
            "pipeline agents; empty = the catalog's `default = true` one",
            flag="--llm"),
    Setting("workflow.character_frame", "str", lambda: CHARACTER_FRAME,
            "text that opens the system message of every Generate and GenerateAndSpeak "
            "node, before the node's own system_prompt: it keeps small models in character "
            "(docs/npc-quality.md); empty = none"),
    Setting("workflow.tool_prompt", "str", "template",
            "how a ToolCall node describes its tools to the model: template (the chat "
            "template's own tools section, where it has one) or own (the server's block in "
            "the system message); docs/npc-quality.md has both measured",
            choices=("template", "own")),
    Setting("workflow.max_steps_per_turn", "int", 64,
            "node runs per turn before it fails with 4001 \"Max steps per turn (N) exceeded\"",
            minimum=1, maximum=100_000),
    Setting("session.max_queued_requests", "int", 1024,
            "requests one session may have waiting behind its lane (CreateAgent, LoadModel, "
            "CreateVoiceInput...); one more: 2008, the connection stays", minimum=1),
    Setting("session.lane_cpu_share", "float", 0.1,
            "while another session has a turn running, the share of one core a session's "
            "lane (CreateAgent, LoadModel, memory requests...) may use once its burst is "
            "spent; its next request then waits (0 = never paced)", minimum=0.0,
            maximum=1.0),
    Setting("session.lane_cpu_burst_ms", "int", 1000,
            "CPU time a session's lane may use at once before session.lane_cpu_share "
            "paces it (refilled at that share)", minimum=1),
    Setting("session.max_voice_inputs", "int", 64,
            "voice inputs one session may hold at once (CreateVoiceInput beyond it: 2008)",
            minimum=1),
    Setting("session.max_string_storages", "int", 1024,
            "string storages one session may hold at once (CreateStringStorage beyond "
            "it: 2008)", minimum=1),
    Setting("session.max_string_storage_chars", "int", 64 << 20,
            "characters all of one session's string storages may hold together (a "
            "CreateStringStorage that would pass it: 2008)", minimum=1),
    Setting("session.max_embedded_storages", "int", 64,
            "embedded string storages one session may hold at once "
            "(CreateEmbeddedStringStorage beyond it: 2008)", minimum=1),
    Setting("session.max_mutable_kbs", "int", 64,
            "mutable knowledge bases one session may hold at once (EnsureMutableKb or "
            "LoadGameMemory beyond it: 8105 MutableKbLimitExceeded)", minimum=1),
    Setting("workflow.max_agents_per_session", "int", 256,
            "agents one session may hold at once (CreateAgent beyond it: 2008)", minimum=1),
    Setting("workflow.tool_call_pause_timeout_ms", "int", 0,
            "how long a ToolCall pause waits for ResumeAgentRequest when the node's "
            "pause_timeout_ms is 0 (0 = forever); expiry ends the turn with PauseTimedOut",
            minimum=0),
    Setting("workflow.turn_timeout_ms", "int", 0,
            "how long a turn may work (its pauses for the client not counted) before it "
            "ends with 4002 InferenceTimeout and TurnComplete(Error), its interaction "
            "removed as for any failure; 0 = no limit", minimum=0),
    Setting("workflow.include_engine_diagnostics", "bool", True,
            "a turn's diagnostics (enable_diagnostics) carry each model node's engine "
            "block: the scheduler's figures for its request and chat_turn (has_grammar, "
            "grammar_lazy); off = no engine block"),
    Setting("workflow.include_interaction_in_diagnostics", "bool", False,
            "a turn's diagnostics carry its interaction snapshot: every component of the "
            "exchange in order, tool calls (ToolCallRecord) and their results "
            "(ToolResultComponent) linked by call_id"),
    Setting("workflow.kv_evict_tier", "str", "file",
            "where EvictAgentKvCache puts each conversation's KV: file (spilled to a file "
            "under llama.kv_spill_dir: the memory is given back and the next turn restores "
            "it in milliseconds), host (a copy in RAM: as fast and no disk, but the copy "
            "holds the memory) or free (freed; the next turn re-prefills the dialog). A "
            "model's least recently used conversation, evicted when every slot is taken, "
            "goes to a file too, or to RAM with host", choices=EVICT_TIERS),
    Setting("workflow.regex_timeout_ms", "int", 50,
            "time limit of one guardrail pattern search on one message (over it: 4001)",
            minimum=1, maximum=10_000),
    Setting("llama.max_n_ctx", "int", 4096,
            "cap on a language model's KV cache cells (its catalog context_size is the other "
            "bound)", minimum=256),
    Setting("llama.n_slots", "int", 8, "conversations resident in one model's KV cache",
            minimum=1, maximum=256),
    Setting("llama.n_batch", "int", 512, "tokens per decode step", minimum=8),
    Setting("llama.prefill_while_decoding", "int", 128,
            "prompt tokens a decode step may carry while other conversations are streaming "
            "(0 = n_batch): lower keeps running streams smooth when a long prompt arrives, "
            "higher gets that prompt its first token sooner", minimum=0),
    Setting("llama.context_shift", "bool", True,
            "when a dialog's oldest turns leave the window, keep the KV of the turns that "
            "stay (their cells moved down, as llama.cpp's server shifts a context) instead "
            "of decoding them again; false: exact, the prompt decoded again from the cut"),
    Setting("llama.n_threads", "int", 2, "CPU threads per language model", minimum=1,
            maximum=256),
    Setting("llama.adaptive_threads", "bool", True,
            "before each decode, leave to the rest of the machine the cores it kept busy "
            "lately (a game beside the server): the decode runs with fewer threads, down to "
            "one; false: always llama.n_threads"),
    Setting("llama.placement", "str", "auto",
            "where a language model's layers go when the session's placement hint leaves it "
            "to the server: auto (a GPU when one has twice the weights' size free, else host "
            "memory), ram, or vram (a GPU; host memory, with a log line, when there is none or "
            "it is too full). A CPU build has no GPU: every placement is host memory",
            choices=("auto", "ram", "vram")),
    Setting("llama.n_gpu_layers", "int", -1,
            "layers a GPU placement offloads, counting the output layer (-1 = all)",
            minimum=-1),
    Setting("llama.kv_spill_dir", "path", None,
            "root of the files evicted KV states are written to: inside it each loaded model "
            "gets its own directory (mode 0700, named by process id), deleted when the model "
            "is unloaded (empty = `$XDG_CACHE_HOME/tryll_fast/kv`, else "
            "`~/.cache/tryll_fast/kv`)"),
    Setting("voice.chunk_ms", "int", 40,
            "audio per TtsAudioFrame in milliseconds (a game's audio callback reads 20-40 "
            "ms at a time)", minimum=5, maximum=1000),
    Setting("voice.lookahead_ms", "int", 10_000,
            "how far ahead of a listener's playback a voice synthesizes: a sentence needed "
            "later waits (bounds the audio queued in the client and the work a cancel "
            "discards)", minimum=0),
    Setting("voice.n_threads", "int", 2, "CPU threads per voice's synthesis", minimum=1,
            maximum=256),
    Setting("stt.n_threads", "int", 2, "CPU threads per speech-to-text model's decoding "
            "(voice inputs)", minimum=1, maximum=256),
)
SETTINGS_BY_KEY: Mapping[str, Setting] = {s.key: s for s in SETTINGS}


def _resolve(key: str, raw: Any, source: str) -> tuple[str, Any] | None:
    """(setting key, parsed value) of a key from any source; None if unknown."""
    setting = SETTINGS_BY_KEY.get(key)
    if setting is not None:
        return key, setting.parse(raw, source)
    return None


@dataclass(frozen=True)
class ServerConfig:
    """The resolved settings (build one with load_config(); defaults live in SETTINGS)."""
    host: str
    port: int
    storage_root: Path
    models_dir: Path
    catalog: Path | None
    dev: bool
    log_level: str
    log_format: str
    pipeline_port: int
    pipeline_host: str
    pipeline_config: Path | None
    pipeline_allowed_origins: tuple[str, ...]
    transport_send_queue_high_bytes: int
    transport_send_queue_low_bytes: int
    transport_stall_timeout_ms: int
    transport_max_connections: int
    transport_max_frames_per_second: int
    transport_refused_frame_cost: float
    transport_direct_send: bool
    shutdown_deadline_ms: int
    workers_threads: int
    workers_max_downloads: int
    models_preload: tuple[str, ...]
    workflow_default_llm: str
    workflow_character_frame: str
    workflow_tool_prompt: str
    workflow_max_steps_per_turn: int
    session_max_queued_requests: int
    session_lane_cpu_share: float
    session_lane_cpu_burst_ms: int
    session_max_voice_inputs: int
    session_max_string_storages: int
    session_max_string_storage_chars: int
    session_max_embedded_storages: int
    session_max_mutable_kbs: int
    workflow_max_agents_per_session: int
    workflow_tool_call_pause_timeout_ms: int
    workflow_turn_timeout_ms: int
    workflow_include_engine_diagnostics: bool
    workflow_include_interaction_in_diagnostics: bool
    workflow_kv_evict_tier: str
    workflow_regex_timeout_ms: int
    llama_max_n_ctx: int
    llama_n_slots: int
    llama_n_batch: int
    llama_prefill_while_decoding: int
    llama_context_shift: bool
    llama_n_threads: int
    llama_adaptive_threads: bool
    llama_placement: str
    llama_n_gpu_layers: int
    llama_kv_spill_dir: Path | None
    voice_chunk_ms: int
    voice_lookahead_ms: int
    voice_n_threads: int
    stt_n_threads: int
    # where each value came from: key -> "flag" | "env" | "file <path>" | "default"
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.transport_send_queue_low_bytes > self.transport_send_queue_high_bytes:
            raise ConfigError(
                self.sources.get("transport.send_queue_low_bytes", "settings"),
                "transport.send_queue_low_bytes",
                f"{self.transport_send_queue_low_bytes} must be <= "
                f"transport.send_queue_high_bytes ({self.transport_send_queue_high_bytes})")
        if self.llama_n_batch < self.llama_n_slots:
            raise ConfigError(self.sources.get("llama.n_batch", "settings"), "llama.n_batch",
                              f"{self.llama_n_batch} must be >= llama.n_slots "
                              f"({self.llama_n_slots}): each step holds a token per slot")

    @property
    def mode(self) -> str:
        """ConnectionReady.mode."""
        return "dev" if self.dev else "release"

    def get(self, key: str) -> Any:
        return getattr(self, SETTINGS_BY_KEY[key].attr)

    def replace(self, **values: Any) -> "ServerConfig":
        """A copy with some attributes changed (tests, benchmarks)."""
        current = {f.name: getattr(self, f.name) for f in fields(self)}
        current.update(values)
        return ServerConfig(**current)

    def engine_options(self) -> dict[str, dict[str, Any]]:
        """ModelManager engine_options."""
        return {"llama-cpp": {"max_n_ctx": self.llama_max_n_ctx, "n_slots": self.llama_n_slots,
                              "n_batch": self.llama_n_batch, "n_threads": self.llama_n_threads,
                              "n_threads_batch": self.llama_n_threads,
                              "adaptive_threads": self.llama_adaptive_threads,
                              "prefill_while_decoding": self.llama_prefill_while_decoding,
                              "context_shift": self.llama_context_shift,
                              # the slot table's own evictions follow the tier ("free" is
                              # for EvictAgentKvCache only: those still go to a file)
                              "evict_to": "host" if self.workflow_kv_evict_tier == "host"
                              else "file",
                              "spill_dir": self.llama_kv_spill_dir,
                              "placement": self.llama_placement,
                              "n_gpu_layers": (None if self.llama_n_gpu_layers < 0
                                               else self.llama_n_gpu_layers)},
                "onnxruntime": {"n_threads": self.voice_n_threads,
                                "lookahead_s": self.voice_lookahead_ms / 1000.0},
                "faster-whisper": {"n_threads": self.stt_n_threads}}


def _check_table() -> None:
    attrs = {f.name for f in fields(ServerConfig)} - {"sources"}
    keys = {s.attr for s in SETTINGS}
    assert attrs == keys, f"ServerConfig and SETTINGS disagree: {sorted(attrs ^ keys)}"


_check_table()


def load_config(*, flags: Mapping[str, Any] | None = None, overrides: Iterable[str] = (),
                config_file: str | os.PathLike | None = None,
                environ: Mapping[str, str] | None = None) -> ServerConfig:
    """Build the configuration. flags: key -> value from argparse (None = not given);
    overrides: "key=value" strings (`--set`); config_file: the --config path (else
    $TRYLL_CONFIG); environ: defaults to os.environ."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    path = config_file or env.get(ENV_CONFIG) or None
    if path:
        for key, raw in _read_file(Path(path)).items():
            source = f"file {path}"
            resolved = _resolve(key, raw, source)
            if resolved is None:
                raise ConfigError(source, key, f"unknown setting (known: {_known()})")
            values[resolved[0]] = resolved[1]
            sources[resolved[0]] = source
    for setting in SETTINGS:
        if setting.env in env and not (setting.key == "models_dir" and not env[setting.env]):
            values[setting.key] = setting.parse(env[setting.env], f"environment {setting.env}")
            sources[setting.key] = "env"
    for key, raw in (flags or {}).items():
        if raw is None:
            continue
        setting = SETTINGS_BY_KEY.get(key)
        if setting is None:
            raise ConfigError("command line", key, "unknown setting")
        values[key] = raw if not isinstance(raw, str) else setting.parse(raw, "command line")
        if setting.kind == "path" and isinstance(values[key], str):
            values[key] = Path(values[key]).expanduser()
        sources[key] = "flag"
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError("--set", item, "expected key=value")
        resolved = _resolve(key, raw, "--set")
        if resolved is None:
            raise ConfigError("--set", key, f"unknown setting (known: {_known()})")
        values[resolved[0]] = resolved[1]
        sources[resolved[0]] = "flag"

    kwargs: dict[str, Any] = {}
    for setting in SETTINGS:
        if setting.key in values:
            kwargs[setting.attr] = values[setting.key]
        else:
            kwargs[setting.attr] = setting.default_value()
            sources[setting.key] = "default"
        if setting.kind == "path" and kwargs[setting.attr] is None and setting.default is not None:
            kwargs[setting.attr] = setting.default_value()   # an empty path = the default
    return ServerConfig(**kwargs, sources=sources)


def _known() -> str:
    return ", ".join(s.key for s in SETTINGS)


def _read_file(path: Path) -> dict[str, Any]:
    source = f"file {path}"
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(source, "", f"cannot read: {exc.strerror or exc}") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            doc = json.loads(data.decode("utf-8"))
        elif suffix == ".toml":
            doc = tomllib.loads(data.decode("utf-8"))
        else:
            raise ConfigError(source, "", "the config file must end in .json or .toml")
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(source, "", f"not valid {suffix[1:].upper()}: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(source, "", "the top level must be an object / table")
    return dict(_flatten(doc))


def _flatten(doc: Mapping[str, Any], prefix: str = "") -> Iterable[tuple[str, Any]]:
    for key, value in doc.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict) and full not in SETTINGS_BY_KEY:
            yield from _flatten(value, full + ".")
        else:
            yield full, value


def describe(setting: Setting) -> str:
    """One markdown table row (docs/configuration.md is checked against these)."""
    default = setting.default
    if callable(default):
        shown = {"storage_root": "`$XDG_DATA_HOME/tryll_fast/storage`",
                 "models_dir": "`$TRYLL_MODELS_DIR`, else `$XDG_DATA_HOME/tryll_fast/models`",
                 "workflow.character_frame": "`CHARACTER_FRAME` of "
                                             "`tryll_fast/prompting/character.py`",
                 }.get(setting.key, "computed")
    elif isinstance(default, bool):
        shown = f"`{str(default).lower()}`"
    elif default in (None, (), ""):
        shown = "empty"
    else:
        shown = f"`{default}`"
    flag = f"`{setting.flag}`" if setting.flag else ""
    return f"| `{setting.key}` | {flag} | `{setting.env}` | {shown} | {setting.doc} |"


def settings_table() -> str:
    """The markdown table of every setting (docs/configuration.md holds this output)."""
    rows = ["| key | flag | environment | default | meaning |", "|---|---|---|---|---|"]
    rows += [describe(s) for s in SETTINGS]
    return "\n".join(rows)

