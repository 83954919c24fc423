"""The mutable knowledge base handles of the blocking and the asyncio client (their
requests come from client.memory.MutableKbCalls, written out in _methods.py)."""
from __future__ import annotations

from typing import AsyncIterator, Iterator

from tryll_fast.client._methods import AsyncMutableKbMethods, MutableKbMethods
from tryll_fast.client.memory import KbRecord


class MutableKb(MutableKbMethods):
    """A mutable knowledge base of a TryllClient's session, by name (requests block)."""

    def __init__(self, client, name: str, created: bool = False) -> None:
        self.client = client
        self.name = name
        self.created = created       # whether ensure_mutable_kb made it just now

    def records(self, page_size: int = 100) -> Iterator[KbRecord]:
        """Every record, in id order, a page at a time."""
        cursor = ""
        while True:
            page, cursor = self.list(cursor, page_size)
            yield from page
            if not cursor:
                return

    def __repr__(self) -> str:
        return f"<MutableKb {self.name!r}>"


class AsyncMutableKb(AsyncMutableKbMethods):
    """A mutable knowledge base of an AsyncTryllClient's session (requests are awaited)."""

    def __init__(self, client, name: str, created: bool = False) -> None:
        self.client = client
        self.name = name
        self.created = created

    async def records(self, page_size: int = 100) -> AsyncIterator[KbRecord]:
        cursor = ""
        while True:
            page, cursor = await self.list(cursor, page_size)
            for r in page:
                yield r
            if not cursor:
                return

    def __repr__(self) -> str:
        return f"<AsyncMutableKb {self.name!r}>"
