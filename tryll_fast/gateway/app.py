"""The pipeline's HTTP server: one aiohttp application on its own thread and event loop
(`tryll-gateway`), serving
- the WebSocket endpoint `/pipeline` (connection parameters in the query string), and
- Socket.IO on its default path `/socket.io/` (python-socketio's aiohttp mode; the same
  parameters in the handshake's query; events `text` and `msgpack`), and
- the Dialog Lab: the page at `/`, its files at `/lab/<file>` (the package's `lab/` folder)
  and the agent list it picks from at `/agents` (docs/pipeline.md, "The Dialog Lab").

Why a thread of its own (docs/architecture.md): the gateway is a second reactor. It parses
and writes its clients' messages and dispatches their requests into their sessions on its
own thread, as the reactor does for TCP, so the orchestrator loop keeps running only node
logic and a burst of pipeline traffic never delays a TCP agent's next node.

The server's graceful shutdown drives it through the Server's front-door hooks:
`stop_accepting()` first, then every session's connection is closed (each pipeline
connection sends `exit` and closes after its queue), then `stop()`.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import socketio
from aiohttp import WSMsgType, web

from tryll_fast.gateway import elements as el
from tryll_fast.gateway.config import PipelineConfig
from tryll_fast.gateway.connection import PipelineConnection
from tryll_fast.gateway.params import error_format, parse_connection_params
from tryll_fast.server.logs import fields

log = logging.getLogger("tryll_fast.gateway")

WEBSOCKET_PATH = "/pipeline"
MAX_MESSAGE_BYTES = 1 << 20          # one client message, as one TCP frame at most
START_TIMEOUT_S = 10.0
LAB_DIR = Path(__file__).with_name("lab")
# The Dialog Lab's files by name: a request names one of these or gets a 404, so no path
# (`..`, encoded slashes) can reach anything else. An AudioWorklet module must be served
# as JavaScript, which is why the types are spelled out rather than guessed.
LAB_TYPES = {".html": "text/html", ".css": "text/css", ".js": "text/javascript"}
LAB_FILES = {p.name: LAB_TYPES[p.suffix] for p in LAB_DIR.iterdir()
             if p.is_file() and p.suffix in LAB_TYPES} if LAB_DIR.is_dir() else {}


def _lab_response(name: str) -> web.Response:
    content_type = LAB_FILES.get(name)
    if content_type is None:
        raise web.HTTPNotFound(text=f"no file {name!r} in the Dialog Lab")
    # read per request (a few kB): an edited file shows on reload, no restart needed
    return web.Response(body=(LAB_DIR / name).read_bytes(), content_type=content_type,
                        charset="utf-8", headers={"Cache-Control": "no-cache"})


class WebSocketChannel:
    kind = "ws"

    def __init__(self, ws: web.WebSocketResponse, request: web.Request) -> None:
        self.ws = ws
        self.request = request

    async def send(self, data: str | bytes) -> None:
        if type(data) is str:
            await self.ws.send_str(data)
        else:
            await self.ws.send_bytes(data)

    async def close(self, code: int, reason: str) -> None:
        await self.ws.close(code=code, message=reason.encode()[:120])

    def abort(self) -> None:
        """Drop the TCP connection at once (a client that stopped reading never takes a
        close frame)."""
        transport = self.request.transport
        if transport is not None:
            transport.abort()


class SocketIOChannel:
    kind = "sio"

    def __init__(self, sio: socketio.AsyncServer, sid: str) -> None:
        self.sio = sio
        self.sid = sid

    async def send(self, data: str | bytes) -> None:
        await self.sio.emit("text" if type(data) is str else "msgpack", data, to=self.sid)

    async def close(self, code: int, reason: str) -> None:
        await self.sio.disconnect(self.sid)

    def abort(self) -> None:
        asyncio.get_running_loop().create_task(self.sio.disconnect(self.sid))


class Gateway:
    """See the module docstring. `start()` binds and returns (host, port)."""

    def __init__(self, server, config: PipelineConfig, host: str = "127.0.0.1",
                 port: int = 9101) -> None:
        self.server = server
        self.config = config
        self.host = host
        self.port = port
        self.loop = asyncio.new_event_loop()
        self.connections: set[PipelineConnection] = set()
        self._sio_connections: dict[str, PipelineConnection] = {}
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._address: tuple[str, int] | None = None
        self._thread = threading.Thread(target=self._run, name="tryll-gateway", daemon=True)
        self.sio = socketio.AsyncServer(async_mode="aiohttp", always_connect=True,
                                        async_handlers=False, max_http_buffer_size=
                                        MAX_MESSAGE_BYTES, logger=False, engineio_logger=False,
                                        cors_allowed_origins=self.origin_allowed)
        self._sio_handlers()

    # ---- lifecycle (any thread) ----

    def start(self) -> tuple[str, int]:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._listen(), self.loop).result(START_TIMEOUT_S)
        except BaseException:
            self._stop_loop()
            raise
        self.server.add_front_door(self)
        log.info("pipeline listening", extra=fields(
            host=self.address[0], port=self.address[1], websocket=WEBSOCKET_PATH,
            socketio="/socket.io/", agents=list(self.config.agents),
            config=self.config.source))
        return self.address

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise RuntimeError("the gateway is not listening")
        return self._address

    @property
    def connection_count(self) -> int:
        return len(self.connections)

    def origin_allowed(self, origin: str | None) -> bool:
        """May a page of this origin connect? A client that sends no Origin is no browser
        page (a game, a script): yes. A page: the pipeline's own (its address, or a loopback
        name with its port), or one `pipeline.allowed_origins` names. Comparing the Origin
        with the request's Host would let any site in on a name that resolves to
        127.0.0.1 (DNS rebinding), so the own origins are a fixed list."""
        if not origin:
            return True
        allowed = self.server.config.pipeline_allowed_origins
        if "*" in allowed:
            return True
        origin = origin.rstrip("/").lower()
        if origin in {o.rstrip("/").lower() for o in allowed}:
            return True
        host, port = self.address
        names = {"localhost", "127.0.0.1", "[::1]"}
        if host not in ("0.0.0.0", "::", ""):
            names.add(f"[{host}]" if ":" in host else host)
        return origin in {f"{scheme}://{name}:{port}" for scheme in ("http", "https")
                          for name in names}

    def in_loop(self) -> bool:
        return threading.current_thread() is self._thread

    def stop_accepting(self) -> None:
        if self._site is not None and self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._site.stop(), self.loop).result(5)

    def stop(self) -> None:
        """Close what is left and end the thread (after the server closed the sessions)."""
        if not self._thread.is_alive():
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(15)
        except Exception:
            log.exception("stopping the pipeline server failed")
        self._stop_loop()

    async def _close(self) -> None:
        await self.sio.shutdown()                 # engine.io's ping task
        if self._runner is not None:
            await self._runner.cleanup()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _stop_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    async def _listen(self) -> None:
        app = web.Application(client_max_size=MAX_MESSAGE_BYTES)
        app.router.add_get(WEBSOCKET_PATH, self._websocket)
        app.router.add_get("/", self._lab_page)
        app.router.add_get("/lab/{name}", self._lab_file)
        app.router.add_get("/agents", self._agents)
        app.router.add_get("/api/memory", self._memory)
        self.sio.attach(app)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.host, self.port)
        await self._site.start()
        sock = self._site._server.sockets[0]         # the bound port (port 0 = any)
        self._address = tuple(sock.getsockname()[:2])
        self.loop.create_task(self._watch_stalls())

    async def _watch_stalls(self) -> None:
        """Close connections paused longer than `transport.stall_timeout_ms`, as the
        reactor does for TCP: a client that stopped reading holds its agent's turn."""
        limit = self.server.config.transport_stall_timeout_ms / 1000.0
        period = min(1.0, limit / 4)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for conn in list(self.connections):
                if conn.paused and now - conn.paused_at >= limit:
                    conn.stalled(now - conn.paused_at)

    # ---- the Dialog Lab (loop) ----

    async def _lab_page(self, request: web.Request) -> web.Response:
        return _lab_response("index.html")

    async def _lab_file(self, request: web.Request) -> web.Response:
        return _lab_response(request.match_info["name"])

    async def _agents(self, request: web.Request) -> web.Response:
        """The agents a connection may name, for the Lab's picker. `listens` reads an
        optional `listen` table (server-side recognition) so this works with or without
        one in PipelineAgent."""
        agents = [{"name": a.name, "description": a.description,
                   "speaks": a.voice is not None,
                   "listens": getattr(a, "listen", None) is not None,
                   "actions": sorted({"#" + k for k in (*a.actions, *self.config.actions)})}
                  for a in self.config.agents.values()]
        default = self.config.default_agent
        return web.json_response({"agents": agents,
                                  "default": default.name if default else None},
                                 headers={"Cache-Control": "no-cache"})

    async def _memory(self, request: web.Request) -> web.Response:
        """The server's memory, every session's included: the same collector and the same
        rows as GetMemoryConsumption, as JSON (enum members by name)."""
        from tryll_fast.server import memory
        server = self.server
        snap = await asyncio.to_thread(memory.snapshot, server, 0, server.describe_key)
        return web.json_response(memory.as_json(snap), headers={"Cache-Control": "no-cache"})

    # ---- connections (loop) ----

    def _open(self, channel, query: dict[str, Any], peer: str) -> PipelineConnection | None:
        """A connection for these parameters, or None after queueing an error element and
        a close (a bad parameter, or a server shutting down)."""
        problem = None
        try:
            params = parse_connection_params(query, self.config)
        except el.ElementError as exc:
            problem = (exc.kind, exc.message, 1008)
        if problem is None and self.server.shutting_down:
            problem = ("ServerShuttingDown", "the server is shutting down", 1001)
        if problem is not None:
            fmt, version = error_format(query)
            element = el.output("error", None, None, source="Pipeline", type=problem[0],
                                message=problem[1], description="The connection closes.",
                                isRecoverable=False)
            log.info("pipeline connection refused", extra=fields(peer=peer, error=problem[1]))
            self.loop.create_task(self._refuse(channel, el.encode(element, fmt, version),
                                               problem[2], problem[1]))
            return None
        conn = PipelineConnection(self, channel, params, peer)
        self.connections.add(conn)
        conn.start()
        return conn

    @staticmethod
    async def _refuse(channel, data: str | bytes, code: int, reason: str) -> None:
        try:
            await channel.send(data)
            await channel.close(code, reason)
        except Exception:          # the client left first
            pass

    def connection_closed(self, conn: PipelineConnection) -> None:
        self.connections.discard(conn)
        if conn.channel.kind == "sio":
            self._sio_connections.pop(conn.channel.sid, None)

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if not self.origin_allowed(origin):
            log.warning("pipeline connection refused: origin not allowed", extra=fields(
                peer=request.remote or "?", origin=origin))
            return web.Response(status=403, text=f"origin {origin} may not open pipeline "
                                "connections (setting pipeline.allowed_origins)\n")
        ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_BYTES)
        await ws.prepare(request)
        channel = WebSocketChannel(ws, request)
        conn = self._open(channel, dict(request.query), request.remote or "?")
        if conn is None:
            async for _ in ws:         # until the refusal's close completes
                pass
            return ws
        reason = "peer closed"
        try:
            async for msg in ws:
                if msg.type == WSMsgType.TEXT:
                    conn.received(msg.data)
                elif msg.type == WSMsgType.BINARY:
                    conn.received(msg.data, binary=True)
                elif msg.type == WSMsgType.ERROR:
                    reason = f"websocket error: {ws.exception()}"
        except Exception as exc:
            reason = f"websocket error: {exc!r}"
            log.exception("pipeline connection %s failed", conn.id)
        finally:
            conn.lost(reason)
        return ws

    def _sio_handlers(self) -> None:
        sio = self.sio

        @sio.event
        async def connect(sid, environ, auth=None):
            query = dict(parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True))
            conn = self._open(SocketIOChannel(sio, sid), query,
                              environ.get("REMOTE_ADDR") or "?")
            if conn is not None:
                self._sio_connections[sid] = conn
            return True

        @sio.event
        async def disconnect(sid, reason=None):
            conn = self._sio_connections.pop(sid, None)
            if conn is not None:
                conn.lost(f"socket.io: {reason or 'disconnected'}")

        @sio.on("text")
        async def on_text(sid, data):
            conn = self._sio_connections.get(sid)
            if conn is None:
                return
            if isinstance(data, dict) and conn.params.input_format == el.JSON:
                data = json.dumps(data)         # a JSON client may emit the object itself
            if not isinstance(data, str):
                conn.error("Socket", "MalformedElement",
                           f"the text event carries a string, not {type(data).__name__}")
                return
            if conn.params.input_format == el.MSGPACK:
                conn.error("Socket", "MalformedElement", "this connection's inputFormat is "
                                                         "MSGPACK: send the msgpack event")
                return
            conn.received(data)

        @sio.on("msgpack")
        async def on_msgpack(sid, data):
            conn = self._sio_connections.get(sid)
            if conn is None:
                return
            if not isinstance(data, (bytes, bytearray)):
                conn.error("Socket", "MalformedElement",
                           f"the msgpack event carries binary data, not {type(data).__name__}")
                return
            if conn.params.input_format != el.MSGPACK:
                conn.error("Socket", "MalformedElement",
                           f"this connection's inputFormat is {conn.params.input_format}: send "
                           "the text event")
                return
            conn.received(bytes(data), binary=True)
