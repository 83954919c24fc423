# cython: language_level=3
"""A pipeline connection's outbound queue, compiled: what the session's threads hand the
connection (frames, and elements made on the loop) in call order, for its pump on the
gateway's loop.

A streamed turn puts a frame here per token, from the engine's thread, and the pump takes
them while that thread keeps producing; both hold the GIL for every step, so this is the
per-token cost the pipeline adds to the TCP path (docs/pipeline.md, "The codec"). Each
method changes the state with the GIL held and runs no Python code in between: that is
what orders the producer's put() against the pump's take() and release(), without a lock.
The few calls out (the pump's wake-up, the writable event) come after the state is set.

Backpressure as on the reactor: at `high` queued bytes the queue is paused (producers
wait in wait_writable(), the engine's gate reads `paused`), and it resumes at `low`.
"""
import collections
import threading
import time

from tryll_fast.codec._codec cimport answer_text_of


cdef class Outbox:
    cdef object _items                  # collections.deque of frames and other items
    cdef readonly Py_ssize_t queued     # bytes accounted to what is queued
    cdef readonly bint paused
    cdef readonly double paused_at      # monotonic time of the last pause (the watchdog)
    cdef public bint shut               # put() refuses (the connection is closing or gone)
    cdef bint _wake_pending
    cdef Py_ssize_t _high
    cdef Py_ssize_t _low
    cdef object _writable               # threading.Event, set while not paused
    cdef object _wake                   # wakes the pump; called from any thread

    def __cinit__(self, Py_ssize_t high, Py_ssize_t low, wake):
        self._items = collections.deque()
        self._high = high
        self._low = low
        self._wake = wake
        self._writable = threading.Event()
        self._writable.set()

    cpdef bint put(self, object item, Py_ssize_t nbytes, bint force=False):
        """Queue an item accounted as `nbytes` (any thread); False once shut, unless
        `force` (the connection's own goodbye)."""
        if self.shut and not force:
            return False
        self._items.append(item)
        self.queued += nbytes
        if not self.paused and self.queued >= self._high:
            self.paused = True
            self.paused_at = time.monotonic()
            self._writable.clear()
        if self._wake_pending:
            return True
        self._wake_pending = True
        self._wake()
        return True

    def send(self, bytes frame):
        """A frame from the session (any thread): the Connection surface's send()."""
        return self.put(frame, len(frame))

    def wait_writable(self, double timeout):
        """A producer thread waits here while paused (at most `timeout` s)."""
        self._writable.wait(timeout)

    # ---- the pump's side (the gateway loop) ----

    def woken(self):
        """The pump is awake: the next put() wakes it again."""
        self._wake_pending = False

    def take(self):
        """The next item, or None when the queue is empty (its bytes stay accounted until
        release())."""
        if self._items:
            return self._items.popleft()
        return None

    def head(self):
        """The next item without taking it, or None."""
        if self._items:
            return self._items[0]
        return None

    cpdef bint release(self, Py_ssize_t nbytes):
        """`nbytes` of what was taken are done with; True when that resumed the queue."""
        self.queued -= nbytes
        if self.paused and self.queued <= self._low:
            self.paused = False
            self._writable.set()
            return True
        return False

    def take_text_run(self, unsigned long long request_id, str text,
                      Py_ssize_t max_chars):
        """`text` and the text of the AnswerText frames of request `request_id` queued right
        behind it (taken, and released), up to `max_chars`: (the joined text, whether the
        queue resumed)."""
        cdef list parts = [text]
        cdef Py_ssize_t size = len(text)
        cdef Py_ssize_t taken = 0
        cdef object frame
        cdef tuple answer
        cdef str piece
        items = self._items
        while items and size < max_chars:
            frame = items[0]
            if type(frame) is not bytes:
                break
            answer = answer_text_of(frame)
            if answer is None or answer[0] != request_id:
                break
            piece = answer[1]
            if not piece:
                break
            items.popleft()
            taken += len(<bytes>frame)
            parts.append(piece)
            size += len(piece)
        if not taken:
            return text, False
        return "".join(parts), self.release(taken)

    def clear(self):
        """Drop everything queued and resume (the connection is gone)."""
        self._items.clear()
        self.queued = 0
        self.paused = False
        self._writable.set()

    def __len__(self):
        return len(self._items)
