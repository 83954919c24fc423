"""Frame splitting (FrameSplitter) and whole-frame decoding (decode_frame).

Wire format: u32 little-endian payload length (1 .. 1 048 576), then the
payload. A length of 0 or above 1 MiB is fatal (FramingError, and the
splitter stays failed: the connection must close)."""
from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tryll_fast import codec  # noqa: E402
from fuzz import corpus  # noqa: E402

MAX = codec.MAX_FRAME
SEEDS = corpus.seeds()


def frame(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + payload


def feed_all(splitter, chunks):
    out = []
    for c in chunks:
        got = splitter.feed(c)
        assert type(got) is list
        out += got
    return out


@pytest.fixture(scope="module")
def max_payload():
    """A real Message payload of exactly MAX_FRAME bytes (AnswerText text
    sized so the encoder lands on the limit; no 8-byte field, so the payload
    size moves in steps of 4)."""
    overhead = len(codec.encode(codec.AnswerText(node_name="n", text="x" * 1000))) - 4 - 1000
    for n in range(MAX - overhead - 16, MAX - overhead + 16):
        try:
            f = codec.encode(codec.AnswerText(node_name="n", text="x" * n))
        except codec.FrameTooLarge:
            continue
        if len(f) - 4 == MAX:
            return f[4:]
    pytest.fail("could not build an exactly-1-MiB payload")


def test_max_frame_constant():
    assert MAX == 1048576


# ---------------------------------------------------------------------------
# FrameSplitter

def test_one_frame_in_one_chunk():
    s = codec.FrameSplitter()
    assert s.pending == 0
    assert s.feed(frame(SEEDS[0])) == [SEEDS[0]]
    assert s.pending == 0
    assert s.feed(b"") == []


def test_split_at_every_byte_boundary():
    payloads = SEEDS[:4]
    stream = b"".join(frame(p) for p in payloads)
    for i in range(len(stream) + 1):
        s = codec.FrameSplitter()
        got = feed_all(s, [stream[:i], stream[i:]])
        assert got == payloads, i
        assert s.pending == 0


def test_split_at_every_pair_of_boundaries():
    named = dict(corpus.named_seeds())
    payloads = [named["AnswerText_final"], named["ConnectionReady"], named["ErrorResponse"]]
    stream = b"".join(frame(p) for p in payloads)
    n = len(stream)
    assert n < 300  # keeps the O(n^2) loop small
    for i in range(n + 1):
        for j in range(i, n + 1):
            s = codec.FrameSplitter()
            assert feed_all(s, [stream[:i], stream[i:j], stream[j:]]) == payloads, (i, j)


def test_many_frames_in_one_chunk():
    payloads = [SEEDS[i % len(SEEDS)] for i in range(2000)] + [b"\x01", b"\x02" * 3]
    s = codec.FrameSplitter()
    got = s.feed(b"".join(frame(p) for p in payloads))
    assert got == payloads
    assert s.pending == 0


def test_pending_counts_buffered_bytes():
    a, b = frame(SEEDS[0]), frame(SEEDS[2])
    s = codec.FrameSplitter()
    assert s.feed(a[:2]) == [] and s.pending == 2              # part of the prefix
    assert s.feed(a[2:4]) == [] and s.pending == 4             # the whole prefix
    assert s.feed(a[4:-1]) == [] and s.pending == len(a) - 1
    assert s.feed(a[-1:] + b[:7]) == [SEEDS[0]] and s.pending == 7
    assert s.feed(b[7:] + b[:3]) == [SEEDS[2]] and s.pending == 3
    assert s.feed(b[3:]) == [SEEDS[2]] and s.pending == 0


def test_one_byte_at_a_time_max_frame(max_payload):
    data = frame(max_payload)
    s = codec.FrameSplitter()
    feed = s.feed
    view = memoryview(data)
    for i in range(len(data) - 1):
        if feed(view[i:i + 1]):
            pytest.fail(f"a payload came out after {i + 1} of {len(data)} bytes")
    assert s.pending == len(data) - 1
    out = feed(view[-1:])
    assert out == [max_payload]
    assert s.pending == 0
    assert codec.decode(out[0]).body.node_name == "n"


def test_exactly_max_payload_is_accepted(max_payload):
    assert len(max_payload) == MAX
    s = codec.FrameSplitter()
    assert s.feed(frame(max_payload) + frame(SEEDS[0])) == [max_payload, SEEDS[0]]
    # arbitrary (non-Message) content: the splitter does not decode
    junk = bytes(range(256)) * (MAX // 256)
    assert s.feed(frame(junk)) == [junk]
    assert codec.decode_frame(frame(max_payload)).body_type == codec.MessageBody.AnswerText


@pytest.mark.parametrize("length", [0, MAX + 1, MAX + 4096, 0x7FFFFFFF, 0xFFFFFFFF])
def test_bad_length_is_fatal(length):
    s = codec.FrameSplitter()
    with pytest.raises(codec.FramingError) as ei:
        s.feed(struct.pack("<I", length))          # raised as soon as the prefix is known
    assert isinstance(ei.value, codec.CodecError)
    # the splitter stays failed: every later feed raises, even of valid data
    for later in (b"", frame(SEEDS[0]), b"\x00"):
        with pytest.raises(codec.FramingError):
            s.feed(later)


@pytest.mark.parametrize("length", [0, MAX + 1])
def test_bad_length_after_good_frames_and_split_prefix(length):
    s = codec.FrameSplitter()
    bad = struct.pack("<I", length)
    assert s.feed(frame(SEEDS[0]) + bad[:3]) == [SEEDS[0]]
    assert s.pending == 3
    with pytest.raises(codec.FramingError):
        s.feed(bad[3:] + b"\0" * 8)
    with pytest.raises(codec.FramingError):
        s.feed(frame(SEEDS[1]))


def test_payloads_are_independent_bytes():
    src = bytearray(frame(SEEDS[0]) + frame(SEEDS[3]) + frame(SEEDS[5])[:10])
    s = codec.FrameSplitter()
    out = s.feed(src)
    assert [type(p) for p in out] == [bytes, bytes]
    snapshot = [bytes(p) for p in out]
    src[:] = b"\xee" * len(src)                 # caller reuses its receive buffer
    assert out == snapshot
    later = s.feed(frame(SEEDS[5])[10:] + frame(SEEDS[6]) * 50)   # internal buffer compacts
    assert later == [SEEDS[5]] + [SEEDS[6]] * 50
    assert out == snapshot
    # payloads decode independently of the splitter
    assert codec.decode(out[1]).to_dict() == codec.decode(SEEDS[3]).to_dict()


def test_feed_accepts_bytes_like_chunks():
    f = frame(SEEDS[4])
    s = codec.FrameSplitter()
    assert feed_all(s, [bytearray(f[:5]), memoryview(f)[5:50], f[50:]]) == [SEEDS[4]]


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(payloads=st.lists(st.one_of(st.binary(min_size=1, max_size=300),
                                   st.sampled_from(SEEDS)), max_size=25),
       cuts=st.lists(st.integers(min_value=0, max_value=20000), max_size=30))
def test_random_frames_random_chunks(payloads, cuts):
    stream = b"".join(frame(p) for p in payloads)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in zip(points, points[1:])]
    s = codec.FrameSplitter()
    assert feed_all(s, chunks) == payloads
    assert s.pending == 0


# ---------------------------------------------------------------------------
# decode_frame

def test_decode_frame_round_trip():
    for p in SEEDS:
        assert codec.decode_frame(frame(p)).to_dict() == codec.decode(p).to_dict()
        assert codec.decode_frame(bytearray(frame(p))).to_dict() == codec.decode(p).to_dict()


@pytest.mark.parametrize("delta", [-1, -4, 1, 4, 100])
def test_decode_frame_prefix_mismatch_is_malformed(delta):
    f = bytearray(frame(SEEDS[0]))
    struct.pack_into("<I", f, 0, len(SEEDS[0]) + delta)
    with pytest.raises(codec.MalformedMessage) as ei:
        codec.decode_frame(bytes(f))
    assert type(ei.value) is codec.MalformedMessage and ei.value.code == 5001
    # a frame with trailing bytes is not the same as a frame
    with pytest.raises(codec.MalformedMessage):
        codec.decode_frame(frame(SEEDS[0]) + b"\0" * 4)


@pytest.mark.parametrize("data", [b"", b"\x01", b"\x01\x00\x00", struct.pack("<I", 0),
                                  struct.pack("<I", 0) + b"\0" * 8,
                                  struct.pack("<I", MAX + 1) + b"\0" * 8,
                                  struct.pack("<I", 0xFFFFFFFF)])
def test_decode_frame_bad_prefix_is_a_framing_error(data):
    with pytest.raises(codec.FramingError):
        codec.decode_frame(data)


def test_decode_frame_short_payload_is_malformed():
    for n in range(1, 8):
        with pytest.raises(codec.MalformedMessage):
            codec.decode_frame(frame(b"\0" * n))
