# cython: language_level=3
"""Token -> text on the streaming hot path: UTF-8 assembly plus stop-string hold-back.

A token's piece is a byte string that may end in the middle of a UTF-8
character (byte-level BPE splits emoji and CJK across tokens), and the text
streamed so far may end with the first bytes of a stop string. `TextStream`
keeps those bytes pending and releases only text that can never be retracted:
complete characters that cannot be the start of a stop string. A found stop
string is swallowed with everything after it.

Matching is done on bytes. UTF-8 is self-synchronising, so a byte match of a
valid UTF-8 stop string always starts and ends on character boundaries.

`fallback.py` is the pure-Python reference with the same behaviour; the tests
run both.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, uintptr_t
from libc.string cimport memcmp, memcpy, memmove

# llama_token_to_piece(vocab, token, buf, length, lstrip, special) from llama.h
ctypedef int32_t (*token_to_piece_fn)(const void *, int32_t, char *, int32_t, int32_t, bint) noexcept nogil

cdef enum:
    PIECE_BUF = 256


cdef inline Py_ssize_t utf8_incomplete_tail(const unsigned char *s, Py_ssize_t n) noexcept nogil:
    """Bytes at the end of s[:n] that start a valid but unfinished character.

    Invalid sequences return 0: they are released (as U+FFFD) rather than
    held forever waiting for bytes that cannot complete them.
    """
    cdef Py_ssize_t i = n - 1
    cdef Py_ssize_t back = 0
    cdef unsigned char c
    cdef Py_ssize_t need
    # walk back over at most 3 continuation bytes to the lead byte
    while i >= 0 and back < 4:
        c = s[i]
        if (c & 0xC0) != 0x80:
            break
        i -= 1
        back += 1
    if i < 0 or back >= 4:
        return 0
    c = s[i]
    if c < 0x80:
        return 0
    elif (c & 0xE0) == 0xC0:
        need = 2
    elif (c & 0xF0) == 0xE0:
        need = 3
    elif (c & 0xF8) == 0xF0:
        need = 4
    else:
        return 0
    if back + 1 < need:
        return back + 1
    return 0


cdef class TextStream:
    """Incremental detokenizer for one generation.

    feed(piece) / feed_token(token) -> text safe to emit now (maybe "");
    finish() -> the held-back rest once generation ends without a stop;
    stopped -> True once a stop string was seen (further input is ignored).
    """
    cdef char *buf            # pending bytes not yet released
    cdef Py_ssize_t n
    cdef Py_ssize_t cap
    cdef list _stops          # stop strings as UTF-8 bytes, non-empty
    cdef Py_ssize_t max_stop
    cdef token_to_piece_fn fn
    cdef const void *vocab
    cdef char piece[PIECE_BUF]
    cdef readonly bint stopped
    cdef readonly Py_ssize_t bytes_in

    def __cinit__(self, stops=(), uintptr_t vocab=0, uintptr_t token_to_piece=0):
        self.cap = 64
        self.buf = <char *>PyMem_Malloc(self.cap)
        if self.buf == NULL:
            raise MemoryError()
        self.n = 0
        self._stops = []
        self.max_stop = 0
        for s in stops:
            b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
            if len(b) == 0:
                raise ValueError("empty stop string")
            self._stops.append(b)
            if len(b) > self.max_stop:
                self.max_stop = len(b)
        self.vocab = <const void *>vocab
        self.fn = <token_to_piece_fn>token_to_piece
        self.stopped = False
        self.bytes_in = 0

    def __dealloc__(self):
        PyMem_Free(self.buf)

    cdef int _append(self, const char *data, Py_ssize_t size) except -1:
        cdef Py_ssize_t want = self.n + size
        cdef char *grown
        if want > self.cap:
            while self.cap < want:
                self.cap *= 2
            grown = <char *>PyMem_Realloc(self.buf, self.cap)
            if grown == NULL:
                raise MemoryError()
            self.buf = grown
        memcpy(self.buf + self.n, data, size)
        self.n = want
        self.bytes_in += size
        return 0

    cdef Py_ssize_t _find_stop(self, Py_ssize_t start) noexcept:
        """Earliest index >= start where a stop string begins in buf, or -1."""
        cdef Py_ssize_t best = -1
        cdef Py_ssize_t i, ln
        cdef bytes s
        for s in self._stops:
            ln = PyBytes_GET_SIZE(s)
            i = start
            while i + ln <= self.n and (best < 0 or i < best):
                if memcmp(self.buf + i, PyBytes_AS_STRING(s), ln) == 0:
                    best = i
                    break
                i += 1
        return best

    cdef Py_ssize_t _stop_prefix_tail(self) noexcept:
        """Longest suffix of buf that is a proper prefix of some stop string."""
        cdef Py_ssize_t best = 0
        cdef Py_ssize_t k, ln
        cdef bytes s
        for s in self._stops:
            ln = PyBytes_GET_SIZE(s)
            k = ln - 1
            if k > self.n:
                k = self.n
            while k > best:
                if memcmp(self.buf + self.n - k, PyBytes_AS_STRING(s), k) == 0:
                    best = k
                    break
                k -= 1
        return best

    cdef str _release(self, Py_ssize_t count):
        cdef str out = PyUnicode_DecodeUTF8(self.buf, count, "replace")
        memmove(self.buf, self.buf + count, self.n - count)
        self.n -= count
        return out

    cdef str _push(self, const char *data, Py_ssize_t size):
        cdef Py_ssize_t before, start, at, hold, tail
        if self.stopped or size == 0:
            return ""
        before = self.n
        self._append(data, size)
        if self.max_stop:
            # only a window touching the new bytes can hold a new match
            start = before - (self.max_stop - 1)
            if start < 0:
                start = 0
            at = self._find_stop(start)
            if at >= 0:
                self.stopped = True
                self.n = at
                return self._release(at)
            hold = self._stop_prefix_tail()
        else:
            hold = 0
        tail = utf8_incomplete_tail(<const unsigned char *>self.buf, self.n)
        if tail > hold:
            hold = tail
        if hold >= self.n:
            return ""
        return self._release(self.n - hold)

    def feed(self, bytes piece):
        """Add the bytes of one piece; return the text that is now final."""
        return self._push(PyBytes_AS_STRING(piece), PyBytes_GET_SIZE(piece))

    def feed_token(self, int32_t token):
        """Render `token` with llama_token_to_piece (no special tokens) and feed it."""
        cdef int32_t got
        cdef bytes big
        if self.fn == NULL or self.vocab == NULL:
            raise RuntimeError("TextStream was built without a vocabulary")
        got = self.fn(self.vocab, token, self.piece, PIECE_BUF, 0, False)
        if got >= 0:
            return self._push(self.piece, got)
        # a piece longer than the stack buffer: -got is the size it needs
        big = bytes(-got)
        got = self.fn(self.vocab, token, PyBytes_AS_STRING(big), -got, 0, False)
        if got < 0:
            raise RuntimeError(f"llama_token_to_piece failed for token {token}")
        return self._push(PyBytes_AS_STRING(big), got)

    def finish(self):
        """Release whatever is held back (an unfinished character becomes U+FFFD)."""
        if self.stopped:
            self.n = 0
            return ""
        return self._release(self.n)

    @property
    def pending(self):
        """Bytes held back right now (for tests and diagnostics)."""
        return self.buf[:self.n]
