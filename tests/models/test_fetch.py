"""Fetching from http(s) and file:// sources: verification, resume, guards, record, status."""
from __future__ import annotations

import json
import os
import shutil
import threading

import pytest
from model_helpers import ServedFile, entry, file_item, make_catalog, sha256

from tryll_fast.errors import DownloadError, ErrorCode
from tryll_fast.models import ModelStatus, ModelStore, ensure_model, resolve_models_dir

try:
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

Code = ErrorCode
# A little over three read chunks, so progress, resume and cut-offs land mid-file.
DATA = bytes(range(256)) * (13 * 1024 + 7)


def http_store(tmp_path, server, data=DATA, path="/m.bin", name="vad", **served) -> ModelStore:
    server.files[path] = ServedFile(data, **served)
    catalog = make_catalog(entry(name, [file_item("m.bin", data, server.url(path))]))
    return ModelStore(tmp_path / "models", catalog)


def error_of(call) -> DownloadError:
    with pytest.raises(DownloadError) as info:
        call()
    return info.value


def test_http_fetch_verifies_renames_and_records(tmp_path, http_server):
    store = http_store(tmp_path, http_server)
    final = store.root / "vad" / "m.bin"
    calls = []

    def progress(done, total, current):
        # Atomic rename: the final name appears only after the whole file was verified.
        assert not final.exists()
        calls.append((done, total, current))

    assert store.status("vad") == ModelStatus.Absent
    assert store.fetch("vad", progress) == final
    assert final.read_bytes() == DATA
    assert not (store.root / "vad" / "m.bin.part").exists()
    assert store.status("vad") == ModelStatus.Downloaded
    dones = [c[0] for c in calls]
    assert dones == sorted(dones) and dones[-1] == len(DATA)
    assert {c[1] for c in calls} == {len(DATA)} and {c[2] for c in calls} == {"vad/m.bin"}
    record = json.loads((store.root / "downloads.json").read_text())
    (item,) = record["models"]["vad"]["files"]
    assert item == {"name": "m.bin", "size": len(DATA), "sha256": sha256(DATA),
                    "source": [http_server.url("/m.bin")]}
    # No temporary record or wheel scratch left behind.
    assert not [p for p in store.root.iterdir() if p.name.startswith(".downloads.json.")
                and p.name.endswith(".tmp")]
    assert list((store.root / ".tmp").iterdir()) == []


def test_second_fetch_does_not_touch_the_network(tmp_path, http_server):
    store = http_store(tmp_path, http_server)
    store.fetch("vad")
    http_server.requests.clear()
    assert store.fetch("vad") == store.path("vad")
    assert http_server.requests == []


def test_resume_sends_range_and_only_the_rest(tmp_path, http_server):
    store = http_store(tmp_path, http_server)
    part = store.root / "vad" / "m.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(DATA[:1_000_000])
    assert store.status("vad") == ModelStatus.Incomplete
    store.fetch("vad")
    assert http_server.requests == [("/m.bin", "bytes=1000000-")]
    assert http_server.body_bytes_sent == len(DATA) - 1_000_000
    assert (store.root / "vad" / "m.bin").read_bytes() == DATA


def test_interrupted_transfer_keeps_part_then_resumes(tmp_path, http_server):
    store = http_store(tmp_path, http_server, cut_at=1_500_000)
    err = error_of(lambda: store.fetch("vad"))
    assert err.code == Code.DownloadFailed and "ended early" in str(err)
    assert "vad/m.bin" in str(err)
    part = store.root / "vad" / "m.bin.part"
    assert part.stat().st_size == 1_500_000
    assert not (store.root / "vad" / "m.bin").exists()
    http_server.files["/m.bin"].cut_at = None
    store.fetch("vad")
    assert http_server.requests[-1] == ("/m.bin", "bytes=1500000-")
    assert (store.root / "vad" / "m.bin").read_bytes() == DATA


def test_server_ignoring_range_restarts_cleanly(tmp_path, http_server):
    store = http_store(tmp_path, http_server, ignore_range=True)
    part = store.root / "vad" / "m.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(DATA[:777])
    seen = []
    store.fetch("vad", lambda done, total, f: seen.append(done))
    assert (store.root / "vad" / "m.bin").read_bytes() == DATA
    assert seen[-1] == len(DATA)


def test_complete_part_is_only_verified(tmp_path, http_server):
    store = http_store(tmp_path, http_server)
    part = store.root / "vad" / "m.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(DATA)
    store.fetch("vad")
    assert http_server.requests == []
    assert (store.root / "vad" / "m.bin").read_bytes() == DATA


