"""DebugCommandRequest: the development-only diagnostic channel (docs/protocol.md).

Served only when the server runs with `--dev` (else 3026 DebugCommandsDisabled). An unknown
command or bad arguments get 3027 UnknownDebugCommand with the usage. Commands:

    help                           the commands
    echo ARGS...                   the arguments joined by spaces
    repeat TEXT COUNT              TEXT repeated COUNT times (a reply over 1 MiB -> 5003)
    stats                          server and session counters as JSON
    stream COUNT [TEXT]            COUNT AnswerText frames (node_name "debug.stream") from a
                                   producer thread that honours backpressure, then the final
                                   chunk and a DebugCommandResponse with the timing
    ping COUNT INTERVAL_US         COUNT AnswerText frames (node_name "debug.ping") whose text
                                   is time.monotonic_ns() at send, one every INTERVAL_US,
                                   from a producer thread: cross-thread send latency
    generate MODEL MAX_TOKENS PROMPT...
                                   greedy completion on a catalog model, streamed as
                                   AnswerText (node_name "debug.generate") straight from the
                                   engine; the response carries the engine's stats
    raise                          fail inside the handler (exercises 2006 InternalError)

`stream` and `generate` exercise the same paths turns use: frames encoded on the producing
thread, sent through the connection's queue, paused by backpressure, cancelled by teardown
and waited for by graceful shutdown.
"""
from __future__ import annotations

import json
import logging
import threading
import time

from tryll_fast import codec
from tryll_fast.server.dispatch import handles
from tryll_fast.errors import ErrorCode, TryllError

log = logging.getLogger("tryll_fast.server.debug")

MAX_REPEAT_CHARS = 16 << 20
MAX_STREAM_FRAMES = 10_000_000
WAIT_SLICE_S = 0.25

USAGE = {
    "help": "help",
    "echo": "echo ARGS...",
    "repeat": "repeat TEXT COUNT",
    "stats": "stats",
    "stream": "stream COUNT [TEXT]",
    "ping": "ping COUNT INTERVAL_US",
    "generate": "generate MODEL MAX_TOKENS PROMPT...",
    "raise": "raise",
}


def _usage_error(command: str, problem: str) -> TryllError:
    return TryllError(ErrorCode.UnknownDebugCommand,
                      f"debug {command}: {problem}; usage: {USAGE[command]}")


def _int_arg(command: str, args: list[str], index: int, name: str, low: int, high: int) -> int:
    try:
        value = int(args[index])
    except (IndexError, ValueError):
        raise _usage_error(command, f"{name} must be an integer") from None
    if not low <= value <= high:
        raise _usage_error(command, f"{name} must be in {low}..{high}, got {value}")
    return value


@handles("DebugCommandRequest")
def debug_command(session, req):
    if not session.server.config.dev:
        raise TryllError(ErrorCode.DebugCommandsDisabled,
                         "DebugCommandRequest is served only by a server started with --dev")
    rid = req.request_id
    command = req.command
    args = list(req.args)
    if command == "help":
        return _reply(rid, "\n".join(USAGE.values()))
    if command == "echo":
        return _reply(rid, " ".join(args))
    if command == "repeat":
        if not args:
            raise _usage_error(command, "TEXT is missing")
        count = _int_arg(command, args, 1, "COUNT", 0, MAX_REPEAT_CHARS)
        if len(args[0]) * count > MAX_REPEAT_CHARS:
            raise _usage_error(command, f"the output would exceed {MAX_REPEAT_CHARS} characters")
        return _reply(rid, args[0] * count)
    if command == "stats":
        stats = session.server.stats()
        stats["session"] = {"id": session.id, "owned": session.owned()}
        return _reply(rid, json.dumps(stats, sort_keys=True))
    if command == "stream":
        count = _int_arg(command, args, 0, "COUNT", 0, MAX_STREAM_FRAMES)
        _start_stream(session, rid, count, " ".join(args[1:]) or "token ")
        return None
    if command == "ping":
        count = _int_arg(command, args, 0, "COUNT", 1, 1_000_000)
        interval = _int_arg(command, args, 1, "INTERVAL_US", 0, 10_000_000)
        _start_ping(session, rid, count, interval / 1e6)
        return None
    if command == "generate":
        if len(args) < 3:
            raise _usage_error(command, "MODEL, MAX_TOKENS and PROMPT are required")
        max_tokens = _int_arg(command, args, 1, "MAX_TOKENS", 1, 4096)
        _start_generate(session, rid, args[0], max_tokens, " ".join(args[2:]))
        return None
    if command == "raise":
        raise RuntimeError("debug raise: a deliberate failure inside a handler")
    raise TryllError(ErrorCode.UnknownDebugCommand,
                     f"unknown debug command {command!r} (commands: {', '.join(USAGE)})")


