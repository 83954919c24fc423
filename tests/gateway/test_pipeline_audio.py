"""Raw audio into the pipeline: the `listen` table, audio formats (raw PCM at any rate and
channel count, µ-law), server-side transcripts as transcript elements and turns in each
commit mode, barge-in, and the errors for audio that cannot be heard. The model tests speak
to the agents with the project's own voice and are heard by the real Whisper and VAD."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tryll_fast.gateway import elements as el
from tryll_fast.gateway.audio import audio_format, mulaw_to_pcm16
from tryll_fast.gateway.elements import Element
from tryll_fast.server.config import ConfigError

from pipeclients import SMOL, VOICE, Pipe, agent_of, is_command, start_gateway, write_config
from wire import MODELS_DIR, start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "voice_input"))
from mic import STT, resample, silence, speech, to_pcm  # noqa: E402

HEARS = f"""
[agents.echo]                       # hears; answers with a line (no language model)
listen = {{ model_name = "{STT}", vad_min_silence_ms = 500 }}
[agents.echo.nodes.line]
type = "CannedResponse"
lines = [{{ text = "Heard you." }}]

[agents.deaf]
[agents.deaf.nodes.line]
type = "CannedResponse"
lines = [{{ text = "Eh?" }}]

[agents.teller]                     # hears and speaks at length: for barge-in
default_model = "{SMOL}"
voice = {{ model_name = "{VOICE}" }}
listen = {{ model_name = "{STT}", vad_min_silence_ms = 500 }}
[agents.teller.nodes.reply]
type = "GenerateAndSpeak"
system_prompt = "You tell long stories about the sea."
sampling = {{ max_tokens = 200, temperature = 0.0, ignore_eos = true }}
min_sentence_chars = 12
"""


def user_texts(server, gateway, session_id) -> list[str]:
    agent = agent_of(server, gateway, session_id)
    return [i.user_text for i in agent.dialog.interactions]


def frames(x: np.ndarray, rate: int, channels: int = 1, ms: int = 20) -> list[bytes]:
    data = to_pcm(x, channels)
    step = rate * ms // 1000 * 2 * channels
    return [data[i:i + step] for i in range(0, len(data), step)]


# ---- no models ----

def test_mulaw_decodes_as_the_standard_library_does():
    audioop = pytest.importorskip("audioop")   # the reference, while Python still has it
    codes = bytes(range(256))
    assert mulaw_to_pcm16(codes) == audioop.ulaw2lin(codes, 2)


def test_audio_content_types():
    assert audio_format("audio/raw", 16000) == ("raw", 16000, 1)
    assert audio_format("audio/raw;rate=48000;channels=2", 16000) == ("raw", 48000, 2)
    assert audio_format("Audio/PCM; rate=22050", 44100) == ("raw", 22050, 1)
    assert audio_format("audio/basic", 48000) == ("mulaw", 8000, 1)
    for bad, words in (("audio/ogg", "compressed"), ("audio/raw;rate=4000", "rate='4000'"),
                       ("audio/raw;channels=9", "channels='9'"),
                       ("audio/raw;rate=fast", "rate='fast'")):
        with pytest.raises(el.ElementError, match=words) as info:
            audio_format(bad, 16000)
        assert info.value.kind == "UnsupportedInput"


def test_listen_table_is_checked_when_the_config_is_read(tmp_path):
    base = "[agents.a.nodes.n]\ntype = \"CannedResponse\"\n[agents.a.listen]\n"
    for body, key, words in (
            ("vad_threshold = 0.4\n", "agents.a.listen.model_name", "speech-to-text model"),
            (f'model_name = "{STT}"\nmax_utterance_ms = 50\n',
             "agents.a.listen.max_utterance_ms", "1000..600000"),
            (f'model_name = "{STT}"\nrate = 8000\n', "agents.a.listen.rate", "unknown key"),
            (f'model_name = "{STT}"\nvad_threshold = "high"\n',
             "agents.a.listen.vad_threshold", "expected")):
        with pytest.raises(ConfigError) as info:
            write_config(tmp_path, "bad.toml", base + body)
        assert key in str(info.value) and words in str(info.value), str(info.value)
    cfg = write_config(tmp_path, "ok.toml", base + f'model_name = "{STT}"\n'
                                                   "vad_min_silence_ms = 600\n")
    listen = cfg.agents["a"].listen
    req = listen.create_request(7, 48000, 2)
    assert (req.request_id, req.model_name, req.vad_min_silence_ms) == (7, STT, 600)
    assert (req.input_format.sample_rate, req.input_format.channels,
            req.input_format.bits_per_sample) == (48000, 2, 16)
    assert listen.max_utterance_ms == 60000


@pytest.fixture(scope="module")
def deaf_server(tmp_path_factory):
    """No models on disk: the `echo` agent's Whisper cannot load."""
    tmp = tmp_path_factory.mktemp("pipe-audio-light")
    server = start_server(tmp)
    gateway = start_gateway(server, write_config(tmp, "hears.toml", HEARS))
    yield server, gateway
    server.shutdown(5)


