"""Agent variables: declared with a type at CreateAgent, changed by the game in atomic
batches (docs/workflow.md).

A variable's type is the VariableValue member it was declared with (VarInt int64, VarFloat
float64, VarString, VarBool, VarStringSet) and never changes. UpdateAgentVariables
validates the whole batch against a copy, then swaps it in: a rejected batch changes
nothing. Codes: 3013 UnknownVariable, 3014 VariableTypeMismatch, 3015 InvalidVariableValue
(unknown op, value missing or present when it must not be, over a limit).
"""
from __future__ import annotations

import math
import re
import threading
from typing import Any, Iterable

from tryll_fast import codec
from tryll_fast.errors import ErrorCode, TryllError

MAX_VARIABLES = 1024
MAX_SET_ELEMENTS = 4096          # the protocol's limit
MAX_STRING_CHARS = 65536
# Names are Mustache keys (`var.<name>`) and filter operands: no dots, braces or spaces.
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]{0,127}")

KINDS = {codec.VarInt: "int", codec.VarFloat: "float", codec.VarString: "string",
         codec.VarBool: "bool", codec.VarStringSet: "string_set"}
_CLASSES = {kind: cls for cls, kind in KINDS.items()}


def _read(value, where: str, code: int) -> tuple[str, Any]:
    """(kind, Python value) of a VariableValue member; `code` for an invalid value."""
    kind = KINDS.get(type(value))
    if kind is None:
        raise TryllError(code, f"{where}: a value is required")
    if kind == "int":
        return kind, int(value.value)
    if kind == "float":
        v = float(value.value)
        if not math.isfinite(v):
            raise TryllError(code, f"{where}: {v} is not a finite number")
        return kind, v
    if kind == "bool":
        return kind, bool(value.value)
    if kind == "string":
        text = value.value
        if len(text) > MAX_STRING_CHARS:
            raise TryllError(code, f"{where}: {len(text)} characters; at most "
                                     f"{MAX_STRING_CHARS}")
        return kind, text
    items = list(value.values)
    if len(set(items)) > MAX_SET_ELEMENTS:
        raise TryllError(code, f"{where}: {len(set(items))} elements; a set holds at most "
                                 f"{MAX_SET_ELEMENTS}")
    for i, item in enumerate(items):
        if len(item) > MAX_STRING_CHARS:
            raise TryllError(code, f"{where}.values[{i}]: {len(item)} characters; at most "
                                     f"{MAX_STRING_CHARS}")
    return kind, frozenset(items)


def to_wire(kind: str, value: Any):
    """A Python value back into its VariableValue member."""
    cls = _CLASSES[kind]
    if kind == "string_set":
        return cls(values=sorted(value))
    return cls(value=value)


class Variables:
    """One agent's typed variables. Thread-safe: the game updates them from the reactor
    thread while a paused turn reads them on the orchestrator."""

    def __init__(self, declarations: Iterable) -> None:
        self._kinds: dict[str, str] = {}
        self._initial: dict[str, Any] = {}
        for i, decl in enumerate(declarations):
            where = f"variables[{i}]"
            name = decl.name
            if not NAME_RE.fullmatch(name or ""):
                raise TryllError(ErrorCode.GraphCompilationFailed,
                                 f"{where}.name: {name!r} is not a variable name (letters, "
                                 "digits, _ and -, starting with a letter or _)")
            if name in self._kinds:
                raise TryllError(ErrorCode.GraphCompilationFailed,
                                 f"{where}: variable {name!r} is declared twice")
            kind, value = _read(decl.value, f"{where} ({name!r}).value",
                                ErrorCode.GraphCompilationFailed)
            self._kinds[name] = kind
            self._initial[name] = value
        if len(self._kinds) > MAX_VARIABLES:
            raise TryllError(ErrorCode.GraphCompilationFailed,
                             f"variables: {len(self._kinds)} declared; at most {MAX_VARIABLES}")
        self._values = dict(self._initial)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kinds)

    def kind(self, name: str) -> str | None:
        return self._kinds.get(name)

    def get(self, name: str) -> Any:
        with self._lock:
            return self._values[name]

    def apply(self, updates: Iterable) -> int:
        """Validate every update against a copy, then swap it in; returns how many applied.
        Raises TryllError (3013 / 3014 / 3015) naming updates[i] on the first bad one."""
        with self._lock:
            new = dict(self._values)
            count = 0
            for i, up in enumerate(updates):
                self._apply_one(new, i, up)
                count += 1
            self._values = new
            return count

    def _apply_one(self, values: dict[str, Any], i: int, up) -> None:
        name = up.name
        where = f"updates[{i}] ({name!r})"
        kind = self._kinds.get(name)
        if kind is None:
            raise TryllError(ErrorCode.UnknownVariable,
                             f"{where}: no variable of that name is declared "
                             f"(declared: {', '.join(sorted(self._kinds)) or 'none'})")
        op = up.op
        value = up.value
        if op == codec.VariableOp.Reset:
            if value is not None:
                raise TryllError(ErrorCode.InvalidVariableValue,
                                 f"{where}: Reset takes no value")
            values[name] = self._initial[name]
            return
        if op == codec.VariableOp.Assign:
            got, v = _read(value, f"{where}.value", ErrorCode.InvalidVariableValue)
            if got != kind:
                raise TryllError(ErrorCode.VariableTypeMismatch,
                                 f"{where}: the variable is {kind}, the value is {got}")
            values[name] = v
            return
        if op in (codec.VariableOp.AddToSet, codec.VariableOp.RemoveFromSet):
            opname = codec.VariableOp(op).name
            if kind != "string_set":
                raise TryllError(ErrorCode.VariableTypeMismatch,
                                 f"{where}: {opname} needs a string_set variable; this one "
                                 f"is {kind}")
            got, v = _read(value, f"{where}.value", ErrorCode.InvalidVariableValue)
            if got != "string":
                raise TryllError(ErrorCode.VariableTypeMismatch,
                                 f"{where}: {opname} takes a VarString value, not {got}")
            current = values[name]
            if op == codec.VariableOp.AddToSet:
                if v not in current and len(current) >= MAX_SET_ELEMENTS:
                    raise TryllError(ErrorCode.InvalidVariableValue,
                                     f"{where}: the set already holds {MAX_SET_ELEMENTS} "
                                     "elements, the maximum")
                values[name] = current | {v}
            else:
                values[name] = current - {v}
            return
        raise TryllError(ErrorCode.InvalidVariableValue,
                         f"{where}: op {int(op)} is not a VariableOp (0..3)")

    def snapshot(self) -> list:
        """Every variable as AgentVariable values, in declaration order."""
        with self._lock:
            values = dict(self._values)
        return [codec.AgentVariable(name=n, value=to_wire(k, values[n]))
                for n, k in self._kinds.items()]

    def template_view(self) -> dict[str, Any]:
        """Current values for Mustache (`var.<name>`): sets as sorted lists, so a section
        iterates them and `{{var.tags}}` prints them."""
        with self._lock:
            values = dict(self._values)
        return {n: (sorted(v) if self._kinds[n] == "string_set" else v)
                for n, v in values.items()}
