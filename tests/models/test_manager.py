"""ModelManager: load / pin / unload with reference counts, on the real SmolLM2."""
from __future__ import annotations

import threading
import time

import pytest

from tryll_fast.errors import ErrorCode, ModelError, ServerShuttingDown
from tryll_fast.models import ModelManager
from tryll_fast.models.manager import DEFAULT_LOADERS

SMOL = "SmolLM2-135M-Instruct"
# One thread each: llama.cpp's spinning threads crawl on a busy 2-core machine.
LLAMA = {"n_threads": 1, "n_threads_batch": 1}
OPTS = {"llama-cpp": LLAMA}


@pytest.fixture(scope="module")
def models_dir(model_file):
    return model_file(SMOL).parent.parent


@pytest.fixture
def manager(models_dir):
    mgr = ModelManager(models_dir=models_dir, engine_options=OPTS)
    yield mgr
    mgr.close(timeout=5)


def counting_loaders(counter: list):
    def load(entry, path, options):
        counter.append(entry.name)
        time.sleep(0.05)        # widen the window for racing threads
        return DEFAULT_LOADERS["llama-cpp"](entry, path, options)
    return {"llama-cpp": load}


def wait_until(cond, tries=1000):
    """Poll cond every 10 ms, a bounded number of times; its last value."""
    for _ in range(tries):
        if cond():
            return True
        time.sleep(0.01)
    return cond()


# ----- lifecycle -----

@pytest.mark.model
def test_load_pin_unload_lifecycle(manager):
    r = manager.load(SMOL)
    assert not r.already_loaded and r.pinned and r.engine == "llama-cpp" and r.role == "llm"
    assert r.load_ms > 0 and r.weights_bytes > 50_000_000
    assert r.ram_bytes > r.weights_bytes and r.loaded_dependencies == ()
    [info] = manager.loaded()
    assert (info.name, info.pinned, info.leases) == (SMOL, True, 0)

    again = manager.load(SMOL)
    assert again.already_loaded and again.load_ms == 0.0
    assert len(manager.loaded()) == 1

    with manager.lease(SMOL) as engine:
        assert engine.generate("Hello", max_tokens=4, temperature=0)

    u = manager.unload(SMOL)
    assert (u.was_loaded, u.was_pinned, u.freed, u.leases) == (True, True, True, 0)
    assert manager.loaded() == [] and engine.closed
    # unloading what is not loaded is not an error
    assert manager.unload(SMOL) == type(u)(SMOL, False, False, False, 0)


@pytest.mark.model
def test_lease_reference_counts(manager):
    a = manager.lease(SMOL)
    b = manager.lease(SMOL)
    assert a.obj is b.obj
    assert manager.loaded()[0].leases == 2 and not manager.loaded()[0].pinned
    a.release()
    a.release()                                   # idempotent
    assert manager.loaded()[0].leases == 1
    with pytest.raises(RuntimeError):
        a.obj
    engine = b.obj
    b.release()                                   # last holder, not pinned: freed
    assert manager.loaded() == [] and engine.closed
    # the next lease loads a fresh engine
    with manager.lease(SMOL) as fresh:
        assert fresh is not engine and not fresh.closed


@pytest.mark.model
def test_load_without_pin_is_freed_unless_held(manager):
    r = manager.load(SMOL, pin=False)
    assert not r.already_loaded and not r.pinned
    assert manager.loaded() == []
    with manager.lease(SMOL):
        r = manager.load(SMOL, pin=False)
        assert r.already_loaded and manager.loaded()[0].leases == 1
        assert not manager.loaded()[0].pinned


@pytest.mark.model
def test_unload_under_a_running_generation_is_deferred(manager):
    manager.load(SMOL)
    lease = manager.lease(SMOL)
    engine = lease.obj
    with engine.hold():                            # the generation cannot finish before
        handle = engine.submit("Once upon a time, a dragon", max_tokens=16, temperature=0)
        u = manager.unload(SMOL)                  # ... the unload arrives
        assert not handle.done
    assert (u.was_pinned, u.freed, u.leases) == (True, False, 1)
    info = manager.loaded()[0]
    assert (info.pinned, info.leases) == (False, 1)
    text = handle.result(60)                      # the generation completes
    assert len(handle.tokens) == 16 and handle.finish_reason == "length"
    assert text.strip() and not engine.closed
    # still usable under the lease after the unload
    assert engine.generate("Hi", max_tokens=4, temperature=0)
    lease.release()
    assert manager.loaded() == [] and engine.closed


