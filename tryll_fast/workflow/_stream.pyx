# cython: language_level=3
"""Token streaming: engine text chunks -> AnswerText frames -> the connection. Compiled,
because it runs once per token on the engine's scheduler thread, with the GIL.

`AnswerStream.feed(text)` is the engine's on_text callback. Each chunk becomes one
AnswerText frame (is_delta = true), encoded by codec.encode_answer_text and handed to the
connection at once. Chunks are coalesced only when the socket is behind (COALESCE_BYTES
already queued for the client): they wait in a list, and the next chunk to find the queue
short, or finish(), sends them as one frame (at most MAX_PENDING_CHARS of them). The text
is UTF-8-safe already (the engine's TextStream never splits a character).

For each frame it records two times from the token's sampling (the scheduler stamps
`handle.t_sample_ns`): until the finished frame is handed to the connection's send()
(`handoff_ns`: our own overhead, gated by the workflow benchmark), and until send()
returned (`sent_ns`: that plus the kernel's loopback delivery, which on a 2-core VM often
includes the scheduler running the woken client first).
"""
cimport cython
from time import perf_counter_ns

# C calls across compiled modules (their .pxd files): the frame is built and queued
# without a Python-level call per token.
from tryll_fast.codec._codec cimport encode_answer_text
from tryll_fast.transport._reactor cimport Connection

cdef Py_ssize_t COALESCE_BYTES = 65536
cdef Py_ssize_t MAX_PENDING_CHARS = 16384
cdef Py_ssize_t MAX_SAMPLES = 4096


@cython.final
cdef class AnswerStream:
    cdef object _conn
    cdef Connection _fast             # _conn when it is the reactor's Connection, else None
    cdef readonly unsigned long long request_id
    cdef readonly unsigned long long agent_id
    cdef readonly str node_name
    cdef list _pending
    cdef Py_ssize_t _pending_chars
    cdef readonly Py_ssize_t frames
    cdef readonly Py_ssize_t coalesced
    cdef readonly Py_ssize_t chars
    cdef readonly bint finished
    cdef public object handle
    cdef list _handoff_ns
    cdef list _sent_ns
    cdef readonly long long first_handoff_ns   # perf_counter_ns of the first frame's send()

    def __cinit__(self, conn, unsigned long long request_id, unsigned long long agent_id,
                  str node_name):
        self._conn = conn
        self._fast = conn if isinstance(conn, Connection) else None
        self.request_id = request_id
        self.agent_id = agent_id
        self.node_name = node_name
        self._pending = []
        self._handoff_ns = []
        self._sent_ns = []

    def feed(self, str text):
        """One chunk of text from the engine (scheduler thread)."""
        cdef object handle
        if self.finished or not text:
            return
        if self._queued() >= COALESCE_BYTES and self._pending_chars < MAX_PENDING_CHARS:
            self._pending.append(text)
            self._pending_chars += len(text)
            self.coalesced += 1
            return
        if self._pending:
            self._pending.append(text)
            text = "".join(self._pending)
            self._pending = []
            self._pending_chars = 0
        frame = encode_answer_text(self.request_id, self.agent_id, self.node_name, text, True,
                                   False)
        handle = self.handle
        if handle is None or len(self._sent_ns) >= MAX_SAMPLES:
            self._send(frame, len(text))
            return
        t0 = handle.t_sample_ns
        self._handoff_ns.append(perf_counter_ns() - t0)
        self._send(frame, len(text))
        self._sent_ns.append(perf_counter_ns() - t0)

    cdef inline Py_ssize_t _queued(self):
        if self._fast is not None:
            return self._fast.queued_bytes
        return self._conn.queued_bytes

    cdef _send(self, bytes frame, Py_ssize_t chars):
        if self.frames == 0:
            self.first_handoff_ns = perf_counter_ns()
        self.frames += 1
        self.chars += chars
        if self._fast is not None:
            self._fast.send(frame)
        else:
            self._conn.send(frame)      # another transport (the uvloop baseline)

    def finish(self):
        """Send what is pending, then the empty terminator (is_delta, is_final)."""
        if self.finished:
            return
        if self._pending:
            text = "".join(self._pending)
            self._send(encode_answer_text(self.request_id, self.agent_id, self.node_name, text,
                                          True, False), len(text))
            self._pending = []
            self._pending_chars = 0
        self._send(encode_answer_text(self.request_id, self.agent_id, self.node_name, "", True,
                                      True), 0)
        self.finished = True

    @property
    def handoff_ns(self):
        """Per frame (at most 4096): sampled token -> the frame handed to send()."""
        return list(self._handoff_ns)

    @property
    def sent_ns(self):
        """Per frame (at most 4096): sampled token -> send() returned."""
        return list(self._sent_ns)
