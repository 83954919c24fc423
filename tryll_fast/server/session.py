"""A session: one connection's state, its dispatch, and everything it owns.

The Session is the transport's receiver for its connection: `frame_received` runs on the
reactor thread once per frame, decodes it (verify-then-view, in C), finds the route by the
union tag and calls the handler. Replies go through `send_reply` / `send_error`, from any
thread. Work that blocks (model loads, memory snapshots) runs on the session's lane, one
request at a time in arrival order, on the server's worker pool; long work (downloads,
streams, turns) is an Operation, which shutdown waits for and teardown cancels.

Teardown (`connection_lost`) frees everything the session owns: operations are cancelled,
its model pins and throttle contribution are dropped, and so are its agents, storages and
voice inputs, which register here the same way.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from tryll_fast import codec
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.knowledge import SessionStorages
from tryll_fast.knowledge.embedded import SessionEmbedded
from tryll_fast.knowledge.mutable import SessionMemory
from tryll_fast.server.logs import fields

if TYPE_CHECKING:
    from tryll_fast.server.server import Server

log = logging.getLogger("tryll_fast.server.session")

# A lane is paced only once it owes this much CPU: a timer for every small job would cost
# more than the pacing saves.
PACE_MIN_DEBT_S = 0.01


class Operation:
    """Long-running work a session started (a download, a stream, a turn).

    `cancel()` asks it to stop (idempotent, any thread); the work calls `finish()` exactly
    once when it is over, whatever happened.
    """

    __slots__ = ("session", "kind", "name", "_cancel", "cancelled", "done")

    def __init__(self, session: "Session", kind: str, name: str,
                 cancel: Callable[[], None] | None) -> None:
        self.session = session
        self.kind = kind
        self.name = name
        self._cancel = cancel
        self.cancelled = False
        self.done = threading.Event()

    def cancel(self) -> None:
        if self.cancelled or self.done.is_set():
            return
        self.cancelled = True
        if self._cancel is not None:
            try:
                self._cancel()
            except Exception:
                log.exception("cancelling %s %s failed", self.kind, self.name)

    def finish(self) -> None:
        if self.done.is_set():
            return
        self.done.set()
        self.session._operation_done(self)

    def __repr__(self) -> str:
        return f"<Operation {self.kind} {self.name!r} session={self.session.id}>"


class SerialLane:
    """Runs a session's blocking requests one at a time, in arrival order, on a shared pool.

    So LoadModel then UnloadModel from one client happen in that order, while other
    sessions' requests run in parallel on the other pool threads.

    Pacing: the CPU its jobs take on their pool thread is charged to a bucket of
    `cpu_burst_s` refilled at `cpu_share` of a core. When the bucket is in debt and
    `contended()` says another session has a turn running, the next job waits until the
    debt is repaid (at most cpu_burst_s / cpu_share), on a timer, with the pool thread given
    back; a job is never interrupted. A client looping on requests then takes at most that
    share from the cores the other sessions' turns run on (docs/configuration.md, "Bounded
    work per session").
    """

    def __init__(self, pool, *, cpu_share: float = 0.0, cpu_burst_s: float = 1.0,
                 contended: Callable[[], bool] = lambda: False) -> None:
        self._pool = pool
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._lock = threading.Lock()
        self._running = False
        self.high_water = 0             # the most jobs ever waiting at once (dev stats)
        self._share = cpu_share
        self._burst = cpu_burst_s
        self._credit = cpu_burst_s      # CPU seconds it may still use before it is paced
        self._refilled_at = time.monotonic()
        self._contended = contended
        self.paced = 0                  # times a job waited for the lane's share (dev stats)
        self.paced_s = 0.0              # and the seconds it was made to wait in all

    def __len__(self) -> int:
        """Jobs waiting (not the one running)."""
        return len(self._queue)

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._queue.append(job)
            if len(self._queue) > self.high_water:
                self.high_water = len(self._queue)
            if self._running:
                return
            self._running = True
        self._pool.submit(self._drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._running = False
                    return
                job = self._queue.popleft()
            started = time.thread_time()
            try:
                job()
            except Exception:
                log.exception("session lane job failed")
            if self._share <= 0.0:
                continue
            wait = self._charge(time.thread_time() - started)
            if wait > 0.0 and self._contended():
                with self._lock:
                    if not self._queue:
                        self._running = False
                        return
                self.paced += 1
                self.paced_s += wait
                timer = threading.Timer(wait, self._resume)
                timer.daemon = True
                timer.start()
                return

    def _charge(self, used: float) -> float:
        """Charge `used` CPU seconds; how long the next job should wait (0: none)."""
        now = time.monotonic()
        credit = min(self._burst, self._credit + (now - self._refilled_at) * self._share)
        self._credit = max(-max(self._burst, PACE_MIN_DEBT_S), credit - used)
        self._refilled_at = now
        if self._credit > -PACE_MIN_DEBT_S:
            return 0.0
        return -self._credit / self._share

    def _resume(self) -> None:
        try:
            self._pool.submit(self._drain)
        except RuntimeError:            # the pool is shut down: finish the queue here
            self._drain()


class Session:
    """The receiver of one connection; see the module docstring."""

    def __init__(self, server: "Server", conn) -> None:
        self.server = server
        self.conn = conn
        self.id = 0                     # assigned by CreateSession; 0 = not created yet
        self.locale = ""
        self.game_name = ""             # CreateSessionRequest.game_name, for the logs
        self.engine_hints: tuple[tuple[int, int], ...] = ()
        self.placement_hints: dict[str, int] = {}
        self.throttle: float | None = None
        self.closed = False
        self.close_reason = ""
        self.pins: set[str] = set()     # models this session pinned with LoadModel
        self.agents: dict[int, Any] = {}           # agent_id -> workflow Agent
        self.destroyed_agents: set[int] = set()    # for 3002 (vs 3001 for unknown ids)
        self.voice_inputs: dict[int, Any] = {}     # voice_input_id -> VoiceInput
        # string and embedded string storages share the session's names (7004 across them)
        cfg = server.config
        self.strings = SessionStorages(server.storage_files,
                                       other_names=lambda: self.embedded.by_name,
                                       max_storages=cfg.session_max_string_storages,
                                       max_chars=cfg.session_max_string_storage_chars)
        self.embedded = SessionEmbedded(server.store_files, server.models,
                                        other_names=lambda: self.strings.by_name,
                                        max_storages=cfg.session_max_embedded_storages)
        self.memory = SessionMemory(server.models,      # mutable knowledge bases
                                    max_stores=cfg.session_max_mutable_kbs)
        self.operations: set[Operation] = set()
        self._lock = threading.Lock()
        # callback -> how many registrations want it (one engine serves many turns)
        self._resume_callbacks: dict[Callable[[], None], int] = {}
        self.lane = SerialLane(
            server.workers, cpu_share=server.config.session_lane_cpu_share,
            cpu_burst_s=server.config.session_lane_cpu_burst_ms / 1000.0,
            contended=lambda: not self.closed and server.turns_elsewhere(self))
        self._routes = server.routes
        # a request refused on arrival costs its connection more of its frame budget than
        # one served; only the TCP transport has a budget (docs/configuration.md, "Bounded
        # work per session")
        self._refused_cost = server.config.transport_refused_frame_cost
        self._charge = getattr(conn, "charge", None) if self._refused_cost > 0 else None

    @property
    def created(self) -> bool:
        return self.id != 0

    # ---- transport callbacks (reactor thread) ----

    def frame_received(self, payload: bytes) -> None:
        try:
            msg = codec.decode(payload)
        except codec.CodecError as exc:                 # 5001 / 5002, the connection stays
            self._refused()
            self.fail(codec.peek_request_id(payload), exc)
            return
        route = self._routes[msg.body_type]
        body = msg.body
        if route is None:
            self._refused()
            if body is None:
                self.send_error(0, ErrorCode.MalformedMessage,
                                "malformed message: the Message has no body")
            else:
                self.send_error(getattr(body, "request_id", 0), ErrorCode.UnknownMessageType,
                                f"{type(body).__name__} is a server-to-client message; "
                                "a client cannot send it")
            return
        if body is None:                # a known tag whose table is absent: nothing to serve
            self._refused()
            self.send_error(0, ErrorCode.MalformedMessage,
                            f"malformed message: Message.body_type is {route.name} but the "
                            "body itself is absent")
            return
        if self.id == 0 and route.before_session != "serve":
            if route.before_session == "reject" and not route.silent:
                self._refused()
                self.send_error(body.request_id, ErrorCode.SessionNotReady,
                                f"{route.name} before CreateSessionRequest: every connection "
                                "must create its session first")
            return
        if self.server.shutting_down and not route.during_shutdown:
            if not route.silent:
                self.send_error(body.request_id, ErrorCode.ServerShuttingDown,
                                f"{route.name} refused: the server is shutting down")
            return
        try:
            if route.lane:
                self.run_blocking(body.request_id, route.name, lambda: route.fn(self, body),
                                  getattr(body, "agent_id", 0))
                return
            reply = route.fn(self, body)
        except Exception as exc:
            self._refused()
            self.fail(getattr(body, "request_id", 0), exc, route.name,
                      getattr(body, "agent_id", 0))
        else:
            if reply is not None:
                self.send_reply(reply)

    def _refused(self) -> None:
        if self._charge is not None:
            self._charge(self._refused_cost)

    def writing_resumed(self) -> None:
        with self._lock:
            callbacks = list(self._resume_callbacks)
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("resume callback failed")

    def connection_lost(self, reason: str) -> None:
        self.closed = True
        self.close_reason = reason
        self.server.session_closed(self)

    # ---- replies (any thread) ----

    def send_reply(self, body) -> bool:
        """Encode and queue one reply; a reply over 1 MiB becomes 5003 for its request."""
        try:
            frame = codec.encode(body)
        except codec.FrameTooLarge as exc:
            return self.send_error(getattr(body, "request_id", 0), ErrorCode.FrameTooLarge,
                                   f"the reply does not fit in one frame: {exc}")
        except codec.EncodeError as exc:
            log.error("could not encode %s: %s", type(body).__name__, exc,
                      extra=fields(session=self.id))
            return self.send_error(getattr(body, "request_id", 0), ErrorCode.InternalError,
                                   f"internal error: could not encode the reply: {exc}")
        return self.conn.send(frame)

    def fail(self, request_id: int, exc: BaseException, what: str = "the request",
             agent_id: int = 0) -> bool:
        """The one mapping from an exception to ErrorResponse: a TryllError sends its own
        code and message; anything else is a bug, logged with its traceback and answered
        with 2006 InternalError (the session and the connection carry on)."""
        if isinstance(exc, TryllError):
            return self.send_error(request_id, exc.code, exc.message, agent_id)
        log.error("%s failed", what, exc_info=exc,
                  extra=fields(session=self.id, connection=self.conn.id))
        return self.send_error(request_id, ErrorCode.InternalError,
                               f"internal error while handling {what}: {exc!r}", agent_id)

    def send_error(self, request_id: int, code: int, message: str, agent_id: int = 0) -> bool:
        """agent_id: the agent an agent-scoped request addressed (0 for session-level)."""
        frame = codec.encode(codec.ErrorResponse(request_id=request_id, code=int(code),
                                                 message=_fit(message), agent_id=agent_id))
        return self.conn.send(frame)

    def send_frame(self, frame: bytes) -> bool:
        return self.conn.send(frame)

    # ---- work that outlives the frame ----

    def run_blocking(self, request_id: int, what: str, fn: Callable[[], Any],
                     agent_id: int = 0) -> None:
        """Run fn() on this session's lane; what it returns is the reply (None = no reply).
        What it raises becomes ErrorResponse for request_id (and agent_id), by fail().
        Past `session.max_queued_requests` waiting: 2008, nothing queued (a client that
        loops on a request cannot claim unbounded work)."""
        cap = self.server.config.session_max_queued_requests
        if len(self.lane) >= cap:
            raise TryllError(ErrorCode.SessionLimitReached,
                             f"{what} refused: {len(self.lane)} requests of this session are "
                             f"waiting, the most session.max_queued_requests allows ({cap})")
        op = self.begin_operation("request", what)

        def job() -> None:
            try:
                if self.closed:
                    return
                reply = fn()
            except Exception as exc:
                self.fail(request_id, exc, what, agent_id)
            else:
                if reply is not None:
                    self.send_reply(reply)
            finally:
                op.finish()

        self.lane.submit(job)

    def begin_operation(self, kind: str, name: str,
                        cancel: Callable[[], None] | None = None) -> Operation:
        op = Operation(self, kind, name, cancel)
        with self._lock:
            self.operations.add(op)
        self.server.operation_started(op)
        if self.closed:
            op.cancel()
        return op

    def _operation_done(self, op: Operation) -> None:
        with self._lock:
            self.operations.discard(op)
        self.server.operation_finished(op)

    def on_resume(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call `callback` on the reactor thread whenever the connection stops being
        paused (backpressure); returns a function that drops this registration (the
        callback stays while other registrations want it)."""
        with self._lock:
            self._resume_callbacks[callback] = self._resume_callbacks.get(callback, 0) + 1
        done = []

        def unregister() -> None:
            with self._lock:
                if done:
                    return
                done.append(True)
                left = self._resume_callbacks.get(callback, 0) - 1
                if left > 0:
                    self._resume_callbacks[callback] = left
                else:
                    self._resume_callbacks.pop(callback, None)
        return unregister

    def owned(self) -> dict[str, int]:
        """What this session holds right now (teardown must bring each to 0)."""
        with self._lock:
            ops = collections.Counter(op.kind for op in self.operations)
        return {"operations": sum(ops.values()), "downloads": ops.get("download", 0),
                "streams": ops.get("stream", 0), "turns": ops.get("turn", 0),
                "agents": len(self.agents), "pins": len(self.pins),
                "voice_inputs": len(self.voice_inputs),
                "string_storages": len(self.strings.by_name),
                "embedded_string_storages": len(self.embedded.by_name),
                "mutable_kbs": len(self.memory.stores),
                "resume_callbacks": len(self._resume_callbacks),
                "throttle": int(self.throttle is not None)}

    def __repr__(self) -> str:
        return f"<Session {self.id} conn={self.conn.id}{' closed' if self.closed else ''}>"


def _fit(message: str, limit: int = 64 * 1024) -> str:
    """Keep an error message well inside one frame (it may quote client input)."""
    if len(message) <= limit:
        return message
    return message[:limit] + f"… ({len(message) - limit} more characters)"
