"""The baseline a user would otherwise write: the same Server, sessions, codec and handlers,
on an asyncio + uvloop transport instead of our epoll reactor.

`UvloopServer` replaces only `Server._listen()`: an event loop thread runs
`loop.create_server()`, and each connection is an asyncio.Protocol that offers the
Connection surface the sessions use (send from any thread, paused / wait_writable, close,
abort). Frames are split with the same compiled FrameSplitter.

Writes are batched the way a competent asyncio programmer would batch them, so the
baseline is not slowed by a syscall per frame:
- replies made on the loop thread while one `data_received` call is handled are collected
  and written with one `transport.writelines()` when it returns (uvloop writes at once when
  nothing is queued, so one write per reply would be one send syscall per reply); replies
  made on the loop thread at any other time are written at once;
- frames sent from other threads go into a list under a lock, and only the first frame of
  a burst schedules `loop.call_soon_threadsafe`; that callback drains the whole list with
  one `writelines()`. The list counts towards backpressure: `paused` is set when the
  transport's buffer is over the high-water mark or when the list alone is, so a producer
  that honours `paused` cannot grow it without bound while the loop is busy. A send on
  the loop thread while the list holds frames first writes what that thread batched, then
  the list, so frames keep the order of their send calls, as on our reactor's one queue.
"""
from __future__ import annotations

import asyncio
import itertools
import threading

import uvloop

from tryll_fast import codec
from tryll_fast.server import Server


class AsyncioConnection(asyncio.Protocol):
    def __init__(self, transport_owner: "UvloopTransport", conn_id: int) -> None:
        self._owner = transport_owner
        self._loop = transport_owner.loop
        self._loop_thread = transport_owner.thread_id
        self.id = conn_id
        self.peer = "?"
        self.transport: asyncio.Transport | None = None
        self.receiver = None
        self.splitter = codec.FrameSplitter()
        self.paused = False
        self.closed = False
        self._closing = False
        self._writable = threading.Event()
        self._writable.set()
        self.close_reason = ""
        # replies made on the loop thread inside data_received, written when it returns
        self._batch: list[bytes] | None = None
        # frames from other threads; the lock guards them and every pause transition,
        # and is never held across a transport call (those may call pause_writing)
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._pending_full = False        # the list alone reached the high-water mark
        self._transport_paused = False    # between pause_writing and resume_writing
        self._high = transport_owner.server.config.transport_send_queue_high_bytes

    # ---- the Connection surface ----

    @property
    def closing(self) -> bool:
        return self._closing or self.closed

    @property
    def queued_bytes(self) -> int:
        t = self.transport
        if t is None or self.closed:
            return 0
        return t.get_write_buffer_size() + self._pending_bytes

    def send(self, frame: bytes) -> bool:
        if self.closed or self._closing:
            return False
        if threading.get_ident() == self._loop_thread:
            if self._pending:
                self._write_earlier()
            if self._batch is not None:
                self._batch.append(frame)
            else:
                self.transport.write(frame)
            return True
        with self._lock:
            self._pending.append(frame)
            self._pending_bytes += len(frame)
            if not self._pending_full and self._pending_bytes >= self._high:
                self._pending_full = True
                self._set_paused(True)
            if len(self._pending) > 1:
                return True               # the first frame of this burst scheduled a flush
        self._loop.call_soon_threadsafe(self._flush_pending)
        return True

    def _write_earlier(self) -> None:
        """On the loop thread, before a send there while other threads' frames wait: write
        what this thread batched, then those frames, so both keep their send order."""
        batch = self._batch
        if batch:
            self.transport.writelines(batch)
            batch.clear()
        self._flush_pending()

    def _flush_pending(self) -> None:
        with self._lock:
            frames, self._pending = self._pending, []
            nbytes = self._pending_bytes
        if frames and not self.closed and not self.transport.is_closing():
            self.transport.writelines(frames)
        resumed = False
        with self._lock:
            # subtracted only now that the transport holds them, so queued_bytes and the
            # high-water check never miss them
            self._pending_bytes -= nbytes
            if self._pending_full and self._pending_bytes < self._high:
                self._pending_full = False
                resumed = self._set_paused(self._transport_paused)
        if resumed and not self.closed:
            self.receiver.writing_resumed()

    def _set_paused(self, paused: bool) -> bool:
        """With self._lock held. True when this call resumed writing."""
        if paused == self.paused:
            return False
        self.paused = paused
        if paused:
            self._writable.clear()
        else:
            self._writable.set()
        return not paused

    def wait_writable(self, timeout=None) -> bool:
        if self.closed:
            return False
        if not self.paused:
            return True
        return self._writable.wait(timeout) and not self.closed

    def close(self) -> None:
        self._closing = True
        self._loop.call_soon_threadsafe(self._close)

    def _close(self) -> None:
        if self.transport is not None:
            self._flush_pending()         # frames accepted before close() are still sent
            self.transport.close()

    def abort(self, reason: str = "aborted") -> None:
        self.close_reason = reason
        self._loop.call_soon_threadsafe(lambda: self.transport and self.transport.abort())

    # ---- asyncio.Protocol ----

    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
        cfg = self._owner.server.config
        transport.set_write_buffer_limits(high=cfg.transport_send_queue_high_bytes,
                                          low=cfg.transport_send_queue_low_bytes)
        self._owner.connections.add(self)
        self.receiver = self._owner.server.connection_made(self)

    def data_received(self, data: bytes) -> None:
        try:
            payloads = self.splitter.feed(data)
        except codec.FramingError as exc:
            self.close_reason = f"framing error: {exc}"
            self.transport.abort()
            return
        self._batch = batch = []
        try:
            for payload in payloads:
                self.receiver.frame_received(payload)
        finally:
            self._batch = None
            if batch and not self.transport.is_closing():
                self.transport.writelines(batch)

    def pause_writing(self) -> None:
        with self._lock:
            self._transport_paused = True
            self._set_paused(True)

    def resume_writing(self) -> None:
        with self._lock:
            self._transport_paused = False
            resumed = self._set_paused(self._pending_full)
        if resumed:
            self.receiver.writing_resumed()

    def connection_lost(self, exc) -> None:
        self.closed = True
        with self._lock:
            # frames from other threads never written are dropped; their bytes stay counted
            # until a flush subtracts them, as the flush that swaps the list out expects
            self._pending.clear()
        self._writable.set()
        self._owner.connections.discard(self)
        if not self.close_reason:
            self.close_reason = "peer closed" if exc is None else str(exc)
        self.receiver.connection_lost(self.close_reason)


