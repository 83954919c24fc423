"""Pure-Python reference of `_detok.TextStream` (same behaviour, slower).

The tests run every detokenizer case against both, like msgpack's fallback:
if the compiled one drifts, the reference catches it.
"""


def _incomplete_tail(buf: bytes | bytearray) -> int:
    """Bytes at the end that start a valid but unfinished UTF-8 character."""
    back = 0
    i = len(buf) - 1
    while i >= 0 and back < 4 and (buf[i] & 0xC0) == 0x80:
        i -= 1
        back += 1
    if i < 0 or back >= 4:
        return 0
    lead = buf[i]
    if lead < 0x80:
        return 0
    if lead & 0xE0 == 0xC0:
        need = 2
    elif lead & 0xF0 == 0xE0:
        need = 3
    elif lead & 0xF8 == 0xF0:
        need = 4
    else:
        return 0
    return back + 1 if back + 1 < need else 0


class TextStream:
    def __init__(self, stops=(), vocab=0, token_to_piece=0):
        self._stops = []
        for s in stops:
            b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
            if not b:
                raise ValueError("empty stop string")
            self._stops.append(b)
        self._max_stop = max((len(s) for s in self._stops), default=0)
        self._buf = bytearray()
        self.stopped = False
        self.bytes_in = 0
        if vocab or token_to_piece:
            raise ValueError("the fallback TextStream takes pieces, not tokens")

    @property
    def pending(self) -> bytes:
        return bytes(self._buf)

    def _release(self, count: int) -> str:
        out = self._buf[:count].decode("utf-8", "replace")
        del self._buf[:count]
        return out

    def feed(self, piece: bytes) -> str:
        if self.stopped or not piece:
            return ""
        before = len(self._buf)
        self._buf += piece
        self.bytes_in += len(piece)
        hold = 0
        if self._stops:
            start = max(0, before - (self._max_stop - 1))
            hits = [i for i in (self._buf.find(s, start) for s in self._stops) if i >= 0]
            if hits:
                at = min(hits)
                self.stopped = True
                del self._buf[at:]
                return self._release(at)
            for s in self._stops:
                for k in range(min(len(s) - 1, len(self._buf)), hold, -1):
                    if self._buf.endswith(s[:k]):
                        hold = k
                        break
        hold = max(hold, _incomplete_tail(self._buf))
        if hold >= len(self._buf):
            return ""
        return self._release(len(self._buf) - hold)

    def feed_token(self, token: int) -> str:
        raise RuntimeError("TextStream was built without a vocabulary")

    def finish(self) -> str:
        if self.stopped:
            self._buf.clear()
            return ""
        return self._release(len(self._buf))
