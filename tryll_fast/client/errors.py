"""What client calls raise: the protocol's errors (tryll_fast.errors), one class per code,
so a game writes `except AgentBusy` (or checks `err.code`), and ReaderThreadError."""
from __future__ import annotations

from tryll_fast.errors import TryllError

__all__ = ["ReaderThreadError", "TryllError"]


class ReaderThreadError(RuntimeError):
    """A blocking call made on the client's reader thread (from a callback): it would wait
    for a reply that only that thread can read. Use the *_async variant there."""
