# Frame splitting: a byte stream in, complete FlatBuffers payloads out.
# The wire format is a little-endian uint32 length followed by that many bytes;
# a length of 0 or above 1 MiB is a fatal protocol error (the server closes the
# connection without answering), reported here as FramingError.

@cython.final
cdef class FrameSplitter:
    """Feed arbitrary chunks from a socket; get back every complete payload.

    >>> s = FrameSplitter()
    >>> s.feed(frame[:3]) ; s.feed(frame[3:])   # [] then [payload]
    """
    cdef bytearray _buf       # bytes received but not yet returned
    cdef Py_ssize_t _start    # first unconsumed byte of _buf
    cdef bint _failed

    def __cinit__(self):
        self._buf = bytearray()
        self._start = 0

    @property
    def pending(self):
        """How many received bytes wait for the rest of their frame."""
        return len(self._buf) - self._start

    def feed(self, data):
        """Append `data`; return the list of complete payloads (bytes)."""
        cdef list out = []
        cdef const uint8_t* p
        cdef Py_ssize_t n, avail, length
        if self._failed:
            raise FramingError("framing already failed; the connection must close")
        self._buf += data
        p = <const uint8_t*>PyByteArray_AS_STRING(self._buf)
        n = len(self._buf)
        while True:
            avail = n - self._start
            if avail < 4:
                break
            length = tf_ld_u32(p + self._start)
            if length == 0 or length > TF_MAX_FRAME:
                self._failed = True
                raise FramingError(
                    f"frame length {length} is outside 1..{TF_MAX_FRAME}")
            if avail - 4 < length:
                break
            out.append(PyBytes_FromStringAndSize(<const char*>(p + self._start + 4), length))
            self._start += 4 + length
        # compact once the consumed prefix dominates, keeping feed() O(n)
        if self._start and self._start * 2 >= n:
            del self._buf[:self._start]
            self._start = 0
        return out
