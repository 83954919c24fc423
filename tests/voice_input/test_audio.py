"""The compiled audio path of a voice input: int16 PCM at any rate -> 16 kHz float32 in a
ring buffer. Checked against numbers (gain, frequency, aliasing), not against itself."""
import numpy as np
import pytest

from tryll_fast.voice_input._audio import OUT_RATE, AudioRing, Resampler


def tone(freq: float, rate: int, seconds: float, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def pcm(x: np.ndarray, channels: int = 1) -> bytes:
    s = np.clip(np.rint(x * 32767), -32768, 32767).astype("<i2")
    return np.repeat(s, channels).tobytes() if channels > 1 else s.tobytes()


def run(rate: int, x: np.ndarray, chunk_ms: int = 20, channels: int = 1,
        capacity: int = 1 << 20) -> np.ndarray:
    r = Resampler(rate, channels)
    ring = AudioRing(capacity)
    data = pcm(x, channels)
    step = rate * chunk_ms // 1000 * 2 * channels
    for i in range(0, len(data), step):
        r.feed(data[i:i + step], ring)
    return ring.read(ring.oldest, ring.written)


def amplitude_at(y: np.ndarray, freq: float, rate: int = OUT_RATE) -> float:
    y = y[len(y) // 4: -len(y) // 4]              # skip the edges
    t = np.arange(len(y)) / rate
    c = np.dot(y, np.cos(2 * np.pi * freq * t)) * 2 / len(y)
    s = np.dot(y, np.sin(2 * np.pi * freq * t)) * 2 / len(y)
    return float(np.hypot(c, s))


@pytest.mark.parametrize("rate", [8000, 11025, 16000, 22050, 24000, 32000, 44100, 48000,
                                  96000])
def test_a_tone_keeps_its_pitch_and_level(rate):
    y = run(rate, tone(440.0, rate, 1.0))
    assert abs(len(y) - OUT_RATE) <= 64               # one second in, one second out
    assert amplitude_at(y, 440.0) == pytest.approx(0.5, abs=0.01)


@pytest.mark.parametrize("rate", [44100, 48000])
def test_what_is_above_8_khz_does_not_fold_into_speech(rate):
    y = run(rate, tone(12000.0, rate, 1.0))           # would alias to 4 kHz
    assert amplitude_at(y, 16000 - 12000.0) < 0.5 * 10 ** (-40 / 20)   # < -40 dB
    assert float(np.abs(y[len(y) // 4: -len(y) // 4]).max()) < 0.01


def test_buffers_can_be_cut_anywhere():
    x = tone(300.0, 48000, 0.5) + tone(1700.0, 48000, 0.5, 0.2)
    whole = run(48000, x, chunk_ms=500)
    rng = np.random.default_rng(1)
    r = Resampler(48000)
    ring = AudioRing(1 << 20)
    data = pcm(x)
    i = 0
    while i < len(data):
        n = int(rng.integers(1, 900)) * 2
        r.feed(data[i:i + n], ring)
        i += n
    pieces = ring.read(0, ring.written)
    assert len(pieces) == len(whole)
    assert np.allclose(pieces, whole, atol=1e-6)


def test_channels_are_averaged_and_partial_frames_ignored():
    x = tone(440.0, 16000, 0.25)
    stereo = np.stack([x, -x], axis=1).reshape(-1)      # opposite phases cancel
    r = Resampler(16000, 2)
    ring = AudioRing(1 << 16)
    assert r.feed(pcm(stereo) + b"\x01\x02\x03", ring) == len(x)
    assert np.abs(ring.read(0, ring.written)).max() < 1e-4
    same = run(16000, x, channels=2)                     # both channels equal
    assert np.allclose(same, np.rint(x * 32767) / 32768, atol=1e-6)
    assert r.feed(b"", ring) == 0 and r.feed(b"\x00", ring) == 0


def test_the_ring_keeps_the_newest_samples_and_refuses_the_rest():
    ring = AudioRing(10)
    ring.append(np.arange(7, dtype=np.float32))
    ring.append(np.arange(7, 15, dtype=np.float32))
    assert ring.written == 15 and ring.oldest == 5
    assert ring.read(5, 15).tolist() == list(range(5, 15))
    assert ring.read(12, 12).tolist() == []
    for start, stop in ((4, 10), (10, 16), (9, 8)):
        with pytest.raises(ValueError, match="not in the ring"):
            ring.read(start, stop)
    ring.append(np.arange(100, 125, dtype=np.float32))  # more than it holds
    assert ring.written == 40 and ring.read(30, 40).tolist() == list(range(115, 125))


@pytest.mark.parametrize("rate,channels", [(7999, 1), (192001, 1), (16000, 0), (16000, 9)])
def test_formats_out_of_range_are_refused(rate, channels):
    with pytest.raises(ValueError):
        Resampler(rate, channels)


def test_full_scale_and_clipping_stay_in_range():
    x = np.array([-1.0, 1.0] * 4000, dtype=np.float32)  # a 24 kHz square at 48 kHz
    y = run(48000, x)
    assert np.abs(y).max() <= 1.01
