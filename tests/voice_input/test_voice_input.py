"""Voice inputs over TCP with the real Whisper tiny.en and Silero VAD, fed speech made by the
project's own voice as AudioBuffer frames: the transcript frames in order, hands-free and
push-to-talk, cancel, max_utterance_ms, other rates and channels, silence, hotwords, every
error code, and bad input that must disturb nothing."""
from __future__ import annotations


import numpy as np
import pytest
from mic import STT, VOICE, begin, create, silence, speech, stream, updates_until_final
from wer import SPOKEN_LINES, edit_distance, words
from wire import Wire

from tryll_fast import codec
from tryll_fast.errors import ErrorCode

pytestmark = pytest.mark.model
Kind = codec.TranscriptUpdateKind


def transcripts(frames, vid: int) -> list:
    return [f for f in frames if isinstance(f, codec.WireTranscriptUpdate)
            and f.voice_input_id == vid]


# ---- creating ----

@pytest.mark.parametrize("kw, code", [
    ({"model_name": "no-such-model"}, ErrorCode.SttModelLoadFailed),
    ({"model_name": "SmolLM2-135M-Instruct"}, ErrorCode.SttModelLoadFailed),
    ({"model_name": VOICE}, ErrorCode.SttModelLoadFailed),
    ({"model_name": ""}, ErrorCode.SttModelLoadFailed),
    ({"hotwords_score": float("nan")}, ErrorCode.InvalidHotwordsScore),
    ({"hotwords_score": float("inf")}, ErrorCode.InvalidHotwordsScore),
    ({"hotwords_score": -0.5}, ErrorCode.InvalidHotwordsScore),
    ({"hotwords_storage_path": "../outside.txt"}, ErrorCode.StorageOutsideRoot),
    ({"hotwords_storage_path": "/etc/passwd"}, ErrorCode.StorageOutsideRoot),
    ({"hotwords_storage_path": "missing/words.txt"}, ErrorCode.StorageFileNotFound),
    ({"hotwords_storage_path": "words.json"}, ErrorCode.StorageKindMismatch),
    ({"vad_threshold": 1.5}, ErrorCode.InvalidParamValue),
    ({"vad_min_silence_ms": 50}, ErrorCode.InvalidParamValue),
])
def test_create_refusals(server, w, kw, code):
    from pathlib import Path
    (Path(server.config.storage_root) / "words.json").write_text("[]")
    kw.setdefault("model_name", STT)
    w.expect_error(codec.CreateVoiceInputRequest(
        request_id=w.rid(), input_format=codec.WireAudioFormat(
            sample_rate=16000, channels=1, bits_per_sample=16), **kw), code, timeout=120)


@pytest.mark.parametrize("fmt", [
    codec.WireAudioFormat(sample_rate=16000, channels=1, bits_per_sample=8),
    codec.WireAudioFormat(sample_rate=16000, channels=1, bits_per_sample=24),
    codec.WireAudioFormat(sample_rate=4000, channels=1, bits_per_sample=16),
    codec.WireAudioFormat(sample_rate=400000, channels=1, bits_per_sample=16),
    codec.WireAudioFormat(sample_rate=16000, channels=12, bits_per_sample=16),
])
def test_formats_the_server_cannot_take_are_4101(w, fmt):
    r = w.expect_error(codec.CreateVoiceInputRequest(request_id=w.rid(), model_name=STT,
                                                     input_format=fmt),
                       ErrorCode.AudioFormatUnsupported)
    assert "input_format" in r.message


def test_handle_states_get_the_voice_codes(server, w):
    vid = create(w)
    w.expect_error(codec.EndUtteranceRequest(request_id=w.rid(), voice_input_id=vid),
                   ErrorCode.NoActiveUtterance)
    w.expect_error(codec.CancelUtteranceRequest(request_id=w.rid(), voice_input_id=vid),
                   ErrorCode.NoActiveUtterance)
    begin(w, vid)
    w.expect_error(codec.BeginUtteranceRequest(request_id=w.rid(), voice_input_id=vid),
                   ErrorCode.UtteranceInProgress)
    w.expect_error(codec.BeginUtteranceRequest(request_id=w.rid(), voice_input_id=999_999),
                   ErrorCode.VoiceInputNotFound)
    ack = w.request(codec.CancelUtteranceRequest(request_id=w.rid(), voice_input_id=vid))
    assert isinstance(ack, codec.Ack)
    w.expect_error(codec.BeginUtteranceRequest(request_id=w.rid(), voice_input_id=vid,
                                               max_utterance_ms=10),
                   ErrorCode.InvalidParamValue)
    ack = w.request(codec.DestroyVoiceInputRequest(request_id=w.rid(), voice_input_id=vid))
    assert isinstance(ack, codec.Ack)
    for req in (codec.BeginUtteranceRequest(request_id=w.rid(), voice_input_id=vid),
                codec.DestroyVoiceInputRequest(request_id=w.rid(), voice_input_id=vid)):
        w.expect_error(req, ErrorCode.VoiceInputNotFound)
    # a handle of another session is not this session's
    other = Wire(server.address, timeout=60)
    other.create_session()
    theirs = create(other)
    w.expect_error(codec.BeginUtteranceRequest(request_id=w.rid(), voice_input_id=theirs),
                   ErrorCode.VoiceInputNotFound)
    other.close()


