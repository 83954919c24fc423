"""Messages whose feature this build does not include yet.

Each one is answered with ErrorResponse 2007 FeatureNotAvailable naming the missing feature:
never silence, never a fake success. A feature's real handlers replace its entries here
(the dispatch registry refuses two handlers for one message).
"""
from __future__ import annotations

from tryll_fast.server.dispatch import handles
from tryll_fast.errors import ErrorCode, TryllError

FEATURES = {
    "mutable knowledge bases": (
        "EnsureMutableKbRequest", "EnumerateMutableKbsRequest", "MutableKbWriteRequest",
        "MutableKbDeleteRequest", "MutableKbClearRequest", "MutableKbQueryRequest",
        "MutableKbGetRequest", "MutableKbListRequest", "MutableKbStatsRequest",
        "ExportMutableKbRequest", "ImportMutableKbRequest", "SaveGameMemoryRequest",
        "LoadGameMemoryRequest"),
}
# Requests that end work stay available during a graceful shutdown.
_ENDS_WORK: set[str] = set()


def _unavailable(name: str, feature: str):
    def handler(session, req):
        raise TryllError(ErrorCode.FeatureNotAvailable,
                         f"{name} needs {feature}, which this server build does not include "
                         "yet")
    handler.__name__ = handler.__qualname__ = f"unavailable_{name}"
    return handler


for _feature, _names in FEATURES.items():
    for _name in _names:
        handles(_name, during_shutdown=_name in _ENDS_WORK)(_unavailable(_name, _feature))
