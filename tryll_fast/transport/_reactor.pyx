# cython: language_level=3, freethreading_compatible=False
# distutils: include_dirs = csrc
"""The epoll reactor: one thread owns every socket; frames in, frames out.

Threading contract. The reactor thread runs `Reactor.run()`: it sleeps in
epoll_wait with the GIL released and does everything else with the GIL held.
Other threads (engine schedulers, workers) call `Connection.send()`. Every
method that touches a connection's state is a cdef routine that makes no
Python-level call while the state is inconsistent, so the GIL alone
serialises it against the reactor: no extra lock, and nothing a model thread
holds can block the reactor. (This is why the module is not free-threading
compatible.)

Input. Bytes are read into a per-connection C buffer; complete frames are cut
out in C (little-endian uint32 length, 1..1 048 576) and the receiver is called
once per frame with the payload as `bytes`. A length of 0 or above the cap
closes the connection at once and sends nothing (seed 000).

Output. `send(frame)` appends a finished frame to the connection's queue.
Frames queued on the reactor thread (inline replies) are written together
with one sendmsg() per connection at the end of the batch that produced them.
A frame sent from another thread while the queue is empty is written at once
from that thread (`direct_send`: the lowest latency for a token or an audio
chunk), unless that connection had such a direct write less than
DIRECT_GAP_S ago: then the producer is in a burst, and the frame is queued and
the reactor woken through an eventfd, so the burst leaves in a few large
sendmsg() calls instead of one syscall per frame. Order per connection is the
order of send() calls.

Backpressure. When a connection's queued bytes reach `high_water`, it is
*paused*: `paused` is True, `wait_writable()` blocks, producers are expected to
stop, and the reactor stops reading the connection's requests. When the queue
drains to `low_water` it resumes and `writing_resumed()` is called on its
receiver. A connection that stays paused for `stall_timeout` seconds is
closed ("stalled"). Nothing queued is ever dropped while the connection lives.

The receiver (returned by `handler.connection_made(conn)`) implements
`frame_received(payload)`, `connection_lost(reason)` and optionally
`writing_resumed()`; all three run on the reactor thread.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from libc.stdint cimport uint8_t, uint32_t, uint64_t
from libc.string cimport memmove, memset

from tryll_fast.transport.system cimport (
    EAGAIN, ECONNABORTED, EINTR, EMFILE, ENFILE, ENOBUFS, ENOMEM, EPOLL_CLOEXEC, EPOLL_CTL_ADD,
    EPOLL_CTL_DEL, EPOLL_CTL_MOD, EPOLLERR, EPOLLHUP, EPOLLIN, EPOLLOUT, EPOLLRDHUP,
    EFD_CLOEXEC, EFD_NONBLOCK, IPPROTO_TCP, MSG_DONTWAIT, MSG_NOSIGNAL, SHUT_WR, SOCK_CLOEXEC,
    SOCK_NONBLOCK, TCP_NODELAY, accept4, close, epoll_create1, epoll_ctl, epoll_event,
    epoll_wait, errno, eventfd, iovec, msghdr, pthread_equal, pthread_self, pthread_t, read,
    recv, send, sendmsg, setsockopt, shutdown, ssize_t, strerror, write,
)

import logging
import os
import socket
import threading

cdef extern from "tf_codec.h":
    enum: TF_MAX_FRAME
    uint32_t tf_ld_u32(const uint8_t* p)

cdef extern from "<time.h>" nogil:
    ctypedef long time_t
    struct timespec:
        time_t tv_sec
        long tv_nsec
    enum: CLOCK_MONOTONIC
    int clock_gettime(int clk, timespec* tp)

log = logging.getLogger("tryll_fast.transport")

MAX_FRAME = TF_MAX_FRAME

cdef enum:
    MAX_EVENTS = 256
    IOV_BATCH = 256                 # frames per sendmsg (well under IOV_MAX)
    RBUF_INITIAL = 16384            # per-connection read buffer, grown on demand
    RBUF_KEEP = 262144              # shrink back after a frame larger than this
    READ_MIN_FREE = 4096
    READ_BUDGET = 1048576           # bytes read from one connection per wakeup (fairness)
    OUT_COMPACT = 256               # release written frames in bulk every this many

# epoll keys that are not connection ids (connection ids start at 1)
cdef uint64_t KEY_LISTEN = 0xFFFFFFFFFFFFFFFF
cdef uint64_t KEY_WAKE = 0xFFFFFFFFFFFFFFFE

# How long a gracefully closed connection waits for the peer's EOF after our
# last byte (so unread input does not turn our final frames into an RST).
cdef double LINGER_S = 2.0
# Foreign-thread sends closer together than this on one connection are a burst:
# queued for one batched write instead of a syscall each (see the module doc).
cdef double DIRECT_GAP_S = 50e-6
# accept() failing for lack of descriptors: stop accepting this long, then retry.
cdef double ACCEPT_BACKOFF_S = 0.1


cdef inline double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef str _os_error(str what):
    cdef int e = errno
    return f"{what}: {(<bytes>strerror(e)).decode('utf-8', 'replace')} (errno {e})"


@cython.final
cdef class Connection:
    """One accepted TCP connection. Created by the reactor; see the module doc."""

    cdef readonly uint64_t id
    cdef readonly int fd
    cdef readonly str peer
    cdef Reactor _reactor
    cdef object _receiver
    cdef object _on_frame             # the receiver's bound frame_received
    # input
    cdef char* _rbuf
    cdef Py_ssize_t _rlen
    cdef Py_ssize_t _rcap
    cdef bint _in_read
    # output: frames (bytes) not yet fully written; _off bytes of _out[_head] are written
    cdef list _out
    cdef Py_ssize_t _head
    cdef Py_ssize_t _off
    cdef readonly Py_ssize_t queued_bytes
    cdef bint _blocked                # the kernel buffer was full: waiting for EPOLLOUT
    cdef bint _dirty                  # in the reactor's list of connections to flush
    cdef uint32_t _interest           # current epoll interest set
    # state
    cdef readonly bint paused
    cdef readonly bint closed
    cdef bint _closing                # graceful close: flush, SHUT_WR, wait for EOF
    cdef bint _wr_shut
    cdef bint _resumed                # writing_resumed() owed to the receiver
    cdef double _paused_at
    cdef double _linger_until
    cdef double _last_direct          # when this connection last had a direct write
    cdef object _writable             # threading.Event, set while not paused
    cdef readonly str close_reason
    # counters
    cdef readonly uint64_t frames_in
    cdef readonly uint64_t frames_out
    cdef readonly uint64_t bytes_in
    cdef readonly uint64_t bytes_out

    def __cinit__(self):
        self._rbuf = NULL
        self.fd = -1

    def __dealloc__(self):
        if self._rbuf != NULL:
            PyMem_Free(self._rbuf)
            self._rbuf = NULL
        if self.fd >= 0 and not self.closed:
            # never reached through the reactor (it keeps open connections alive)
            close(self.fd)

    def __init__(self):
        raise TypeError("connections are created by the Reactor")

    # ---- the public, thread-safe surface ----

    cpdef bint send(self, object frame) except -1:
        """Queue one complete frame (length prefix included); any thread.

        Returns False, dropping the frame, once the connection is closing or
        closed. Never blocks: a producer that must not grow the queue checks
        `paused` / `wait_writable()` first."""
        cdef Reactor r = self._reactor
        cdef Py_ssize_t n, sent
        cdef int err
        cdef double now
        if type(frame) is not bytes:
            raise TypeError(f"send() takes bytes, not {type(frame).__name__}")
        if self.closed or self._closing:
            return False
        n = PyBytes_GET_SIZE(frame)
        if n == 0:
            return True
        self.frames_out += 1
        r.frames_out += 1
        if r._on_loop_thread():
            self._enqueue(frame, 0)
            r._mark_dirty(self)
            return True
        now = _now() if r.direct_send else 0.0
        if (r.direct_send and not self._blocked and self._head == PyList_GET_SIZE(self._out)
                and now - self._last_direct >= DIRECT_GAP_S):
            # Nothing queued: write now, from this thread. The GIL is held for the
            # whole call, so this cannot interleave with the reactor's writes.
            self._last_direct = now
            sent = send(self.fd, PyBytes_AS_STRING(frame), n, MSG_DONTWAIT | MSG_NOSIGNAL)
            if sent == n:
                self.bytes_out += n
                r.bytes_out += n
                r.direct_writes += 1
                return True
            if sent < 0:
                err = errno
                if err != EAGAIN and err != EINTR:
                    r.call_soon(self._abort_py, _os_error("send"))
                    return False
                sent = 0
            self.bytes_out += sent
            r.bytes_out += sent
            self._enqueue(frame, sent)
        else:
            self._enqueue(frame, 0)
        r._mark_dirty(self)
        r._wake()
        return True

    def wait_writable(self, timeout=None):
        """Block (a producer thread) until the connection is not paused.
        True when it may send; False on timeout or when it closed."""
        if self.closed:
            return False
        if not self.paused:
            return True
        return bool(self._writable.wait(timeout)) and not self.closed

    def close(self):
        """Graceful close, any thread: queued frames are written first; send()
        refuses new frames from now on."""
        if not self.closed:
            self._closing = True
            self._reactor.call_soon(self._close_py)

    def abort(self, reason="aborted"):
        """Close at once, any thread: queued frames are dropped."""
        self._reactor.call_soon(self._abort_py, str(reason))

    @property
    def reactor(self):
        return self._reactor

    @property
    def closing(self):
        return self._closing or self.closed

    def __repr__(self):
        state = "closed" if self.closed else ("paused" if self.paused else "open")
        return f"<Connection {self.id} {self.peer} {state} queued={self.queued_bytes}>"

    # ---- reactor-thread internals ----

    def _close_py(self):
        self._close()

    def _abort_py(self, reason):
        self._teardown(reason)

    cdef int _enqueue(self, bytes frame, Py_ssize_t already) except -1:
        cdef Reactor r = self._reactor
        if self._head == PyList_GET_SIZE(self._out):
            self._out.clear()
            self._head = 0
            self._off = already
        self._out.append(frame)
        self.queued_bytes += PyBytes_GET_SIZE(frame) - already
        if not self.paused and self.queued_bytes >= r.high_water:
            self.paused = True
            self._paused_at = _now()
            self._writable.clear()
            r.pauses += 1
            r._watched.add(self)          # for the stall deadline
            self._update_interest()
        return 0

    cdef int _update_interest(self) except -1:
        cdef epoll_event ev
        cdef uint32_t want = EPOLLRDHUP
        if self.closed:
            return 0
        if not self.paused or self._wr_shut:
            want |= EPOLLIN
        if self._blocked:
            want |= EPOLLOUT
        if want == self._interest:
            return 0
        memset(&ev, 0, sizeof(ev))
        ev.events = want
        ev.data.u64 = self.id
        if epoll_ctl(self._reactor._epfd, EPOLL_CTL_MOD, self.fd, &ev) < 0:
            raise OSError(errno, _os_error("epoll_ctl(MOD)"))
        self._interest = want
        return 0

    cdef int _flush(self) except -1:
        """Write as much of the queue as the kernel takes (reactor thread)."""
        cdef iovec iov[IOV_BATCH]
        cdef msghdr msg
        cdef Py_ssize_t i, cnt, total, ln, rem
        cdef ssize_t n
        cdef int err
        cdef object item
        cdef list out = self._out
        cdef Reactor r = self._reactor
        self._dirty = False
        while not self.closed and self._head < PyList_GET_SIZE(out):
            cnt = 0
            i = self._head
            total = PyList_GET_SIZE(out)
            while i < total and cnt < IOV_BATCH:
                item = <object>PyList_GET_ITEM(out, i)
                ln = PyBytes_GET_SIZE(item)
                if cnt == 0:
                    iov[0].iov_base = PyBytes_AS_STRING(item) + self._off
                    iov[0].iov_len = ln - self._off
                else:
                    iov[cnt].iov_base = PyBytes_AS_STRING(item)
                    iov[cnt].iov_len = ln
                cnt += 1
                i += 1
            memset(&msg, 0, sizeof(msg))
            msg.msg_iov = iov
            msg.msg_iovlen = cnt
            n = sendmsg(self.fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL)
            r.sendmsg_calls += 1
            if n < 0:
                err = errno
                if err == EINTR:
                    continue
                if err == EAGAIN:
                    if not self._blocked:
                        self._blocked = True
                        self._update_interest()
                    return 0
                self._teardown(_os_error("sendmsg"))
                return 0
            self.bytes_out += n
            r.bytes_out += n
            self.queued_bytes -= n
            while n > 0:
                item = <object>PyList_GET_ITEM(out, self._head)
                rem = PyBytes_GET_SIZE(item) - self._off
                if n >= rem:
                    n -= rem
                    self._head += 1
                    self._off = 0
                else:
                    self._off += n
                    n = 0
            if self._head >= OUT_COMPACT:
                del out[:self._head]
                self._head = 0
            if self.paused and self.queued_bytes <= r.low_water:
                self._resume()
        if self.closed:
            return 0
        out.clear()
        self._head = 0
        self._off = 0
        if self._blocked:
            self._blocked = False
            self._update_interest()
        if self.paused:
            self._resume()
        if self._closing and not self._wr_shut:
            self._shut_write()
        return 0

    cdef int _resume(self) except -1:
        cdef Reactor r = self._reactor
        self.paused = False
        self._writable.set()
        self._update_interest()
        if not self._resumed:
            self._resumed = True
            r._resumed.append(self)
        return 0

    cdef int _close(self) except -1:
        if self.closed or self._wr_shut:
            return 0
        self._closing = True
        if self._head == PyList_GET_SIZE(self._out):
            self._shut_write()
        else:
            self._reactor._mark_dirty(self)
        return 0

    cdef int _shut_write(self) except -1:
        """Our last byte is written: send FIN, then wait (bounded) for the peer's."""
        self._wr_shut = True
        if shutdown(self.fd, SHUT_WR) < 0:
            self._teardown("closed")
            return 0
        self._linger_until = _now() + LINGER_S
        self._reactor._watch(self)
        self._update_interest()
        return 0

    cdef int _grow(self, Py_ssize_t need) except -1:
        cdef Py_ssize_t cap = self._rcap if self._rcap else RBUF_INITIAL
        cdef char* p
        while cap < need:
            cap *= 2
        if cap == self._rcap:
            return 0
        p = <char*>PyMem_Realloc(self._rbuf, cap)
        if p == NULL:
            raise MemoryError()
        self._rbuf = p
        self._rcap = cap
        return 0

    cdef int _on_readable(self) except -1:
        cdef ssize_t n
        cdef Py_ssize_t budget = READ_BUDGET
        cdef int err
        cdef Reactor r = self._reactor
        self._in_read = True
        try:
            while not self.closed and budget > 0:
                if self._rcap - self._rlen < READ_MIN_FREE:
                    self._grow(self._rlen + READ_MIN_FREE)
                n = recv(self.fd, self._rbuf + self._rlen, self._rcap - self._rlen, 0)
                if n > 0:
                    self.bytes_in += n
                    r.bytes_in += n
                    budget -= n
                    if self._wr_shut:
                        continue          # closing: the peer's input is read and dropped
                    self._rlen += n
                    self._extract()
                    if self.paused:
                        break             # backpressure: leave the rest in the kernel
                    continue
                if n == 0:
                    self._teardown("closed" if self._wr_shut else "peer closed")
                    break
                err = errno
                if err == EINTR:
                    continue
                if err == EAGAIN:
                    break
                self._teardown(_os_error("recv"))
                break
        finally:
            self._in_read = False
        if self.closed:
            self._free_rbuf()
        return 0

    cdef int _extract(self) except -1:
        """Cut complete frames out of the read buffer and deliver each."""
        cdef Py_ssize_t pos = 0
        cdef Py_ssize_t length
        cdef bytes payload
        cdef Reactor r = self._reactor
        while self._rlen - pos >= 4:
            length = tf_ld_u32(<const uint8_t*>self._rbuf + pos)
            if length == 0 or length > TF_MAX_FRAME:
                r.framing_errors += 1
                self._teardown(f"framing error: frame length {length} is outside "
                               f"1..{TF_MAX_FRAME}")
                return 0
            if self._rlen - pos - 4 < length:
                break
            payload = PyBytes_FromStringAndSize(self._rbuf + pos + 4, length)
            pos += 4 + length
            self.frames_in += 1
            r.frames_in += 1
            try:
                self._on_frame(payload)
            except Exception:
                log.exception("frame_received failed on connection %d", self.id)
            if self.closed or self._wr_shut:
                return 0
        if pos:
            memmove(self._rbuf, self._rbuf + pos, self._rlen - pos)
            self._rlen -= pos
        if self._rlen >= 4:
            # the next frame's length is known: make room for all of it at once
            length = tf_ld_u32(<const uint8_t*>self._rbuf)
            if length + 4 + READ_MIN_FREE > self._rcap:
                self._grow(length + 4 + READ_MIN_FREE)
        elif self._rcap > RBUF_KEEP:
            self._shrink()
        return 0

    cdef int _shrink(self) except -1:
        cdef char* p = <char*>PyMem_Realloc(self._rbuf, RBUF_INITIAL)
        if p != NULL:
            self._rbuf = p
            self._rcap = RBUF_INITIAL
        return 0

    cdef void _free_rbuf(self) noexcept:
        if self._rbuf != NULL and not self._in_read:
            PyMem_Free(self._rbuf)
            self._rbuf = NULL
            self._rcap = 0
            self._rlen = 0

    cdef int _teardown(self, str reason) except -1:
        """Close the socket now; the receiver hears connection_lost after this batch."""
        cdef Reactor r = self._reactor
        if self.closed:
            return 0
        self.closed = True
        self.close_reason = reason
        epoll_ctl(r._epfd, EPOLL_CTL_DEL, self.fd, NULL)
        close(self.fd)
        r._conns.pop(self.id, None)
        r._watched.discard(self)
        self._out = []
        self._head = 0
        self._off = 0
        self.queued_bytes = 0
        self.paused = False
        self._writable.set()
        self._free_rbuf()
        r.closed_count += 1
        r._lost.append(self)
        return 0


