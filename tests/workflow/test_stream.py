"""AnswerStream, the token path: each chunk becomes one AnswerText frame on the connection.
The reactor's Connection is reached with C calls (tests/server, tests/workflow/test_turns);
any other transport (the uvloop baseline) through its Python send()."""
from tryll_fast import codec
from tryll_fast.workflow._stream import AnswerStream


class PythonTransport:
    def __init__(self, queued: int = 0):
        self.queued_bytes = queued
        self.frames = []

    def send(self, frame: bytes) -> bool:
        self.frames.append(frame)
        return True


def bodies(frames):
    return [codec.decode_frame(f).body for f in frames]


def test_another_transport_gets_one_frame_per_chunk_then_the_terminator():
    conn = PythonTransport()
    s = AnswerStream(conn, 2**64 - 1, 7, "answer")
    for text in ("Hel", "lo ", "wörld"):
        s.feed(text)
    s.finish()
    got = [(b.request_id, b.agent_id, b.node_name, b.text, b.is_delta, b.is_final)
           for b in bodies(conn.frames)]
    assert got == [(2**64 - 1, 7, "answer", t, True, False) for t in ("Hel", "lo ", "wörld")] \
        + [(2**64 - 1, 7, "answer", "", True, True)]
    assert (s.frames, s.chars, s.coalesced, s.finished) == (4, 11, 0, True)


def test_a_backed_up_transport_gets_the_chunks_coalesced():
    conn = PythonTransport(queued=1 << 20)          # far behind: chunks wait
    s = AnswerStream(conn, 1, 1, "n")
    for text in ("a", "b", "c"):
        s.feed(text)
    assert conn.frames == [] and s.coalesced == 3
    conn.queued_bytes = 0
    s.feed("d")                                     # caught up: one frame for all four
    s.finish()
    assert [b.text for b in bodies(conn.frames)] == ["abcd", ""]
