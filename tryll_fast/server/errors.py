"""The server's error vocabulary: the protocol's codes and the exception handlers raise.

Both live in `tryll_fast.errors` (the workflow layer and the client use them too); this
module is the server's name for them.
"""
from tryll_fast.errors import ErrorCode, RequestError

__all__ = ["ErrorCode", "RequestError"]
