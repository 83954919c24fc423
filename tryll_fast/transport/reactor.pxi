# Reactor: the epoll loop that owns every socket (accept, read, flush, wake, timers).
# Included by _reactor.pyx.

@cython.final
cdef class Reactor:
    """The event loop. `run()` on the thread that should own the sockets."""

    def __cinit__(self):
        self._epfd = -1
        self._evfd = -1
        self._lfd = -1

    def __init__(self, listen_sock, handler, *, Py_ssize_t high_water=4 << 20,
                 Py_ssize_t low_water=1 << 20, double stall_timeout=30.0,
                 Py_ssize_t max_connections=1024, bint direct_send=True,
                 double max_frames_per_second=0.0):
        """listen_sock: a bound, listening socket.socket (the reactor makes it
        non-blocking and owns it from now on). handler.connection_made(conn)
        returns the connection's receiver. max_frames_per_second: each connection's
        frame budget (a bucket of one second's worth, refilled continuously); a
        connection that spent it is not read until it has some again. 0: no budget."""
        cdef epoll_event ev
        if not 0 < low_water <= high_water:
            raise ValueError(f"need 0 < low_water ({low_water}) <= high_water ({high_water})")
        if stall_timeout <= 0:
            raise ValueError(f"stall_timeout must be > 0 s, got {stall_timeout}")
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        if max_frames_per_second < 0:
            raise ValueError(f"max_frames_per_second must be >= 0, got {max_frames_per_second}")
        self.max_frames_per_second = max_frames_per_second
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
            "framing_errors": self.framing_errors, "throttles": self.throttles,
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

    cdef bint _on_loop_thread(self) noexcept:
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

    cdef int _mark_dirty(self, Connection conn) except -1:
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
            if conn._wr_shut:
                deadline = conn._linger_until
            elif conn._throttled_until and not conn.paused:
                deadline = conn._throttled_until
            elif conn._throttled_until:
                deadline = min(conn._throttled_until, conn._paused_at + self.stall_timeout)
            else:
                deadline = conn._paused_at + self.stall_timeout
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
            elif conn._throttled_until and now < conn._throttled_until and not conn.paused:
                pass                      # its budget refills: watched until then
            elif conn._throttled_until and now >= conn._throttled_until:
                conn._throttled_until = 0
                conn._update_interest()
                conn._deliver_buffered()  # frames read before the budget ran out
                if not (conn.closed or conn._throttled_until or conn.paused):
                    self._watched.discard(conn)
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
            conn._tokens = self.max_frames_per_second
            conn._refilled_at = _now()
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