class UvloopTransport:
    """The transport surface Server expects, on a uvloop event loop thread."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = uvloop.new_event_loop()
        self.connections: set[AsyncioConnection] = set()
        self._ids = itertools.count(1)
        self._listener = None
        self._ready = threading.Event()
        self.thread_id = 0
        self.thread = threading.Thread(target=self._run, name="uvloop", daemon=True)
        self.thread.start()
        self._ready.wait()
        cfg = server.config
        fut = asyncio.run_coroutine_threadsafe(self.loop.create_server(
            lambda: AsyncioConnection(self, next(self._ids)), cfg.host, cfg.port, backlog=512),
            self.loop)
        self._listener = fut.result(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.thread_id = threading.get_ident()
        self._ready.set()
        self.loop.run_forever()

    @property
    def address(self):
        if self._listener is None or not self._listener.sockets:
            return None
        return self._listener.sockets[0].getsockname()[:2]

    @property
    def connection_count(self) -> int:
        return len(self.connections)

    def stop_accepting(self) -> None:
        self.loop.call_soon_threadsafe(self._listener.close)

    def stop(self) -> None:
        def _stop() -> None:
            for conn in list(self.connections):
                conn.transport.abort()
            self.loop.call_soon(self.loop.stop)
        self.loop.call_soon_threadsafe(_stop)

    def stats(self) -> dict:
        return {"connections": len(self.connections)}


class UvloopServer(Server):
    def _listen(self):
        transport = UvloopTransport(self)
        return transport, transport.thread