def test_lying_server_gives_6001_and_leaves_nothing(tmp_path, http_server):
    lie = bytes(reversed(DATA))
    store = http_store(tmp_path, http_server, lie=lie)
    err = error_of(lambda: store.fetch("vad"))
    assert err.code == Code.DownloadFailed
    assert err.model == "vad" and err.file == "m.bin"
    assert f"expected {sha256(DATA)}, got {sha256(lie)}" in str(err)
    assert os.listdir(store.root / "vad") == []
    assert store.status("vad") == ModelStatus.Absent
    assert "vad" not in json.loads((store.root / "downloads.json").read_text()
                                   if (store.root / "downloads.json").exists()
                                   else '{"models": {}}')["models"]


def test_too_many_bytes_is_6001(tmp_path, http_server):
    store = http_store(tmp_path, http_server, lie=DATA + b"extra")
    err = error_of(lambda: store.fetch("vad"))
    assert err.code == Code.DownloadFailed and "offers" in str(err)
    assert os.listdir(store.root / "vad") == []


def test_404_is_6002_and_500_is_6001(tmp_path, http_server):
    store = http_store(tmp_path, http_server, status=404)
    err = error_of(lambda: store.fetch("vad"))
    assert err.code == Code.DownloadNotAvailable and "HTTP 404" in str(err)
    http_server.files["/m.bin"].status = 500
    err = error_of(lambda: store.fetch("vad"))
    assert err.code == Code.DownloadFailed and "HTTP 500" in str(err)


def test_unreachable_host_is_6001(tmp_path):
    # A port nothing listens on: bind, note the port, close.
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    catalog = make_catalog(entry("vad", [file_item("m.bin", DATA,
                                                   f"http://127.0.0.1:{port}/m.bin")]))
    err = error_of(lambda: ModelStore(tmp_path, catalog).fetch("vad"))
    assert err.code == Code.DownloadFailed and "cannot reach" in str(err)


def test_unknown_model_is_6002(tmp_path):
    store = ModelStore(tmp_path, make_catalog())
    for call in (lambda: store.fetch("ghost"), lambda: store.status("ghost"),
                 lambda: store.delete("ghost")):
        err = error_of(call)
        assert err.code == Code.DownloadNotAvailable and "ghost" in str(err)


