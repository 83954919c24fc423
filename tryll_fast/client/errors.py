"""TryllError: what every client call raises for a protocol error."""
from __future__ import annotations

from tryll_fast.errors import ErrorCode


class TryllError(Exception):
    """A failed request or connection: `.code` (an ErrorCode when known) and `.message`.

    Server errors carry the ErrorResponse code; 1001 ConnectionFailed, 1002
    ConnectionDropped, 1003 Timeout and 5004 ProtocolVersionMismatch are raised by the
    client itself."""

    def __init__(self, code: int, message: str) -> None:
        try:
            self.code: int = ErrorCode(code)
        except ValueError:
            self.code = int(code)
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        name = self.code.name if isinstance(self.code, ErrorCode) else "unknown code"
        return f"{self.message} ({int(self.code)} {name})"


class ReaderThreadError(RuntimeError):
    """A blocking call made on the client's reader thread (from a callback): it would wait
    for a reply that only that thread can read. Use the *_async variant there."""
