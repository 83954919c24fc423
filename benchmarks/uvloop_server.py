"""The baseline a user would otherwise write: the same Server, sessions, codec and handlers,
on an asyncio + uvloop transport instead of our epoll reactor.

`UvloopServer` replaces only `Server._listen()`: an event loop thread runs
`loop.create_server()`, and each connection is an asyncio.Protocol that offers the
Connection surface the sessions use (send from any thread, paused / wait_writable, close,
abort). Frames are split with the same compiled FrameSplitter. Sends from other threads go
through `loop.call_soon_threadsafe`, the standard way to hand work to a loop.
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

    # ---- the Connection surface ----

    @property
    def closing(self) -> bool:
        return self._closing or self.closed

    @property
    def queued_bytes(self) -> int:
        t = self.transport
        return t.get_write_buffer_size() if t is not None and not self.closed else 0

    def send(self, frame: bytes) -> bool:
        if self.closed or self._closing:
            return False
        if threading.get_ident() == self._loop_thread:
            self.transport.write(frame)
        else:
            self._loop.call_soon_threadsafe(self._write, frame)
        return True

    def _write(self, frame: bytes) -> None:
        if not self.closed:
            self.transport.write(frame)

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
        for payload in payloads:
            self.receiver.frame_received(payload)

    def pause_writing(self) -> None:
        self.paused = True
        self._writable.clear()

    def resume_writing(self) -> None:
        self.paused = False
        self._writable.set()
        self.receiver.writing_resumed()

    def connection_lost(self, exc) -> None:
        self.closed = True
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