def _reply(rid: int, output: str) -> codec.DebugCommandResponse:
    return codec.DebugCommandResponse(request_id=rid, output=output)


def wait_writable(conn, stop: threading.Event) -> bool:
    """A producer thread's backpressure wait: True when it may send again, False when the
    connection closed or the work was cancelled."""
    while conn.paused:
        if stop.is_set() or conn.closing:
            return False
        conn.wait_writable(WAIT_SLICE_S)
    return not (stop.is_set() or conn.closing)


def _start_stream(session, rid: int, count: int, text: str) -> None:
    stop = threading.Event()
    op = session.begin_operation("stream", f"debug stream {count}", stop.set)
    conn = session.conn
    encode = codec.encode
    AnswerText = codec.AnswerText

    def produce() -> None:
        sent = 0
        t0 = time.perf_counter()
        try:
            for _ in range(count):
                if conn.paused and not wait_writable(conn, stop):
                    break
                if stop.is_set() or not conn.send(encode(AnswerText(
                        agent_id=0, node_name="debug.stream", text=text, is_delta=True))):
                    break
                sent += 1
            seconds = time.perf_counter() - t0
            session.send_reply(AnswerText(agent_id=0, node_name="debug.stream", text="",
                                          is_delta=True, is_final=True))
            session.send_reply(_reply(rid, json.dumps(
                {"frames": sent, "seconds": seconds, "cancelled": sent < count})))
        finally:
            op.finish()

    threading.Thread(target=produce, name="tryll-debug-stream", daemon=True).start()


def _start_ping(session, rid: int, count: int, interval_s: float) -> None:
    stop = threading.Event()
    op = session.begin_operation("stream", f"debug ping {count}", stop.set)
    conn = session.conn

    def produce() -> None:
        sent = 0
        try:
            for _ in range(count):
                if stop.wait(interval_s) if interval_s else stop.is_set():
                    break
                if conn.paused and not wait_writable(conn, stop):
                    break
                frame = codec.encode(codec.AnswerText(
                    agent_id=0, node_name="debug.ping", text=str(time.monotonic_ns()),
                    is_delta=True))
                if not conn.send(frame):
                    break
                sent += 1
            session.send_reply(_reply(rid, json.dumps({"frames": sent})))
        finally:
            op.finish()

    threading.Thread(target=produce, name="tryll-debug-ping", daemon=True).start()


def _start_generate(session, rid: int, model: str, max_tokens: int, prompt: str) -> None:
    server = session.server
    state: dict = {}

    def cancel() -> None:
        handle = state.get("handle")
        if handle is not None:
            handle.cancel()

    op = session.begin_operation("stream", f"debug generate {model}", cancel)

    def start() -> None:
        try:
            if op.cancelled:
                raise TryllError(ErrorCode.ServerShuttingDown, "debug generate cancelled")
            lease = server.models.lease(model)
        except Exception as exc:
            _fail(exc)
            return
        engine = lease.obj
        unregister = session.on_resume(engine.wake)

        def on_text(chunk: str) -> None:
            session.send_reply(codec.AnswerText(agent_id=0, node_name="debug.generate",
                                                text=chunk, is_delta=True))

        def on_finish(handle) -> None:
            try:
                unregister()
                session.send_reply(codec.AnswerText(agent_id=0, node_name="debug.generate",
                                                    text="", is_delta=True, is_final=True))
                stats = handle.stats.as_dict()
                stats["error"] = handle.error
                session.send_reply(_reply(rid, json.dumps(stats)))
            finally:
                # Releasing may free the model, which joins this (scheduler) thread.
                _release_elsewhere(server, lease)
                op.finish()

        try:
            state["handle"] = engine.submit(prompt, max_tokens=max_tokens, temperature=0.0,
                                            on_text=on_text, on_finish=on_finish,
                                            gate=session.conn)
        except Exception as exc:
            unregister()
            _release_elsewhere(server, lease)
            _fail(exc)
            return
        if op.cancelled:
            cancel()

    def _fail(exc: Exception) -> None:
        try:
            if not isinstance(exc, TryllError):
                exc = TryllError(ErrorCode.InferenceFailed, f"debug generate: {exc}")
            session.fail(rid, exc)
        finally:
            op.finish()

    session.lane.submit(start)


def _release_elsewhere(server, lease) -> None:
    try:
        server.workers.submit(lease.release)
    except RuntimeError:        # pool already shut down (server stopping)
        threading.Thread(target=lease.release, daemon=True).start()
