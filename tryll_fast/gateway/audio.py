"""Raw audio in a binary element: what its content type says the bytes are, and µ-law
decoding (docs/pipeline.md, "Audio in").

The voice input takes signed 16-bit little-endian PCM at 8-192 kHz and resamples it to
16 kHz itself, so all this module does is name the rate and channel count, and turn
`audio/basic` (G.711 µ-law, 8 kHz mono, RFC 2046) into that PCM. Compressed audio (WAV
files, Opus, MP3) is refused: a game or a page has its PCM before it encodes it.
"""
from __future__ import annotations

import numpy as np

from tryll_fast.gateway.elements import ElementError
from tryll_fast.gateway.params import MAX_AUDIO_RATE, MIN_AUDIO_RATE

RAW_TYPES = ("audio/raw", "audio/pcm")     # int16 LE; `;rate=` and `;channels=` optional
MULAW_TYPE = "audio/basic"
MULAW_RATE = 8000
MAX_CHANNELS = 8


def _mulaw_table() -> np.ndarray:
    """The 256 linear values of G.711 µ-law: bits inverted, then sign, a 3-bit exponent
    and a 4-bit mantissa over a bias of 132."""
    code = np.arange(256, dtype=np.int32) ^ 0xFF
    exponent = (code >> 4) & 0x07
    mantissa = code & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(code & 0x80, -magnitude, magnitude).astype("<i2")


_MULAW = _mulaw_table()


def mulaw_to_pcm16(data: bytes) -> bytes:
    return _MULAW[np.frombuffer(data, dtype=np.uint8)].tobytes()


def audio_format(content_type: str, default_rate: int) -> tuple[str, int, int]:
    """`audio/raw;rate=48000;channels=2` -> ("raw", 48000, 2); `audio/basic` -> ("mulaw",
    8000, 1). A raw type with no rate has the connection's `audioSampleRate`. ElementError
    (UnsupportedInput) names what is wrong."""
    kind, _, rest = content_type.partition(";")
    kind = kind.strip().lower()
    params: dict[str, str] = {}
    for part in rest.split(";"):
        if part.strip():
            key, _, value = part.partition("=")
            params[key.strip().lower()] = value.strip()
    if kind == MULAW_TYPE:
        return "mulaw", MULAW_RATE, 1
    if kind not in RAW_TYPES:
        raise ElementError("UnsupportedInput", f"binary {content_type}: audio is taken as raw "
                           "PCM (audio/raw or audio/pcm: signed 16-bit little-endian, "
                           "`;rate=` and `;channels=` optional) or audio/basic (µ-law, 8 kHz); "
                           "compressed audio is not decoded")
    rate = _int_param(params, "rate", default_rate, MIN_AUDIO_RATE, MAX_AUDIO_RATE,
                      content_type)
    channels = _int_param(params, "channels", 1, 1, MAX_CHANNELS, content_type)
    return "raw", rate, channels


def _int_param(params: dict[str, str], key: str, default: int, low: int, high: int,
               content_type: str) -> int:
    raw = params.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise ElementError("UnsupportedInput", f"binary {content_type}: {key}={raw!r} is "
                                               f"outside {low}..{high}")
    return value
