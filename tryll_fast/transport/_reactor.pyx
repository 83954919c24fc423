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
closes the connection at once and sends nothing (docs/protocol.md).

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
# A connection out of frame budget is read again once this many frames' worth refilled,
# and not sooner than THROTTLE_MIN_S.
cdef double THROTTLE_FRAMES = 64.0
cdef double THROTTLE_MIN_S = 0.001
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


# The module is assembled from per-concern files, as uvloop assembles loop.pyx.
include "connection.pxi"
include "reactor.pxi"


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
