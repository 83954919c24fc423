# The transport's C-level surface: Connection (and the Reactor it belongs to), so other
# compiled modules (the token stream) queue frames with a C call, not a Python one.
cimport cython
from libc.stdint cimport uint32_t, uint64_t

from tryll_fast.transport.system cimport epoll_event, pthread_t

cdef enum:
    MAX_EVENTS = 256                # epoll events taken per wakeup

cdef class Reactor


@cython.final
cdef class Connection:
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
    cdef double _tokens               # frames it may still deliver now (frame budget)
    cdef double _refilled_at          # when _tokens was last topped up
    cdef double _throttled_until      # > 0: budget spent, not read until then
    cdef object _writable             # threading.Event, set while not paused
    cdef readonly str close_reason
    # counters
    cdef readonly uint64_t frames_in
    cdef readonly uint64_t frames_out
    cdef readonly uint64_t bytes_in
    cdef readonly uint64_t bytes_out

    cpdef bint send(self, object frame) except -1
    cdef int _enqueue(self, bytes frame, Py_ssize_t already) except -1
    cdef int _update_interest(self) except -1
    cdef int _flush(self) except -1
    cdef int _resume(self) except -1
    cdef int _close(self) except -1
    cdef int _shut_write(self) except -1
    cdef int _grow(self, Py_ssize_t need) except -1
    cdef int _on_readable(self) except -1
    cdef int _extract(self) except -1
    cdef bint _spend(self) except -1
    cdef int _throttle(self) except -1
    cdef int _deliver_buffered(self) except -1
    cdef int _shrink(self) except -1
    cdef void _free_rbuf(self) noexcept
    cdef int _teardown(self, str reason) except -1


@cython.final
cdef class Reactor:
    cdef int _epfd
    cdef int _evfd
    cdef int _lfd
    cdef object _handler
    cdef dict _conns                  # id -> Connection
    cdef object _listen_sock          # keeps the Python socket object (and its fd) alive
    cdef list _calls                  # (fn, args) from call_soon
    cdef list _lost                   # torn-down connections owed connection_lost()
    cdef list _resumed                # connections owed writing_resumed()
    cdef set _watched                 # paused or lingering connections (have deadlines)
    cdef list _dirty                  # connections with frames to flush
    cdef uint64_t _next_id
    cdef pthread_t _thread
    cdef epoll_event _events[MAX_EVENTS]
    cdef bint _has_thread
    cdef bint _wake_pending
    cdef bint _running
    cdef bint _stopped
    cdef readonly bint accepting
    cdef double _accept_retry_at
    # settings
    cdef readonly Py_ssize_t high_water
    cdef readonly Py_ssize_t low_water
    cdef readonly double stall_timeout
    cdef readonly Py_ssize_t max_connections
    cdef readonly bint direct_send
    cdef readonly double max_frames_per_second     # per connection; 0 = no budget
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
    cdef readonly uint64_t throttles

    cdef bint _on_loop_thread(self) noexcept
    cdef int _wake(self) except -1
    cdef int _drain_wake(self) except -1
    cdef int _mark_dirty(self, Connection conn) except -1
    cdef int _watch(self, Connection conn) except -1
    cdef int _flush_dirty(self) except -1
    cdef int _run_calls(self) except -1
    cdef int _notify(self) except -1
    cdef int _timeout_ms(self) except? -2
    cdef int _check_deadlines(self) except -1
    cdef int _add_listener(self) except -1
    cdef int _accept(self) except -1
    cdef int _shutdown_all(self) except -1
