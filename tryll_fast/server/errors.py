"""The exception handlers raise to fail one request with a protocol error code.

A handler raises `RequestError(code, message)`; the session turns it into
`ErrorResponse {request_id, code, message}` for that request, and the connection carries on.
The codes themselves are `tryll_fast.errors.ErrorCode`.
"""
from __future__ import annotations

from tryll_fast.errors import ErrorCode

__all__ = ["ErrorCode", "RequestError"]


class RequestError(Exception):
    """Fail one request with a protocol error code; the message is shown to players'
    developers, so it names the field and the constraint."""

    def __init__(self, code: int, message: str) -> None:
        self.code = ErrorCode(code)
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        return f"{self.message} ({int(self.code)} {self.code.name})"
