# Connection: one accepted socket, its input buffer, its outbound queue, its backpressure
# state. Included by _reactor.pyx (the threading contract is in its docstring).

@cython.final
cdef class Connection:
    """One accepted TCP connection. Created by the reactor; see the module doc."""

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

    def charge(self, double frames):
        """Take `frames` more from this connection's frame budget (any thread; the GIL
        orders it with the reactor's own spending). The session charges a request it
        refused, so a client whose frames can only be refused is read at a fraction of
        the rate a client whose frames are served gets. The debt stops at one second's
        worth, so an honest client recovers within a second of its last refusal."""
        cdef double rate = self._reactor.max_frames_per_second
        if rate <= 0.0 or frames <= 0.0:
            return
        self._tokens = max(-rate, self._tokens - frames)

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
        if (not self.paused and not self._throttled_until) or self._wr_shut:
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
        cdef Py_ssize_t want
        cdef Py_ssize_t budget = READ_BUDGET
        cdef int err
        cdef Reactor r = self._reactor
        self._in_read = True
        try:
            while not self.closed and budget > 0:
                if self._rcap - self._rlen < READ_MIN_FREE:
                    self._grow(self._rlen + READ_MIN_FREE)
                want = self._rcap - self._rlen
                n = recv(self.fd, self._rbuf + self._rlen, want, 0)
                if n > 0:
                    self.bytes_in += n
                    r.bytes_in += n
                    budget -= n
                    if self._wr_shut:
                        continue          # closing: the peer's input is read and dropped
                    self._rlen += n
                    self._extract()
                    if self.paused or self._throttled_until:
                        break             # backpressure or budget: the rest stays in the kernel
                    if n < want:
                        # a short read drained the socket: asking again would only
                        # return EAGAIN (one wasted syscall per wake-up); epoll is
                        # level-triggered and reports the next bytes
                        break
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
            if self._throttled_until:
                break                     # out of budget: the rest waits in the buffer
            if not self._spend():
                self._throttle()
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

    cdef bint _spend(self) except -1:
        """Take one frame from the budget: False when there is none left right now."""
        cdef double rate = self._reactor.max_frames_per_second
        cdef double now
        if rate <= 0:
            return True
        now = _now()                    # a vDSO call: tens of nanoseconds a frame
        self._tokens = min(rate, self._tokens + (now - self._refilled_at) * rate)
        self._refilled_at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    cdef int _throttle(self) except -1:
        """The budget is spent: stop reading until a few frames' worth has refilled (not
        one: a wake-up per frame would cost more than the frames)."""
        cdef Reactor r = self._reactor
        # until THROTTLE_FRAMES are available again, whatever debt charge() left
        self._throttled_until = _now() + max(
            THROTTLE_MIN_S, (THROTTLE_FRAMES - self._tokens) / r.max_frames_per_second)
        r.throttles += 1
        r._watched.add(self)
        self._update_interest()
        return 0

    cdef int _deliver_buffered(self) except -1:
        """Frames already in the read buffer, after the budget refilled (reactor thread)."""
        self._in_read = True
        try:
            self._extract()
        finally:
            self._in_read = False
        if self.closed:
            self._free_rbuf()
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
