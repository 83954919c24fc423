"""The dispatch table: MessageBody tag -> the one handler for that message type.

Handlers register with `@handles("ListModelsRequest", ...)` in the modules of
`tryll_fast.server.handlers`; `build_table()` turns the registry into a tuple indexed by
tag, so dispatching a frame is one index and one call. Every message a client may send
must have a handler (tests check this against the union); a tag a client may not send
(a server-to-client message) gets the 5002 handler.

A handler is `fn(session, body) -> reply body | None`. It raises TryllError for a
protocol error; it returns None when it replies later (work handed to a worker) or when
the message has no reply at all (SetInferenceThrottle, AudioBuffer). A handler registered
with `lane=True` runs on the session's lane (session.run_blocking) instead of the reactor:
what it returns is the reply, what it raises the ErrorResponse. A handler that must check
something on the reactor first (an agent busy, a model unknown) and then work on the lane
calls session.run_blocking itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from tryll_fast import codec

# Client -> server messages are the requests plus the two fire-and-forget frames; every
# other member of the union only ever travels from the server to the client (the protocol's
# message catalog, "Direction").
FIRE_AND_FORGET = frozenset({"SetInferenceThrottle", "AudioBuffer"})


def is_client_message(name: str) -> bool:
    return name.endswith("Request") or name in FIRE_AND_FORGET


CLIENT_MESSAGES = tuple(m.name for m in codec.MessageBody if m.value and is_client_message(m.name))
SERVER_MESSAGES = tuple(m.name for m in codec.MessageBody
                        if m.value and not is_client_message(m.name))

Handler = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class Route:
    """How a message type is served."""
    name: str
    fn: Handler
    # before CreateSession: 'serve' (only CreateSession), 'drop' (no reply), or 'reject' (2002)
    before_session: str = "reject"
    # during graceful shutdown: True = still served (ends work), False = 2001
    during_shutdown: bool = False
    # fire-and-forget: never answered, not even with an error
    silent: bool = False
    # runs on the session's lane, not the reactor (file I/O, embedding, model work)
    lane: bool = False


_REGISTRY: dict[str, Route] = {}


def handles(name: str, *, before_session: str = "reject", during_shutdown: bool = False,
            silent: bool = False, lane: bool = False) -> Callable[[Handler], Handler]:
    if name not in CLIENT_MESSAGES:
        raise ValueError(f"{name} is not a client-to-server message of MessageBody")
    if before_session not in ("serve", "drop", "reject"):
        raise ValueError(f"before_session={before_session!r}")

    def register(fn: Handler) -> Handler:
        if name in _REGISTRY:
            raise ValueError(f"{name} already has a handler ({_REGISTRY[name].fn.__qualname__})")
        _REGISTRY[name] = Route(name, fn, before_session, during_shutdown, silent, lane)
        return fn

    return register


def registry() -> dict[str, Route]:
    from tryll_fast.server import handlers  # noqa: F401  (registers every handler)
    return dict(_REGISTRY)


def build_table() -> tuple[Route | None, ...]:
    """Routes indexed by MessageBody tag; None for NONE and for server-only messages."""
    routes = registry()
    missing = [n for n in CLIENT_MESSAGES if n not in routes]
    if missing:
        raise RuntimeError(f"client messages without a handler: {', '.join(missing)}")
    size = max(int(m) for m in codec.MessageBody) + 1
    table: list[Route | None] = [None] * size
    for m in codec.MessageBody:
        if m.name in routes:
            table[int(m)] = routes[m.name]
    return tuple(table)
