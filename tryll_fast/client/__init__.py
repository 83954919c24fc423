"""The Python client: blocking (`TryllClient`, a reader thread) and asyncio
(`AsyncTryllClient`), with the same methods.

Owns: the client side of the wire protocol: connecting and checking ConnectionReady's
version (5004), request ids and futures, matching replies and errors to requests,
delivering unsolicited frames to callbacks, `TryllError(code, message)`. It shares the
codec with the server and nothing else.

Agents (create_agent, per-agent turn streams, cancel, resume / resume_async, tool-call and
paused callbacks) arrive with the workflow issue on top of `core.ClientCore`.
"""
from tryll_fast.client.aio import AsyncTryllClient
from tryll_fast.client.errors import ReaderThreadError, TryllError
from tryll_fast.client.sync import TryllClient
from tryll_fast.errors import ErrorCode

__all__ = ["AsyncTryllClient", "ErrorCode", "ReaderThreadError", "TryllClient", "TryllError"]