def test_file_source_and_missing_file(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(DATA)
    catalog = make_catalog(
        entry("vad", [file_item("m.bin", DATA, f"file://{src}")]),
        entry("gone", [file_item("m.bin", DATA, f"file://{tmp_path}/nope.bin")]))
    store = ModelStore(tmp_path / "models", catalog)
    assert store.fetch("vad").read_bytes() == DATA
    err = error_of(lambda: store.fetch("gone"))
    assert err.code == Code.DownloadNotAvailable and "nope.bin" in str(err)


def test_file_source_resumes_from_part(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(DATA)
    catalog = make_catalog(entry("vad", [file_item("m.bin", DATA, f"file://{src}")]))
    store = ModelStore(tmp_path / "models", catalog)
    part = store.root / "vad" / "m.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(DATA[:5000])
    seen = []
    store.fetch("vad", lambda done, total, f: seen.append(done))
    assert seen[0] == 5000 and seen[-1] == len(DATA)
    assert store.path("vad").read_bytes() == DATA


def test_disk_space_is_checked_before_anything_is_written(tmp_path, http_server, monkeypatch):
    store = http_store(tmp_path, http_server)
    real = shutil.disk_usage

    def tiny_disk(path):
        return real(path)._replace(free=len(DATA) - 1)

    monkeypatch.setattr(shutil, "disk_usage", tiny_disk)
    err = error_of(lambda: store.fetch("vad"))
    assert err.code == Code.InsufficientDiskSpace
    assert "vad: needs" in str(err) and str(store.root) in str(err)
    assert http_server.requests == []
    assert not (store.root / "vad").exists()


def test_disk_check_counts_resumable_bytes(tmp_path, http_server, monkeypatch):
    store = http_store(tmp_path, http_server)
    part = store.root / "vad" / "m.bin.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(DATA[:len(DATA) // 2])
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: real(p)._replace(free=len(DATA) - len(DATA) // 2))
    store.fetch("vad")
    assert store.status("vad") == ModelStatus.Downloaded


def test_same_model_is_never_fetched_twice_at_once(tmp_path, http_server):
    store = http_store(tmp_path, http_server)
    inside, release = threading.Event(), threading.Event()

    def slow_progress(done, total, current):
        inside.set()
        assert release.wait(10)

    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("path", store.fetch(
        "vad", slow_progress)))
    worker.start()
    try:
        assert inside.wait(10)
        assert store.status("vad") == ModelStatus.Downloading
        other = ModelStore(store.root, store.catalog)   # a second store, same directory
        err = error_of(lambda: other.fetch("vad"))
        assert err.code == Code.DownloadAlreadyActive
        assert "vad: already being fetched in this process" in str(err)
        err = error_of(lambda: other.delete("vad"))
        assert err.code == Code.DownloadAlreadyActive
    finally:
        release.set()
        worker.join(10)
    assert result["path"].read_bytes() == DATA
    assert store.status("vad") == ModelStatus.Downloaded


@pytest.mark.skipif(fcntl is None, reason="lock files need flock")
def test_lock_file_held_elsewhere_is_6004(tmp_path, http_server):
    store = http_store(tmp_path, http_server)
    lock = store.root / ".locks" / "vad.lock"
    lock.parent.mkdir(parents=True)
    # A separate open file description behaves like another process's lock.
    with open(lock, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert store.status("vad") == ModelStatus.Downloading
        err = error_of(lambda: store.fetch("vad"))
        assert err.code == Code.DownloadAlreadyActive and "another process" in str(err)
    assert store.status("vad") == ModelStatus.Absent
    store.fetch("vad")


def test_cancel_is_6005_and_keeps_the_part(tmp_path, http_server):
    store = http_store(tmp_path, http_server)
    cancel = threading.Event()
    err = error_of(lambda: store.fetch("vad", lambda *a: cancel.set(), cancel))
    assert err.code == Code.DownloadCancelled
    assert (store.root / "vad" / "m.bin.part").exists()
    assert store.status("vad") == ModelStatus.Incomplete
    store.fetch("vad")
    assert store.status("vad") == ModelStatus.Downloaded


def two_file_store(tmp_path, server) -> ModelStore:
    other = b"second file"
    server.files["/a.bin"] = ServedFile(DATA)
    server.files["/b.txt"] = ServedFile(other)
    catalog = make_catalog(
        entry("vad", [file_item("vad.onnx", other, server.url("/b.txt"))]),
        entry("stt", [file_item("a.bin", DATA, server.url("/a.bin")),
                      file_item("b.txt", other, server.url("/b.txt"))],
              role="stt", engine="faster-whisper", dependencies=["vad"]))
    return ModelStore(tmp_path / "models", catalog)


def test_dependencies_are_fetched_with_one_progress_total(tmp_path, http_server):
    store = two_file_store(tmp_path, http_server)
    seen = []
    assert store.fetch("stt", lambda *a: seen.append(a)) == store.root / "stt"
    assert seen[-1][0] == seen[-1][1] == len(DATA) + 2 * len(b"second file")
    assert [c[2] for c in seen][0] == "vad/vad.onnx"
    assert store.status("vad") == store.status("stt") == ModelStatus.Downloaded
    assert sorted(os.listdir(store.root / "stt")) == ["a.bin", "b.txt"]


def test_status_delete_and_record(tmp_path, http_server):
    store = two_file_store(tmp_path, http_server)
    store.fetch("stt")
    (store.root / "stt" / "b.txt").unlink()
    assert store.status("stt") == ModelStatus.Incomplete
    store.fetch("stt")
    assert store.status("stt") == ModelStatus.Downloaded
    assert store.delete("stt") is True
    assert store.status("stt") == ModelStatus.Absent
    assert store.status("vad") == ModelStatus.Downloaded     # dependencies stay
    record = json.loads((store.root / "downloads.json").read_text())
    assert list(record["models"]) == ["vad"]
    assert store.delete("stt") is False


def test_a_record_rewritten_by_another_store_is_seen(tmp_path, http_server):
    # two stores over one directory stand in for the server and `tryll-fast models`
    store = two_file_store(tmp_path, http_server)
    other = ModelStore(store.root, store.catalog)
    store.fetch("stt")
    assert store.status("stt") == ModelStatus.Downloaded      # parsed and cached
    assert other.delete("stt") is True
    assert store.status("stt") == ModelStatus.Absent
    assert store.status("vad") == ModelStatus.Downloaded


def test_files_without_a_record_are_rehashed_not_refetched(tmp_path, http_server):
    store = http_store(tmp_path, http_server)
    store.fetch("vad")
    (store.root / "downloads.json").unlink()
    assert store.status("vad") == ModelStatus.Incomplete
    http_server.requests.clear()
    store.fetch("vad")
    assert http_server.requests == []
    assert store.status("vad") == ModelStatus.Downloaded


def test_a_corrupt_file_without_record_is_replaced(tmp_path, http_server):
    store = http_store(tmp_path, http_server)
    store.fetch("vad")
    (store.root / "downloads.json").write_text("{not json")
    (store.root / "vad" / "m.bin").write_bytes(bytes(len(DATA)))    # right size, wrong bytes
    store.fetch("vad")
    assert (store.root / "vad" / "m.bin").read_bytes() == DATA


def test_catalog_update_makes_old_files_stale(tmp_path, http_server):
    store = http_store(tmp_path, http_server)
    store.fetch("vad")
    new = DATA[::-1]
    http_server.files["/m2.bin"] = ServedFile(new)
    newer = make_catalog(entry("vad", [file_item("m.bin", new, http_server.url("/m2.bin"))]))
    store2 = ModelStore(store.root, newer)
    assert store2.status("vad") == ModelStatus.Incomplete
    store2.fetch("vad")
    assert store2.path("vad").read_bytes() == new


def test_ensure_model_fetches_once_and_wraps_failures(tmp_path, http_server):
    store = http_store(tmp_path, http_server)
    path = ensure_model("vad", store.root, catalog=store.catalog)
    assert path.read_bytes() == DATA
    http_server.requests.clear()
    assert ensure_model("vad", store.root, catalog=store.catalog) == path
    assert http_server.requests == []
    with pytest.raises(DownloadError) as info:
        ensure_model("ghost", store.root, catalog=store.catalog)
    assert info.value.code == Code.ModelAutoDownloadFailed
    assert info.value.__cause__.code == Code.DownloadNotAvailable
    assert "ghost" in str(info.value) and "6002" in str(info.value)


def test_ensure_model_waits_for_another_fetch(tmp_path, http_server):
    store = http_store(tmp_path, http_server)
    inside, release = threading.Event(), threading.Event()

    def slow(done, total, current):
        inside.set()
        release.wait(10)

    worker = threading.Thread(target=lambda: store.fetch("vad", slow))
    worker.start()
    assert inside.wait(10)
    threading.Timer(0.3, release.set).start()
    path = ensure_model("vad", store.root, catalog=store.catalog, wait_s=10)
    worker.join(10)
    assert path.read_bytes() == DATA


def test_models_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("TRYLL_MODELS_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert resolve_models_dir(tmp_path / "arg") == tmp_path / "arg"
    assert resolve_models_dir() == tmp_path / "env"
    monkeypatch.delenv("TRYLL_MODELS_DIR")
    assert resolve_models_dir() == tmp_path / "xdg" / "tryll_fast" / "models"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_models_dir() == tmp_path / "home" / ".local/share/tryll_fast/models"
    assert ModelStore(catalog=make_catalog()).root == resolve_models_dir()


def test_error_carries_code_and_names(tmp_path):
    err = DownloadError(Code.DownloadFailed, "m/f: broke", model="m", file="f")
    assert err.code == 6001 and err.model == "m" and err.file == "f"
    assert str(err) == "m/f: broke (6001 DownloadFailed)" and err.message == "m/f: broke"


def test_statuses_show_this_process_at_once_and_others_within_their_age(tmp_path, http_server):
    store = two_file_store(tmp_path, http_server)
    assert store.statuses() == {"vad": ModelStatus.Absent, "stt": ModelStatus.Absent}
    store.fetch("stt")                  # this process: seen by the next call, however young
    assert store.statuses() == {"vad": ModelStatus.Downloaded, "stt": ModelStatus.Downloaded}
    # a change from outside (by hand, or another process): the snapshot stands until it ages
    (store.root / "stt" / "b.txt").unlink()
    assert store.statuses(max_age_s=3600)["stt"] == ModelStatus.Downloaded
    assert store.statuses(max_age_s=0)["stt"] == ModelStatus.Incomplete
    other = ModelStore(store.root, store.catalog)   # another store in this process
    assert other.delete("stt") is True
    assert store.statuses(max_age_s=3600)["stt"] == ModelStatus.Absent
    assert store.statuses(max_age_s=3600)["vad"] == ModelStatus.Downloaded


@pytest.mark.skipif(fcntl is None, reason="lock files need flock")
def test_statuses_see_another_process_fetching_once_aged(tmp_path, http_server):
    store = http_store(tmp_path, http_server)
    assert store.statuses()["vad"] == ModelStatus.Absent
    lock = store.root / ".locks" / "vad.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "a+b") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert store.statuses(max_age_s=3600)["vad"] == ModelStatus.Absent
        assert store.statuses(max_age_s=0)["vad"] == ModelStatus.Downloading
    assert store.statuses(max_age_s=0)["vad"] == ModelStatus.Absent