# ---- hearing ----

def test_hands_free_transcript_frames_in_order(w, speaker):
    vid = create(w)
    rid = begin(w, vid)
    text = "The blacksmith lives next to the old stone bridge by the river."
    stream(w, vid, np.concatenate([silence(1.3), speech(speaker, text)]))
    frames = transcripts(updates_until_final(w, vid), vid)
    kinds = [Kind(f.kind) for f in frames]
    # "not speaking" heartbeats while silent, then one phrase, then the utterance
    assert kinds[0] == Kind.SegmentFinal and frames[0].text == ""
    start = kinds.index(Kind.SpeechStart)
    assert all(k == Kind.SegmentFinal and f.text == "" for k, f in
               zip(kinds[:start], frames[:start]))
    assert kinds[start + 1:-2].count(Kind.Partial) == len(kinds[start + 1:-2]) >= 1
    assert kinds[-2:] == [Kind.SegmentFinal, Kind.UtteranceFinal]
    final = frames[-1].text
    assert frames[-2].text == final and final
    assert edit_distance(words(text), words(final)) <= 2, final
    consumed = [f.audio_ms_consumed for f in frames]
    assert consumed == sorted(consumed) and consumed[-1] >= 3000
    seg = frames[-2]
    assert 1000 <= seg.start_ms < seg.end_ms <= consumed[-1]
    # the handle is idle again: a new utterance begins
    assert begin(w, vid) != rid


def test_word_error_rate_at_real_time_pace(w, speaker):
    lines = SPOKEN_LINES[:10]
    vid = create(w)
    errors = total = 0
    heard = []
    for line in lines:
        begin(w, vid)
        stream(w, vid, speech(speaker, line))
        final = transcripts(updates_until_final(w, vid), vid)[-1].text
        errors += edit_distance(words(line), words(final))
        total += len(words(line))
        heard.append(final)
    wer = errors / total
    print(f"voice input word error rate {wer:.3f} ({errors}/{total})")
    assert wer <= 0.15, list(zip(lines, heard))


def test_push_to_talk_commits_segments_and_ends_on_release(w, speaker):
    vid = create(w, vad_min_silence_ms=500)
    begin(w, vid, auto_finish_on_silence=False)
    first, second = "Open the gate.", "Then bring the horses to the stable."
    stream(w, vid, np.concatenate([speech(speaker, first, tail_s=1.0),
                                   speech(speaker, second, tail_s=0.3)]), speed=2.0)
    rid = w.rid()
    w.send(codec.EndUtteranceRequest(request_id=rid, voice_input_id=vid))
    frames = updates_until_final(w, vid)
    assert any(isinstance(f, codec.Ack) and f.request_id == rid for f in frames)
    t = transcripts(frames, vid)
    finals = [f for f in t if f.kind == Kind.SegmentFinal and f.text]
    assert len(finals) == 2 and [f.segment_index for f in finals] == [0, 1]
    assert t[-1].kind == Kind.UtteranceFinal
    assert t[-1].text == " ".join(f.text for f in finals)
    heard = words(t[-1].text)
    assert "gate" in heard and "horses" in heard
    assert not [f for f in t if f.kind == Kind.SegmentFinal and not f.text]  # no heartbeats


def test_cancel_ends_the_utterance_with_no_transcript(w, speaker):
    vid = create(w)
    begin(w, vid)
    stream(w, vid, speech(speaker, "This sentence will never be finished by the server.",
                          tail_s=0.0)[:16000 * 2])
    ack = w.request(codec.CancelUtteranceRequest(request_id=w.rid(), voice_input_id=vid))
    assert isinstance(ack, codec.Ack)
    stream(w, vid, silence(1.5), speed=4.0)        # dropped: the handle is idle
    rest = []
    try:
        while True:
            rest.append(w.recv(1.5))
    except TimeoutError:
        pass
    assert not [f for f in rest if isinstance(f, codec.WireTranscriptUpdate)
                and f.kind in (Kind.SegmentFinal, Kind.UtteranceFinal) and f.text], rest
    begin(w, vid)                                   # and it is idle