@pytest.mark.model
def test_concurrent_leases_load_once(models_dir):
    loads: list = []
    mgr = ModelManager(models_dir=models_dir, engine_options=OPTS,
                       loaders=counting_loaders(loads))
    n = 8
    barrier = threading.Barrier(n)
    leases, errors = [None] * n, []

    def worker(i):
        try:
            barrier.wait()
            leases[i] = mgr.lease(SMOL)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors and loads == [SMOL]
    assert len({id(lease.obj) for lease in leases}) == 1
    assert mgr.loaded()[0].leases == n
    engine = leases[0].obj
    for lease in leases[:-1]:
        lease.release()
    assert not engine.closed
    leases[-1].release()
    assert engine.closed and mgr.loaded() == []
    mgr.close()


@pytest.mark.model
def test_concurrent_load_and_lease_with_unload_race(models_dir):
    """Pins, leases and unloads from many threads: counts end at zero, nothing freed early."""
    mgr = ModelManager(models_dir=models_dir, engine_options=OPTS)
    errors = []

    def worker(i):
        try:
            for _ in range(5):
                if i % 2:
                    mgr.load(SMOL)
                    mgr.unload(SMOL)
                else:
                    with mgr.lease(SMOL) as engine:
                        assert not engine.closed
                        engine.tokenize("hello")
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert mgr.loaded() == []
    mgr.close()


# ----- memory -----

@pytest.mark.model
@pytest.mark.model
def test_memory_reports_per_model(models_dir):
    mgr = ModelManager(models_dir=models_dir, engine_options={"llama-cpp": {"max_n_ctx": 1024,
                                                                            "n_slots": 2, **LLAMA}})
    assert mgr.memory() == {}
    r = mgr.load(SMOL)
    with mgr.lease(SMOL):
        mem = mgr.memory()
    m = mem[SMOL]
    assert (m["engine"], m["role"], m["pinned"], m["leases"]) == ("llama-cpp", "llm", True, 1)
    assert m["weights_bytes"] == r.weights_bytes == m["engine_memory"]["model"]["weights_bytes"]
    ctx = m["engine_memory"]["context"]
    assert ctx["n_ctx"] == 1024 and ctx["n_seq_max"] == 2 + 2   # capped by max_n_ctx
    assert m["ram_bytes"] == r.weights_bytes + ctx["kv_bytes_total"]
    assert mgr.memory()[SMOL]["leases"] == 0      # memory() took no lasting reference
    mgr.close()


@pytest.mark.model
def test_default_context_cap(manager):
    with manager.lease(SMOL) as engine:
        assert engine.n_ctx == 4096              # catalog says 8192, capped at 4096


# ----- errors -----
# Refusals that come before anything is read from disk run on an empty models directory:
# they need no model.

def test_unknown_model_is_6002(tmp_path):
    mgr = ModelManager(models_dir=tmp_path, engine_options=OPTS)
    for call in (mgr.load, mgr.lease, mgr.unload):
        with pytest.raises(ModelError) as ei:
            call("no-such-model")
        assert ei.value.code == ErrorCode.DownloadNotAvailable == 6002
        assert "not in the catalog" in str(ei.value) and ei.value.model == "no-such-model"


def test_engine_not_in_build_is_6008(tmp_path):
    # a build without faster-whisper
    mgr = ModelManager(models_dir=tmp_path, engine_options=OPTS,
                       loaders={k: v for k, v in DEFAULT_LOADERS.items()
                                if k != "faster-whisper"})
    with pytest.raises(ModelError) as ei:
        mgr.load("whisper-tiny.en")
    e = ei.value
    assert e.code == ErrorCode.EngineNotAvailable == 6008
    assert (e.model, e.role, e.engine) == ("whisper-tiny.en", "stt", "faster-whisper")
    for word in ("whisper-tiny.en", "stt", "faster-whisper"):
        assert word in e.message
    with pytest.raises(ModelError) as ei:
        mgr.lease("whisper-tiny.en")
    assert ei.value.code == 6008 and ei.value.engine == "faster-whisper"
    assert mgr.loaded() == []


def test_vad_on_its_own_is_6007(tmp_path):
    mgr = ModelManager(models_dir=tmp_path, engine_options=OPTS)
    with pytest.raises(ModelError) as ei:
        mgr.load("silero-vad")
    assert ei.value.code == ErrorCode.ModelResolutionFailed == 6007
    assert "dependency of its STT model" in ei.value.message


def test_model_not_on_disk_is_6007_and_never_downloads(tmp_path):
    mgr = ModelManager(models_dir=tmp_path)
    with pytest.raises(ModelError) as ei:
        mgr.load(SMOL)
    e = ei.value
    assert e.code == 6007 and "download it first" in e.message and "Absent" in e.message
    assert list(tmp_path.iterdir()) == []         # nothing fetched or created


