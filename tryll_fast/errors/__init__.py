"""The protocol's errors: one base, `TryllError`, carrying the code, and one class per code,
generated from `codes.txt` (tools/gen_errors.py; the catalog is docs/errors.md).

Owns the code space (ErrorCode) and the exceptions that carry it, for the server, the
workflow, the engines, the model layer, the codec and the client alike:

    raise AgentBusy(f"agent {aid} is running a turn")        # code 3004
    raise TryllError(3004, "...")                           # the same: an AgentBusy
    except AgentError: ...                                  # any 3xxx
    err.code, err.message                                   # ErrorCode.AgentBusy, "..."

A class per family of codes (AgentError for 3xxx, DownloadError for 6001-6006, ...) sits
between the base and the codes. Constructing the base or a family with a code gives the
code's own class, so a server reply, a client error and a raised error are the same class
for the same code. Keyword arguments become attributes (`model=`, `file=`, ...): context
a program may want, already stated in the message. 1xxx are raised by clients only.
"""
from __future__ import annotations

from typing import Any


class TryllError(Exception):
    """A request (or a connection) failed with a protocol error code.

    `.code` is an ErrorCode member (a plain int for a code this build does not know, e.g. a
    newer server's), `.message` the human-readable text, safe for display: it names the
    field and the constraint."""

    code: int = 0           # a leaf class's own code; the base and families have none

    def __new__(cls, *args: Any, **details: Any):
        code = _leading_code(args)
        if code is not None:
            leaf = _BY_CODE.get(code)
            if leaf is not None and leaf is not cls:
                if not issubclass(leaf, cls):
                    raise TypeError(f"{cls.__name__} cannot carry code {code} "
                                    f"({leaf.__name__})")
                cls = leaf
        return super().__new__(cls)

    def __init__(self, *args: Any, **details: Any) -> None:
        code = _leading_code(args)
        if code is not None:
            args = args[1:]
        elif type(self).code:
            code = type(self).code
        else:
            raise TypeError(f"{type(self).__name__} needs a code: {type(self).__name__}"
                            f"(code, message)")
        try:
            self.code = ErrorCode(code)
        except ValueError:
            self.code = int(code)
        self.message = str(args[0]) if args else ""
        for key, value in details.items():
            setattr(self, key, value)
        super().__init__(self.message)

    def __str__(self) -> str:
        name = self.code.name if isinstance(self.code, ErrorCode) else "unknown code"
        return f"{self.message} ({int(self.code)} {name})"

    def __reduce__(self):
        extra = {k: v for k, v in vars(self).items() if k not in ("code", "message")}
        return (_rebuild, (int(self.code), self.message, extra))


def _leading_code(args) -> int | None:
    if args and isinstance(args[0], int) and not isinstance(args[0], bool):
        return int(args[0])
    return None


def _rebuild(code: int, message: str, extra: dict) -> TryllError:
    return TryllError(code, message, **extra)


def error_class(code: int) -> type[TryllError]:
    """The class of a code (TryllError itself for a code this build does not know)."""
    return _BY_CODE.get(int(code), TryllError)


from tryll_fast.errors._codes import *  # noqa: E402,F401,F403 (the generated classes)
from tryll_fast.errors._codes import _BY_CODE, ErrorCode  # noqa: E402