def test_max_utterance_cuts_a_long_segment(w, speaker):
    vid = create(w)
    rid = begin(w, vid, max_utterance_ms=1500)
    stream(w, vid, speech(speaker, "This is a long sentence that keeps on going for much "
                                   "longer than the limit allows it to."), speed=2.0)
    frames = updates_until_final(w, vid)
    errors = [f for f in frames if isinstance(f, codec.ErrorResponse)]
    assert len(errors) == 1 and errors[0].code == ErrorCode.UtteranceTimeout
    assert errors[0].request_id == rid
    t = transcripts(frames, vid)
    cut = [f for f in t if f.kind == Kind.SegmentFinal and f.text]
    assert len(cut) == 1 and cut[0].end_ms - cut[0].start_ms <= 1500 + 300
    assert t[-1].kind == Kind.UtteranceFinal and t[-1].text == cut[0].text


@pytest.mark.parametrize("rate,channels", [(44100, 1), (48000, 2), (8000, 1)])
def test_other_rates_and_channels(w, speaker, rate, channels):
    vid = create(w, rate=rate, channels=channels)
    begin(w, vid)
    text = "The river is frozen, so the boats cannot leave the harbor."
    x = speech(speaker, text, rate=rate)
    stream(w, vid, x, rate=rate, channels=channels, speed=2.0)
    final = transcripts(updates_until_final(w, vid), vid)[-1].text
    assert edit_distance(words(text), words(final)) <= 3, final


def test_silence_only_gives_heartbeats_and_an_empty_utterance(w):
    vid = create(w)
    begin(w, vid)
    stream(w, vid, silence(3.5), speed=4.0)
    w.send(codec.EndUtteranceRequest(request_id=w.rid(), voice_input_id=vid))
    t = transcripts(updates_until_final(w, vid), vid)
    assert all(f.text == "" for f in t)
    assert Kind.SpeechStart not in [f.kind for f in t]
    assert [f.kind for f in t].count(Kind.SegmentFinal) >= 3       # one a second
    assert t[-1].kind == Kind.UtteranceFinal


def test_hotwords_help_a_made_up_name(server, w, speaker):
    from pathlib import Path
    root = Path(server.config.storage_root)
    (root / "names").mkdir(exist_ok=True)
    (root / "names" / "npcs.txt").write_text("# the people of Oakvale\n\nZorbalak\nQuellith\n")
    sentences = ["Go and ask Zorbalak about the map.", "Zorbalak lives by the mill.",
                 "Have you seen Zorbalak today?", "Tell Zorbalak the bread is ready.",
                 "Zorbalak owes me three silver coins.", "I think Zorbalak went north."]

    def hits(vid):
        n = 0
        for s in sentences:
            begin(w, vid)
            stream(w, vid, speech(speaker, s), speed=3.0)
            text = transcripts(updates_until_final(w, vid), vid)[-1].text
            n += "zorbalak" in text.lower().replace(" ", "")
        return n

    plain = hits(create(w))
    hinted = hits(create(w, hotwords_storage_path="names/npcs.txt", hotwords_score=2.0))
    assert hinted > plain, (plain, hinted)
    off = hits(create(w, hotwords_storage_path="names/npcs.txt", hotwords_score=1.0))
    assert off == plain                                  # 1.0 is "off"
    # a score without a list to bias towards changes nothing
    assert hits(create(w, hotwords_score=5.0)) == plain


def test_two_microphones_at_once(server, speaker):
    a_text = "The king has raised the taxes again this winter."
    b_text = "Do not trust the merchant with the green hat."
    wa, wb = Wire(server.address, timeout=60), Wire(server.address, timeout=60)
    wa.create_session()
    wb.create_session()
    va, vb = create(wa), create(wb)
    begin(wa, va)
    begin(wb, vb)
    xa, xb = speech(speaker, a_text), speech(speaker, b_text)
    n = max(len(xa), len(xb))
    xa = np.concatenate([xa, silence((n - len(xa)) / 16000)])
    xb = np.concatenate([xb, silence((n - len(xb)) / 16000)])
    frame = 320
    import time
    t0 = time.monotonic()
    for k, i in enumerate(range(0, n, frame)):           # interleaved, real time
        for wire, vid, x in ((wa, va, xa), (wb, vb, xb)):
            chunk = np.clip(np.rint(x[i:i + frame] * 32767), -32768, 32767).astype("<i2")
            wire.send(codec.AudioBuffer(voice_input_id=vid, pcm=chunk.tobytes()))
        delay = t0 + (k + 1) * 0.02 - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    fa = transcripts(updates_until_final(wa, va), va)[-1].text
    fb = transcripts(updates_until_final(wb, vb), vb)[-1].text
    assert edit_distance(words(a_text), words(fa)) <= 2, fa
    assert edit_distance(words(b_text), words(fb)) <= 2, fb
    wa.close()
    wb.close()


