"""CreateSession, SetSessionLocale, SetInferenceThrottle (docs/protocol.md)."""
from __future__ import annotations

import functools
import logging

import langcodes

from tryll_fast import codec
from tryll_fast.server.dispatch import handles
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.server.logs import fields

log = logging.getLogger("tryll_fast.server.session")

MAX_LOCALE_CHARS = 64
_ROLES = {int(m) for m in codec.ModelRole}
_ENGINES = {int(m) for m in codec.InferenceEngine}
_PLACEMENTS = {int(m) for m in codec.MemoryPlacement}


def check_locale(tag: str, field: str = "locale") -> str:
    """A BCP-47 tag ("de", "pt-BR"), or "" (no locale). Raises 2004 naming the problem."""
    if tag == "":
        return ""
    problem = _locale_problem(tag)
    if problem:
        raise TryllError(ErrorCode.InvalidLocale, f"{field}: {problem}")
    return tag


@functools.lru_cache(maxsize=256)
def _locale_problem(tag: str) -> str:
    """Why `tag` is not a BCP-47 tag ("" when it is). Cached: games send a handful of
    tags, and the registry lookup costs ~10 µs."""
    if len(tag) > MAX_LOCALE_CHARS:
        return f"{len(tag)} characters; a BCP-47 tag has at most {MAX_LOCALE_CHARS}"
    if "_" in tag:
        return (f"{tag!r} is not a BCP-47 tag: subtags are separated by '-' "
                f"(e.g. {tag.replace('_', '-')!r})")
    if not langcodes.tag_is_valid(tag):
        return (f"{tag!r} is not a valid BCP-47 language tag "
                "(e.g. 'en', 'de', 'pt-BR', 'zh-Hant-TW')")
    return ""


@handles("CreateSessionRequest", before_session="serve")
def create_session(session, req):
    if session.created:
        raise TryllError(ErrorCode.SessionAlreadyExists,
                         f"this connection already has session {session.id}: "
                         "CreateSessionRequest is one-shot")
    locale = check_locale(req.locale)
    hints: list[tuple[int, int]] = []
    placements: dict[str, int] = {}
    config = req.model_config
    if config is not None:
        for i, hint in enumerate(config.engines):
            if hint.role not in _ROLES:
                raise TryllError(ErrorCode.InvalidEngineSet,
                                 f"model_config.engines[{i}].role: {hint.role} is not a "
                                 f"ModelRole (0..{max(_ROLES)})")
            if hint.engine not in _ENGINES:
                raise TryllError(ErrorCode.InvalidEngineSet,
                                 f"model_config.engines[{i}].engine: {hint.engine} is not an "
                                 f"InferenceEngine (0..{max(_ENGINES)})")
            hints.append((int(hint.role), int(hint.engine)))
        for i, hint in enumerate(config.placement_hints):
            if hint.placement not in _PLACEMENTS:
                raise TryllError(ErrorCode.InvalidEngineSet,
                                 f"model_config.placement_hints[{i}].placement: "
                                 f"{hint.placement} is not a MemoryPlacement "
                                 f"(0..{max(_PLACEMENTS)})")
            placements[hint.model_name] = int(hint.placement)
    session.locale = locale
    session.engine_hints = tuple(hints)
    session.placement_hints = placements
    session.game_name = req.game_name[:128]
    session_id = session.server.create_session(session)
    session.server.warm_engines({engine for _, engine in hints})
    log.info("session created", extra=fields(session=session_id, connection=session.conn.id,
                                             peer=session.conn.peer, locale=locale,
                                             game=session.game_name,
                                             engines=len(hints), placement_hints=len(placements)))
    return codec.CreateSessionResponse(request_id=req.request_id, session_id=session_id)


@handles("SetSessionLocaleRequest")
def set_session_locale(session, req):
    session.locale = check_locale(req.locale)
    return codec.Ack(request_id=req.request_id)


@handles("SetInferenceThrottle", before_session="drop", during_shutdown=True, silent=True)
def set_inference_throttle(session, msg):
    value = session.server.throttle.clamp(msg.throttle)
    if value is None:
        return None          # non-finite: ignored, never an error (docs/protocol.md)
    session.throttle = value
    session.server.throttle.set(session.id, value)
    return None