@cython.final
cdef class Reactor:
    """The event loop. `run()` on the thread that should own the sockets."""

    cdef int _epfd
    cdef int _evfd
    cdef int _lfd
    cdef object _listen_sock          # keeps the Python socket object (and its fd) alive
    cdef object _handler
    cdef dict _conns                  # id -> Connection
    cdef list _dirty                  # connections with frames to flush
    cdef list _calls                  # (fn, args) from call_soon
    cdef list _lost                   # torn-down connections owed connection_lost()
    cdef list _resumed                # connections owed writing_resumed()
    cdef set _watched                 # paused or lingering connections (have deadlines)
    cdef uint64_t _next_id
    cdef pthread_t _thread
    cdef bint _has_thread
    cdef bint _wake_pending
    cdef bint _running
    cdef bint _stopped
    cdef readonly bint accepting
    cdef double _accept_retry_at
    cdef epoll_event _events[MAX_EVENTS]
    # settings
    cdef readonly Py_ssize_t high_water
    cdef readonly Py_ssize_t low_water
    cdef readonly double stall_timeout
    cdef readonly Py_ssize_t max_connections
    cdef readonly bint direct_send
    # counters
    cdef readonly uint64_t accepted
    cdef readonly uint64_t rejected
    cdef readonly uint64_t closed_count
    cdef readonly uint64_t frames_in
    cdef readonly uint64_t frames_out
    cdef readonly uint64_t bytes_in
    cdef readonly uint64_t bytes_out
    cdef readonly uint64_t sendmsg_calls
    cdef readonly uint64_t direct_writes
    cdef readonly uint64_t wakeups
    cdef readonly uint64_t pauses
    cdef readonly uint64_t stalls
    cdef readonly uint64_t framing_errors

    def __cinit__(self):
        self._epfd = -1
        self._evfd = -1
        self._lfd = -1

    def __init__(self, listen_sock, handler, *, Py_ssize_t high_water=4 << 20,
                 Py_ssize_t low_water=1 << 20, double stall_timeout=30.0,
                 Py_ssize_t max_connections=1024, bint direct_send=True):
        """listen_sock: a bound, listening socket.socket (the reactor makes it
        non-blocking and owns it from now on). handler.connection_made(conn)
        returns the connection's receiver."""
        cdef epoll_event ev
        if not 0 < low_water <= high_water:
            raise ValueError(f"need 0 < low_water ({low_water}) <= high_water ({high_water})")
        if stall_timeout <= 0:
            raise ValueError(f"stall_timeout must be > 0 s, got {stall_timeout}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.high_water = high_water
        self.low_water = low_water
        self.stall_timeout = stall_timeout
        self.max_connections = max_connections
        self.direct_send = direct_send
        self._handler = handler
        self._conns = {}
        self._dirty = []
        self._calls = []
        self._lost = []
        self._resumed = []
        self._watched = set()
        self._next_id = 1
        listen_sock.setblocking(False)
        self._listen_sock = listen_sock
        self._lfd = listen_sock.fileno()
        self._epfd = epoll_create1(EPOLL_CLOEXEC)
        if self._epfd < 0:
            raise OSError(errno, _os_error("epoll_create1"))
        self._evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)
        if self._evfd < 0:
            raise OSError(errno, _os_error("eventfd"))
        memset(&ev, 0, sizeof(ev))
        ev.events = EPOLLIN
        ev.data.u64 = KEY_WAKE
        if epoll_ctl(self._epfd, EPOLL_CTL_ADD, self._evfd, &ev) < 0:
            raise OSError(errno, _os_error("epoll_ctl(eventfd)"))
        self._add_listener()

    def __dealloc__(self):
        if self._evfd >= 0:
            close(self._evfd)
        if self._epfd >= 0:
            close(self._epfd)

    # ---- public ----

    @property
    def address(self):
        """(host, port) the listening socket is bound to (None once closed)."""
        if self._listen_sock is None:
            return None
        return self._listen_sock.getsockname()[:2]

    @property
    def connection_count(self):
        return len(self._conns)

    def connections(self):
        return list(self._conns.values())

    def stats(self):
        return {
            "connections": len(self._conns), "accepted": self.accepted,
            "rejected": self.rejected, "closed": self.closed_count,
            "frames_in": self.frames_in, "bytes_in": self.bytes_in,
            "frames_out": self.frames_out,
            "bytes_out": self.bytes_out, "sendmsg_calls": self.sendmsg_calls,
            "direct_writes": self.direct_writes, "wakeups": self.wakeups,
            "pauses": self.pauses, "stalls": self.stalls,
            "framing_errors": self.framing_errors,
        }

    def call_soon(self, fn, *args):
        """Run fn(*args) on the reactor thread, in call order; any thread."""
        self._calls.append((fn, args))
        if not self._on_loop_thread():
            self._wake()

    def stop_accepting(self):
        """Close the listening socket (thread-safe); open connections stay."""
        self.call_soon(self._stop_accepting_py)

    def stop(self):
        """End run() (thread-safe): every connection still open is aborted."""
        self.call_soon(self._stop_py)

    def in_loop_thread(self):
        return self._on_loop_thread()

    def run(self):
        """The loop; returns after stop()."""
        cdef int n, i, timeout
        cdef uint64_t key
        cdef uint32_t events
        cdef Connection conn
        if self._stopped:
            raise RuntimeError("this reactor has been stopped")
        self._thread = pthread_self()
        self._has_thread = True
        self._running = True
        try:
            while self._running:
                timeout = 0 if (self._calls or self._dirty or self._lost or self._resumed) \
                    else self._timeout_ms()
                with nogil:
                    n = epoll_wait(self._epfd, self._events, MAX_EVENTS, timeout)
                if n < 0:
                    if errno == EINTR:
                        continue
                    raise OSError(errno, _os_error("epoll_wait"))
                for i in range(n):
                    key = self._events[i].data.u64
                    events = self._events[i].events
                    if key == KEY_WAKE:
                        self._drain_wake()
                    elif key == KEY_LISTEN:
                        self._accept()
                    else:
                        conn = self._conns.get(key)
                        if conn is None:
                            continue
                        if events & (EPOLLIN | EPOLLHUP | EPOLLRDHUP | EPOLLERR):
                            conn._on_readable()
                        if not conn.closed and ((conn._dirty and not conn._blocked)
                                                or events & (EPOLLOUT | EPOLLERR)):
                            conn._flush()
                self._run_calls()
                self._flush_dirty()
                self._check_deadlines()
                self._notify()
        finally:
            self._shutdown_all()

    # ---- internals (reactor thread unless noted) ----

    cdef inline bint _on_loop_thread(self) noexcept:
        return self._has_thread and pthread_equal(self._thread, pthread_self())

    cdef int _wake(self) except -1:
        """Any thread: make epoll_wait return (once per batch)."""
        cdef uint64_t one = 1
        if self._wake_pending or self._evfd < 0:
            return 0
        self._wake_pending = True
        self.wakeups += 1
        write(self._evfd, &one, 8)
        return 0

    cdef int _drain_wake(self) except -1:
        cdef uint64_t value
        read(self._evfd, &value, 8)
        self._wake_pending = False
        return 0

    cdef inline int _mark_dirty(self, Connection conn) except -1:
        if not conn._dirty:
            conn._dirty = True
            self._dirty.append(conn)
        return 0

    cdef int _watch(self, Connection conn) except -1:
        self._watched.add(conn)
        return 0

    cdef int _flush_dirty(self) except -1:
        cdef Connection conn
        cdef list dirty
        while self._dirty:
            dirty = self._dirty
            self._dirty = []
            for conn in dirty:
                if conn.closed:
                    conn._dirty = False
                elif conn._blocked:
                    conn._dirty = False   # EPOLLOUT will call _flush
                else:
                    conn._flush()
        return 0

    cdef int _run_calls(self) except -1:
        cdef list calls
        while self._calls:
            calls = self._calls
            self._calls = []
            for fn, args in calls:
                try:
                    fn(*args)
                except Exception:
                    log.exception("reactor call %r failed", fn)
        return 0

    cdef int _notify(self) except -1:
        """Deliver connection_lost / writing_resumed, outside any state change."""
        cdef Connection conn
        cdef list batch
        while self._lost or self._resumed:
            batch = self._resumed
            self._resumed = []
            for conn in batch:
                conn._resumed = False
                if conn.closed or conn._receiver is None:
                    continue
                fn = getattr(conn._receiver, "writing_resumed", None)
                if fn is not None:
                    try:
                        fn()
                    except Exception:
                        log.exception("writing_resumed failed on connection %d", conn.id)
            batch = self._lost
            self._lost = []
            for conn in batch:
                receiver = conn._receiver
                conn._receiver = None
                conn._on_frame = None
                if receiver is None:
                    continue
                try:
                    receiver.connection_lost(conn.close_reason)
                except Exception:
                    log.exception("connection_lost failed on connection %d", conn.id)
        return 0

    cdef int _timeout_ms(self) except? -2:
        cdef double now, deadline, best = -1.0
        cdef Connection conn
        if not self._watched and self._accept_retry_at == 0:
            return -1
        now = _now()
        for conn in self._watched:
            deadline = conn._linger_until if conn._wr_shut else conn._paused_at + self.stall_timeout
            if best < 0 or deadline < best:
                best = deadline
        if self._accept_retry_at and (best < 0 or self._accept_retry_at < best):
            best = self._accept_retry_at
        if best < 0:
            return -1
        if best <= now:
            return 0
        return <int>((best - now) * 1000.0) + 1

    cdef int _check_deadlines(self) except -1:
        cdef double now = _now()
        cdef Connection conn
        if self._accept_retry_at and now >= self._accept_retry_at:
            self._accept_retry_at = 0
            if self.accepting:
                self._add_listener()
        if not self._watched:
            return 0
        for conn in list(self._watched):
            if conn.closed:
                self._watched.discard(conn)
            elif conn._wr_shut:
                if now >= conn._linger_until:
                    conn._teardown("closed")
            elif not conn.paused:
                self._watched.discard(conn)
            elif now - conn._paused_at >= self.stall_timeout:
                self.stalls += 1
                conn._teardown(f"stalled: the client read nothing for {self.stall_timeout:g} s"
                               f" with {conn.queued_bytes} bytes queued")
        return 0

    cdef int _add_listener(self) except -1:
        cdef epoll_event ev
        memset(&ev, 0, sizeof(ev))
        ev.events = EPOLLIN
        ev.data.u64 = KEY_LISTEN
        if epoll_ctl(self._epfd, EPOLL_CTL_ADD, self._lfd, &ev) < 0:
            raise OSError(errno, _os_error("epoll_ctl(listen)"))
        self.accepting = True
        return 0

    cdef int _accept(self) except -1:
        cdef int fd, one = 1, err
        cdef epoll_event ev
        cdef Connection conn
        while self.accepting:
            fd = accept4(self._lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)
            if fd < 0:
                err = errno
                if err == EINTR or err == ECONNABORTED:
                    continue
                if err == EAGAIN:
                    return 0
                log.error("%s; not accepting for %.1f s", _os_error("accept4"), ACCEPT_BACKOFF_S)
                if err == EMFILE or err == ENFILE or err == ENOBUFS or err == ENOMEM:
                    epoll_ctl(self._epfd, EPOLL_CTL_DEL, self._lfd, NULL)
                    self._accept_retry_at = _now() + ACCEPT_BACKOFF_S
                return 0
            if <Py_ssize_t>len(self._conns) >= self.max_connections:
                close(fd)
                self.rejected += 1
                log.warning("connection refused: %d connections open (max_connections)",
                            len(self._conns))
                continue
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one))
            conn = Connection.__new__(Connection)
            conn.id = self._next_id
            self._next_id += 1
            conn.fd = fd
            conn._reactor = self
            conn._out = []
            conn._writable = threading.Event()
            conn._writable.set()
            conn.peer = _peer_name(fd)
            conn._interest = EPOLLIN | EPOLLRDHUP
            memset(&ev, 0, sizeof(ev))
            ev.events = conn._interest
            ev.data.u64 = conn.id
            if epoll_ctl(self._epfd, EPOLL_CTL_ADD, fd, &ev) < 0:
                log.error(_os_error("epoll_ctl(ADD connection)"))
                close(fd)
                conn.fd = -1
                conn.closed = True
                continue
            self._conns[conn.id] = conn
            self.accepted += 1
            try:
                receiver = self._handler.connection_made(conn)
                conn._receiver = receiver
                conn._on_frame = receiver.frame_received
            except Exception:
                log.exception("connection_made failed; closing connection %d", conn.id)
                conn._teardown("server error in connection_made")
        return 0

    def _stop_accepting_py(self):
        if not self.accepting and self._listen_sock is None:
            return
        if self.accepting:
            epoll_ctl(self._epfd, EPOLL_CTL_DEL, self._lfd, NULL)
        self.accepting = False
        self._accept_retry_at = 0
        if self._listen_sock is not None:
            self._listen_sock.close()
            self._listen_sock = None
        self._lfd = -1

    def _stop_py(self):
        self._running = False

    cdef int _shutdown_all(self) except -1:
        cdef Connection conn
        self._stopped = True
        self._running = False
        self._stop_accepting_py()
        for conn in list(self._conns.values()):
            conn._teardown("server stopped")
        self._run_calls()
        self._notify()
        self._has_thread = False
        return 0


cdef str _peer_name(int fd):
    """host:port of the peer, via a dup so the socket module does the formatting."""
    cdef object s
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        return "?"
    try:
        addr = s.getpeername()
        return f"{addr[0]}:{addr[1]}"
    except OSError:
        return "?"
    finally:
        s.close()