@pytest.mark.parametrize("query, words", [
    ("audioSampleRate=7999", "audioSampleRate='7999'"),
    ("audioSampleRate=loud", "audioSampleRate='loud'"),
    ("bargeIn=maybe", "bargeIn='maybe'"),
])
def test_bad_audio_parameters_close_the_connection(deaf_server, query, words):
    _, gateway = deaf_server
    with Pipe(gateway, f"agent=echo&outputFormat=JSON&{query}") as p:
        error = p.recv()
        assert error.type == "error" and words in error.fields["message"]
        assert error.fields["type"] == "InvalidConnectionParameter"


def test_audio_to_an_agent_that_does_not_listen_is_refused_once(deaf_server):
    _, gateway = deaf_server
    with Pipe(gateway, "agent=deaf&outputFormat=JSON") as p:
        p.ready()
        for _ in range(5):
            p.send(b"\x00\x01" * 160)                  # raw audio: binary frames
        p.say("hello")
        got = p.turn()
    errors = [e for e in got if e.type == "error"]
    assert len(errors) == 1, errors
    assert "deaf does not listen" in errors[0].fields["message"]
    assert errors[0].fields["isRecoverable"] is True
    assert got[-1].fields["parameters"]["status"] == "Success"


def test_a_listen_model_that_cannot_load_is_one_error_and_text_still_works(deaf_server):
    _, gateway = deaf_server
    with Pipe(gateway, "agent=echo&outputFormat=JSON&commitMode=manual") as p:
        p.ready()
        for _ in range(5):
            p.send(b"\x00\x01" * 160)
        p.send(Element("token", {"text": "typed"}))
        p.send(Element("commit", {}))                  # waits for the voice input, then runs
        got = p.turn()
        for _ in range(3):
            p.send(b"\x00\x01" * 160)                  # dropped without another error
        p.say("again")
        got += p.turn()
    errors = [e for e in got if e.type == "error"]
    assert len(errors) == 1, errors
    assert errors[0].fields["source"] == "SpeechRecognition"
    assert errors[0].fields["type"] == "SttModelLoadFailed"
    assert "echo cannot listen" in errors[0].fields["message"]
    assert [e.fields["parameters"]["status"] for e in got if is_command(e, "turnComplete")] \
        == ["Success", "Success"]


def test_unsupported_audio_types_get_an_error(deaf_server):
    _, gateway = deaf_server
    with Pipe(gateway, "agent=echo&inputFormat=JSON&outputFormat=JSON") as p:
        p.ready()
        p.send(Element("binary", {"bytes": b"OggS....", "contentType": "audio/ogg"}))
        error = p.until(lambda e: e.type == "error")[-1]
        assert "compressed audio" in error.fields["message"]
        p.send(Element("binary", {"bytes": b"\x00" * 8, "contentType": "video/mp4"}))
        error = p.until(lambda e: e.type == "error")[-1]
        assert "video/mp4" in error.fields["message"]


# ---- the real Whisper, VAD and voice ----

