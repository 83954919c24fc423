"""The streaming detokenizer: compiled TextStream against its pure-Python reference."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tryll_fast.engines.llama import _detok, fallback

IMPLS = [pytest.param(_detok.TextStream, id="cython"),
         pytest.param(fallback.TextStream, id="python")]

SAMPLES = ["é", "€", "😀", "日本語", "naïve café 👋🏽 ok", "a\u0301"]


def feed_all(stream, pieces):
    out = [stream.feed(p) for p in pieces]
    return out, stream.finish()


def byte_splits(data: bytes):
    """Every way to cut data into two pieces, plus one byte at a time."""
    for i in range(len(data) + 1):
        yield [data[:i], data[i:]]
    yield [bytes([b]) for b in data]


@pytest.mark.parametrize("TextStream", IMPLS)
@pytest.mark.parametrize("text", SAMPLES)
def test_split_multibyte_never_splits_a_character(TextStream, text):
    data = text.encode()
    for pieces in byte_splits(data):
        s = TextStream()
        chunks, tail = feed_all(s, pieces)
        assert "".join(chunks) + tail == text
        assert tail == ""
        assert all("\ufffd" not in c for c in chunks)


@pytest.mark.parametrize("TextStream", IMPLS)
def test_incomplete_character_is_held_then_released(TextStream):
    s = TextStream()
    emoji = "😀".encode()
    assert s.feed(b"ok " + emoji[:1]) == "ok "
    assert s.pending == emoji[:1]
    assert s.feed(emoji[1:3]) == ""
    assert s.feed(emoji[3:]) == "😀"
    assert s.pending == b""


@pytest.mark.parametrize("TextStream", IMPLS)
def test_unfinished_character_at_end_becomes_replacement(TextStream):
    s = TextStream()
    assert s.feed("x€".encode()[:2]) == "x"
    assert s.finish() == "\ufffd"


@pytest.mark.parametrize("TextStream", IMPLS)
def test_invalid_bytes_are_not_held_forever(TextStream):
    s = TextStream()
    assert s.feed(b"a\xff") == "a\ufffd"
    assert s.feed(b"\x80b") == "\ufffdb"


@pytest.mark.parametrize("TextStream", IMPLS)
def test_stop_string_split_across_pieces_is_never_emitted(TextStream):
    s = TextStream(["<END>"])
    out = [s.feed(p) for p in (b"Hello <", b"EN", b"D> tail")]
    assert "".join(out) == "Hello "
    assert s.stopped
    assert s.feed(b"more") == ""
    assert s.finish() == ""


@pytest.mark.parametrize("TextStream", IMPLS)
def test_partial_stop_is_released_when_it_diverges(TextStream):
    s = TextStream(["STOP"])
    assert s.feed(b"ST") == ""
    assert s.feed(b"ART") == "START"
    assert s.feed(b" ST") == " "
    assert s.finish() == "ST"
    assert not s.stopped


@pytest.mark.parametrize("TextStream", IMPLS)
def test_earliest_of_several_stops_wins(TextStream):
    s = TextStream(["world", "lo w"])
    assert s.feed(b"hello world") == "hel"
    assert s.stopped


@pytest.mark.parametrize("TextStream", IMPLS)
def test_non_ascii_stop_string(TextStream):
    s = TextStream(["日本"])
    data = "今日は日本へ".encode()
    out = "".join(s.feed(bytes([b])) for b in data)
    assert out == "今日は"
    assert s.stopped


@pytest.mark.parametrize("TextStream", IMPLS)
def test_empty_stop_string_is_refused(TextStream):
    with pytest.raises(ValueError):
        TextStream([""])


def test_feed_token_needs_a_vocabulary():
    with pytest.raises(RuntimeError):
        _detok.TextStream().feed_token(1)


alphabet = st.sampled_from(list("ab <>/é€😀日\n"))


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet, max_size=40), stop=st.text(alphabet, min_size=1, max_size=4),
       cuts=st.lists(st.integers(0, 200), max_size=12))
def test_compiled_matches_reference_and_the_stop_rule(text, stop, cuts):
    data = text.encode()
    bounds = sorted({min(c, len(data)) for c in cuts} | {0, len(data)})
    pieces = [data[a:b] for a, b in zip(bounds, bounds[1:])]
    results = []
    for T in (_detok.TextStream, fallback.TextStream):
        s = T([stop])
        chunks = [s.feed(p) for p in pieces]
        results.append((chunks, s.finish(), s.stopped))
    assert results[0] == results[1]
    chunks, tail, stopped = results[0]
    at = text.find(stop)
    expected = text if at < 0 else text[:at]
    assert "".join(chunks) + tail == expected
    assert stopped == (at >= 0)
    assert all("\ufffd" not in c for c in chunks)
