"""The transport: TCP sockets on epoll, frames in and out, backpressure.

Owns: the listening socket, accepted connections, their read buffers and the
frame extraction (compiled, `_reactor.pyx`), the outbound queues flushed with
sendmsg(), the eventfd that wakes the reactor for sends from other threads,
the per-connection outbound cap with its pause/resume and stall timeout, and the
per-connection frame budget (which a receiver may `charge()` for frames it refused).

It knows frames only as length-prefixed byte strings: decoding, sessions and
what a frame means belong to `tryll_fast.server`. A receiver object per
connection (from `handler.connection_made(conn)`) gets `frame_received(payload)`,
`connection_lost(reason)` and `writing_resumed()` on the reactor thread.
"""
from tryll_fast.transport._reactor import MAX_FRAME, Connection, Reactor

__all__ = ["MAX_FRAME", "Connection", "Reactor"]