@pytest.fixture(scope="module")
def hearing(model_file, tmp_path_factory):
    for name in (SMOL, VOICE, STT):
        model_file(name)
    tmp = tmp_path_factory.mktemp("pipe-audio")
    server = start_server(tmp, models_dir=MODELS_DIR, overrides=["llama.n_slots=4"])
    gateway = start_gateway(server, write_config(tmp, "hears.toml", HEARS))
    yield server, gateway
    server.shutdown(10)


@pytest.fixture(scope="module")
def speaker(model_file):
    from tryll_fast.engines.speech.piper import PiperVoice
    voice = PiperVoice(Path(model_file(VOICE)), n_threads=1)
    yield voice
    voice.close()


QUESTION = "Do you have a room for the night?"


def heard(text: str) -> bool:
    return "room" in text.lower() and "night" in text.lower()


@pytest.mark.model
@pytest.mark.parametrize("fmt", ["TEXT", "JSON", "MSGPACK"])
def test_spoken_phrase_becomes_a_transcript_and_a_turn(hearing, speaker, fmt):
    """Hands-free (commitMode auto): the VAD closes the phrase, its transcript comes back
    as a final transcript element, and the phrase is the player's message of a turn."""
    server, gateway = hearing
    with Pipe(gateway, f"agent=echo&outputFormat={fmt}", timeout=120) as p:
        sid = p.ready().fields.get("sessionId")           # None in TEXT: #ready has no id
        if sid is None:
            sid = str(next(iter(c.session.id for c in gateway.connections
                                if c.params.agent.name == "echo")))
        for chunk in frames(speech(speaker, QUESTION), 16000):   # as fast as it goes
            p.send(chunk)
        got = p.turn(120)
        [said] = user_texts(server, gateway, sid or got[-1].fields["sessionId"])
    assert heard(said) and said.rstrip()[-1] in ".?!"
    finals = [e for e in got if e.type == "transcript" and not e.fields.get("isInterim")]
    assert len(finals) == 1 and heard(finals[0].fields["text"]), finals
    if fmt != "TEXT":
        assert finals[0].fields["provider"] == STT
        assert [e.fields["text"] for e in got if e.type == "token"] == ["Heard you."]
        assert got.index(finals[0]) < next(i for i, e in enumerate(got) if e.type == "token")


@pytest.mark.model
def test_push_to_talk_waits_for_the_commit(hearing, speaker):
    """commitMode manual: phrases accumulate while the button is held (two here, with a
    pause the VAD closes between them); the commit ends the utterance and its turn has
    both phrases."""
    server, gateway = hearing
    audio = np.concatenate([speech(speaker, "Good evening."), speech(speaker, QUESTION,
                                                                     tail_s=0.3)])
    with Pipe(gateway, "agent=echo&inputFormat=JSON&outputFormat=JSON&commitMode=manual",
              timeout=120) as p:
        p.ready()
        for chunk in frames(audio, 16000):
            p.send(chunk)
        p.until(lambda e: e.type == "transcript" and not e.fields["isInterim"], 120)
        p.send(Element("commit", {}))
        got = p.turn(120)
        [said] = user_texts(server, gateway, got[-1].fields["sessionId"])
    assert "evening" in said.lower() and heard(said), said


@pytest.mark.model
def test_other_rates_channels_and_mulaw_are_heard(hearing, speaker):
    _, gateway = hearing
    x = speech(speaker, QUESTION)
    stereo = resample(x, 16000, 48000)
    with Pipe(gateway, "agent=echo&inputFormat=MSGPACK&outputFormat=JSON", timeout=120) as p:
        p.ready()
        for chunk in frames(stereo, 48000, channels=2):
            p.send(Element("binary", {"bytes": chunk,
                                      "contentType": "audio/raw;rate=48000;channels=2"}))
        got = p.turn(120)
        assert heard(" ".join(e.fields["text"] for e in got if e.type == "transcript"))
        # the first audio set this connection's format: another one is refused
        p.send(Element("binary", {"bytes": b"\x00" * 640, "contentType": "audio/raw"}))
        error = p.until(lambda e: e.type == "error")[-1]
        assert "48000 Hz, 2 channel(s)" in error.fields["message"]

    import audioop  # noqa: PLC0415  (the µ-law encoder: the client's side of audio/basic)
    mulaw = audioop.lin2ulaw(to_pcm(resample(x, 16000, 8000)), 2)
    with Pipe(gateway, "agent=echo&inputFormat=JSON&outputFormat=JSON", timeout=120) as p:
        p.ready()
        for i in range(0, len(mulaw), 160):
            p.send(Element("binary", {"bytes": mulaw[i:i + 160], "contentType": "audio/basic"}))
        got = p.turn(120)
        assert heard(" ".join(e.fields["text"] for e in got if e.type == "transcript"))


