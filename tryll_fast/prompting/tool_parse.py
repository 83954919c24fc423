"""Reading a model's tool-call output leniently: JSON values and the byte spans of their
members (so a failure can point at the byte where parsing gave up), argument checks
against the tool's spec, and classified failures. ToolSet.parse (tools.py) drives these.
"""
from __future__ import annotations

import json
from typing import Any

from tryll_fast.prompting.tool_spec import EXCERPT_BYTES, ParseFailure, ToolSpec


class _Fail(Exception):
    def __init__(self, kind: str, reason: str, pos: int) -> None:
        super().__init__(reason)
        self.kind, self.reason, self.pos = kind, reason, pos


_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _check_arguments(spec: ToolSpec, args: dict, astart: int, out: str, spans_ok: bool):
    members = {}
    if spans_ok and out[astart:astart + 1] == "{":
        members = _object_member_spans(out, astart)
    params = {p.name: p for p in spec.params}
    for p in spec.params:
        if p.required and p.name not in args:
            raise _Fail("malformed_call", f"tool {spec.name!r}: missing required argument "
                        f"{p.name!r}", astart)
    for k, v in args.items():
        at = members.get(k, (astart, 0))[0]
        p = params.get(k)
        if p is None:
            raise _Fail("malformed_call", f"tool {spec.name!r}: unexpected argument {k!r}", at)
        if not _TYPE_CHECKS[p.type](v):
            raise _Fail("malformed_call", f"tool {spec.name!r}: argument {k!r} is not a "
                        f"{p.type}", at)
        if p.enum and v not in p.enum:
            raise _Fail("malformed_call", f"tool {spec.name!r}: argument {k!r} = {v!r} is "
                        f"not one of {list(p.enum)}", at)


_DECODER = json.JSONDecoder()
_WS = " \t\n\r"


def _skip_ws(s: str, i: int) -> int:
    while i < len(s) and s[i] in _WS:
        i += 1
    return i


def _decode(s: str, i: int) -> tuple[Any, int]:
    try:
        return _DECODER.raw_decode(s, i)
    except json.JSONDecodeError as e:
        if e.pos >= len(s):
            raise _Fail("malformed_call", "the call's JSON is truncated (output ended)",
                        e.pos) from None
        raise _Fail("malformed_call", f"invalid JSON in the call: {e.msg}", e.pos) from None


def _object_member_spans(s: str, i: int) -> dict[str, tuple[int, int]]:
    """key -> (start, end) of each top-level value of the (valid) JSON object at s[i]."""
    spans = {}
    i = _skip_ws(s, i + 1)
    while i < len(s) and s[i] != "}":
        key, i = _DECODER.raw_decode(s, i)
        i = _skip_ws(s, i)
        i = _skip_ws(s, i + 1)  # ':'
        _, end = _DECODER.raw_decode(s, i)
        spans[key] = (i, end)
        i = _skip_ws(s, end)
        if i < len(s) and s[i] == ",":
            i = _skip_ws(s, i + 1)
    return spans


def _array_item_spans(s: str, i: int) -> list[tuple[int, int]]:
    spans = []
    i = _skip_ws(s, i + 1)
    while i < len(s) and s[i] != "]":
        _, end = _DECODER.raw_decode(s, i)
        spans.append((i, end))
        i = _skip_ws(s, end)
        if i < len(s) and s[i] == ",":
            i = _skip_ws(s, i + 1)
    return spans


def _failure(out: str, kind: str, reason: str, pos: int) -> ParseFailure:
    offset = len(out[:pos].encode("utf-8"))
    excerpt = out.encode("utf-8")[offset:offset + EXCERPT_BYTES].decode("utf-8", "ignore")
    return ParseFailure(kind=kind, reason=reason, offset=offset, excerpt=excerpt)