# ---- bad input ----

def test_bad_audio_is_dropped_and_disturbs_nothing(server, w, speaker):
    vid = create(w)
    gone = create(w)
    w.request(codec.DestroyVoiceInputRequest(request_id=w.rid(), voice_input_id=gone))
    dropped = server.audio_buffers_dropped
    begin(w, vid)
    text = "We close the doors when the bell rings at midnight."
    data = (np.clip(np.rint(speech(speaker, text) * 32767), -32768, 32767)
            .astype("<i2").tobytes())
    step = 640
    for k, i in enumerate(range(0, len(data), step)):
        piece = data[i:i + step]
        if k % 7 == 3:
            piece += b"\x7f"                            # an odd byte count
        w.send(codec.AudioBuffer(voice_input_id=vid, pcm=piece))
        if k % 11 == 5:
            w.send(codec.AudioBuffer(voice_input_id=vid, pcm=b""))         # empty
            w.send(codec.AudioBuffer(voice_input_id=gone, pcm=piece))      # destroyed
            w.send(codec.AudioBuffer(voice_input_id=123_456, pcm=piece))   # never existed
    frames = updates_until_final(w, vid)
    # AudioBuffer never gets a reply, whatever it carries
    assert not [f for f in frames if isinstance(f, codec.ErrorResponse)]
    final = transcripts(frames, vid)[-1].text
    assert edit_distance(words(text), words(final)) <= 3, final
    assert server.audio_buffers_dropped > dropped
    # the session still answers, and its other requests work
    assert isinstance(w.request(codec.SetSessionLocaleRequest(request_id=w.rid(),
                                                              locale="en")), codec.Ack)


def test_closing_the_connection_frees_the_voice_inputs(server, speaker):
    from wire import wait_for
    wire = Wire(server.address, timeout=60)
    wire.create_session()
    vid = create(wire)
    begin(wire, vid)
    stream(wire, vid, speech(speaker, "Goodbye, friend.", tail_s=0.0), speed=4.0)
    sessions = [s for s in server.connections if vid in s.voice_inputs]
    assert len(sessions) == 1
    session = sessions[0]
    handle = session.voice_inputs[vid]
    assert not handle.lease.released
    wire.reset()
    assert wait_for(lambda: session.closed and not session.voice_inputs, 10)
    assert wait_for(lambda: handle.lease.released, 10)         # its model lease went back
    assert handle.destroyed and handle.state == "idle"
    assert session.owned()["voice_inputs"] == 0


def test_chat_listen_says_a_wav_to_the_npc(server, speaker, model_file, tmp_path):
    import subprocess
    import sys
    import wave
    model_file("SmolLM2-135M-Instruct")
    x = speech(speaker, "Hello baker, what bread do you have today?", rate=44100)
    path = tmp_path / "line.wav"
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(44100)
        f.writeframes(np.clip(np.rint(x * 32767), -32768, 32767).astype("<i2").tobytes())
    host, port = server.address
    proc = subprocess.run(
        [sys.executable, "-m", "tryll_fast.cli", "chat", "--host", host, "--port", str(port),
         "--model", "SmolLM2-135M-Instruct", "--max-tokens", "12", "--listen", str(path)],
        input="", capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    final = next(line for line in out.splitlines() if line.startswith("[UtteranceFinal]"))
    assert "bread" in final.lower(), out
    assert "[SpeechStart]" in out and out.index("[SpeechStart]") < out.index(final)
    you = next(line for line in out.splitlines() if line.startswith("you> "))
    assert you[5:] == final[len("[UtteranceFinal] "):]
    assert [line for line in out.splitlines() if "npc> " in line and line.split("npc> ")[1]]


def test_voice_inputs_per_session_are_capped(model_file, tmp_path):
    from wire import MODELS_DIR, start_server
    model_file(STT)
    srv = start_server(tmp_path, models_dir=MODELS_DIR,
                       overrides=["session.max_voice_inputs=2"])
    try:
        with Wire(srv.address, timeout=60) as w:
            w.create_session()
            first = create(w)
            create(w)
            reply = w.expect_error(codec.CreateVoiceInputRequest(
                request_id=w.rid(), model_name=STT), ErrorCode.SessionLimitReached, 60)
            assert "session.max_voice_inputs allows (2)" in reply.message
            assert isinstance(w.request(codec.DestroyVoiceInputRequest(
                request_id=w.rid(), voice_input_id=first)), codec.Ack)
            create(w)                                   # room again
    finally:
        srv.shutdown(10)