@pytest.mark.model
def test_interim_transcripts_and_the_version_1_command(hearing, speaker):
    """At real-time pace the player's words come back while they speak: interim transcript
    elements, and in protocol version 1 the transcript command beside each."""
    _, gateway = hearing
    audio = speech(speaker, "I have travelled a very long way from the northern "
                            "mountains, and I am tired and hungry.")
    with Pipe(gateway, "agent=echo&outputFormat=JSON&protocolVersion=1", timeout=120) as p:
        p.ready()
        import time
        t0 = time.monotonic()
        for k, chunk in enumerate(frames(audio, 16000)):
            p.send(chunk)
            delay = t0 + (k + 1) * 0.02 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        got = p.turn(120)
    interim = [e for e in got if e.type == "transcript" and e.fields["isInterim"]]
    commands = [e for e in got if is_command(e, "transcript")]
    assert interim and len(commands) == len(interim)
    assert [c.fields["parameters"]["text"] for c in commands] == \
        [e.fields["text"] for e in interim]
    final = next(i for i, e in enumerate(got) if e.type == "transcript"
                 and not e.fields["isInterim"])
    assert got.index(interim[0]) < final


@pytest.mark.model
def test_speaking_over_the_agent_barges_in(hearing, speaker):
    """The teller speaks at length; the player speaks over it: `bargeIn` names the turn,
    no more of its audio follows, it completes Cancelled, and the player's phrase is the
    next turn."""
    server, gateway = hearing
    with Pipe(gateway, "agent=teller&outputFormat=MSGPACK", timeout=180) as p:
        p.ready()
        p.say("Tell me a story.")
        first = p.until(lambda e: e.type == "speech-item", 180)
        story = first[-1].fields["turnId"]
        for chunk in frames(np.concatenate([silence(0.2), speech(speaker, QUESTION)]), 16000):
            p.send(chunk)
        got = p.until(lambda e: is_command(e, "bargeIn"), 120)
        assert got[-1].fields["turnId"] == story
        assert got[-1].fields["parameters"] == {"turnId": story}
        rest = p.until(lambda e: is_command(e, "turnComplete")
                       and e.fields["turnId"] == story, 120)
        assert not [e for e in rest if e.type in ("speech-item", "speech")]
        assert rest[-1].fields["parameters"]["status"] == "Cancelled"
        nxt = p.turn(180)
        finals = [e for e in rest + nxt if e.type == "transcript"
                  and not e.fields["isInterim"]]
        assert heard(finals[0].fields["text"])
        assert nxt[-1].fields["turnId"] != story
        said = user_texts(server, gateway, nxt[-1].fields["sessionId"])
    assert said[0] == "Tell me a story." and heard(said[1])


@pytest.mark.model
def test_barge_in_off_lets_the_agent_finish(hearing, speaker):
    _, gateway = hearing
    with Pipe(gateway, "agent=teller&outputFormat=MSGPACK&bargeIn=false", timeout=180) as p:
        p.ready()
        p.say("Tell me a story.")
        p.until(lambda e: e.type == "speech-item", 180)
        for chunk in frames(speech(speaker, QUESTION), 16000):
            p.send(chunk)
        got = p.turn(300)
    assert not [e for e in got if is_command(e, "bargeIn")]
    assert got[-1].fields["parameters"]["status"] == "Success"