@pytest.mark.model
def test_loader_failure_is_6007_and_retried(models_dir):
    calls = []

    def broken(entry, path, options):
        calls.append(1)
        raise RuntimeError("llama.cpp could not load it")

    mgr = ModelManager(models_dir=models_dir, loaders={"llama-cpp": broken})
    for _ in range(2):
        with pytest.raises(ModelError) as ei:
            mgr.lease(SMOL)
        assert ei.value.code == 6007 and isinstance(ei.value.__cause__, RuntimeError)
        assert mgr.loaded() == []
    assert len(calls) == 2


# ----- dependencies: the real Whisper tiny.en and the Silero VAD it depends on -----

@pytest.fixture(scope="module")
def speech_models_dir(model_file):
    """build/models with whisper-tiny.en and its dependency silero-vad on disk."""
    model_file("silero-vad")
    return model_file("whisper-tiny.en").parent


@pytest.mark.model
def test_vad_loads_and_frees_with_its_stt_model(speech_models_dir):
    mgr = ModelManager(models_dir=speech_models_dir, engine_options={"faster-whisper": {
        "n_threads": 1}})
    r = mgr.load("whisper-tiny.en")
    assert r.loaded_dependencies == ("silero-vad",) and r.engine == "faster-whisper"
    assert r.role == "stt" and r.pinned and not r.already_loaded
    by_name = {m.name: m for m in mgr.loaded()}
    assert set(by_name) == {"whisper-tiny.en", "silero-vad"}
    assert by_name["silero-vad"].dependents == 1 and not by_name["silero-vad"].pinned
    assert by_name["silero-vad"].leases == 0
    with mgr.lease("whisper-tiny.en") as stt:
        # the STT engine got the very VAD the manager loaded as its dependency
        vad = stt.vad
        assert type(vad).__name__ == "SileroVad" and vad.model_path.endswith("silero_vad.onnx")
        assert not stt.closed
    with pytest.raises(ModelError) as ei:
        mgr.load("silero-vad")                      # still refused on its own
    assert ei.value.code == ErrorCode.ModelResolutionFailed
    # a second load of the STT model shares the loaded VAD: no second dependent
    again = mgr.load("whisper-tiny.en")
    assert again.already_loaded and again.loaded_dependencies == ()
    assert {m.name: m for m in mgr.loaded()}["silero-vad"].dependents == 1
    u = mgr.unload("whisper-tiny.en")
    assert u.was_loaded and u.freed
    # the VAD went with the last model that depended on it
    assert mgr.loaded() == [] and stt.closed
    assert not mgr.is_loaded("silero-vad")
    mgr.close()


# ----- close -----

@pytest.mark.model
def test_close_frees_everything_and_refuses_new_work(models_dir):
    mgr = ModelManager(models_dir=models_dir, engine_options=OPTS)
    mgr.load(SMOL)
    engine = mgr.lease(SMOL)
    engine.release()
    mgr.close()
    assert mgr.loaded() == [] and mgr.closed
    for call in (mgr.load, mgr.lease):
        with pytest.raises(ServerShuttingDown) as ei:
            call(SMOL)
        assert ei.value.code == ErrorCode.ServerShuttingDown == 2001


@pytest.mark.model
def test_close_never_frees_under_a_lease(models_dir):
    mgr = ModelManager(models_dir=models_dir, engine_options=OPTS)
    mgr.load(SMOL)
    lease = mgr.lease(SMOL)
    # the deadline fires (the error names the lease) and the model stays loaded
    with pytest.raises(TimeoutError, match="1 lease"):
        mgr.close(timeout=0.2)
    engine = lease.obj
    assert not engine.closed and engine.generate("Hi", max_tokens=4, temperature=0)
    info = mgr.loaded()[0]
    assert (info.pinned, info.leases) == (False, 1)   # close() unpinned it
    lease.release()                                    # the last lease frees it
    assert engine.closed and mgr.loaded() == []
    mgr.close(timeout=0)                               # nothing left: returns at once


@pytest.mark.model
def test_close_waits_for_leases_to_end(models_dir):
    mgr = ModelManager(models_dir=models_dir, engine_options=OPTS)
    lease = mgr.lease(SMOL)
    engine = lease.obj
    events = []

    def release():
        # once close() has begun, a while later: it must still be waiting, engine open
        started = wait_until(lambda: mgr.closed)
        time.sleep(0.3)
        events.append(("release", started, engine.closed))
        lease.release()

    releaser = threading.Thread(target=release)
    releaser.start()
    mgr.close(timeout=60)
    events.append(("close returned", engine.closed))
    # close() returned only after the lease ended, and freed the engine then
    assert events == [("release", True, False), ("close returned", True)]
    assert mgr.loaded() == []
    releaser.join()
