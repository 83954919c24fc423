"""The Retrieve / ClassifyIntent metadata filter (docs/knowledge.md "Filters").

A filter is JSON: every node `{"op": ...}`: `and` / `or` with `args`, `not` with `arg`,
`eq ne lt le gt ge` with `lhs` / `rhs` (ordering numeric only; int and float compare with
promotion), `in` with `needle` / `haystack` (a set<string> field, an array literal or a
string_set variable). Operands: `{"knowledge": field}`, `{"value": literal}`,
`{"var": agent variable}` (its current value read on every search). It is compiled once
against the store's schema and the agent's declared variables: field names resolve to
columns and every type is checked then; a search evaluates it over whole columns
(numpy) into a byte per record that the index consults during its graph walk.

A leaf that references an optional field a record lacks is false for that record.
Limits: depth 16, 256 nodes. A bad filter raises FilterError with the JSON path of the
offending node, e.g. `at args[1].rhs: cannot compare string with int`.
"""
from __future__ import annotations

import json
import operator
from typing import Any, Callable

import numpy as np

from tryll_fast.knowledge.metadata import Columns, Schema

MAX_DEPTH = 16
MAX_NODES = 256
_CMP = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le,
        "gt": operator.gt, "ge": operator.ge}
_SWAP = {"eq": "eq", "ne": "ne", "lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}
_VAR_TYPES = {"int": "int", "float": "float", "string": "string", "bool": "bool",
              "string_set": "set<string>"}
_NUMERIC = ("int", "float")

Mask = Callable[[Columns, Any], np.ndarray]       # (columns, variables) -> bool[n]


class FilterError(ValueError):
    """A filter that does not compile; str() is `at <path>: <problem>`."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"at {path or 'the top'}: {problem}")


class Filter:
    """A compiled filter: `mask(columns, variables)` is one bool per record."""

    def __init__(self, text: str, fn: Mask, variables: frozenset[str]) -> None:
        self.text = text
        self._fn = fn
        self.variables = variables

    def mask(self, columns: Columns, variables) -> np.ndarray:
        return self._fn(columns, variables)


class _Operand:
    __slots__ = ("kind", "ref", "type")

    def __init__(self, kind: str, ref: Any, type_: str) -> None:
        self.kind = kind      # field | value | var | array
        self.ref = ref        # field name | literal | variable name | tuple of literals
        self.type = type_     # int float string bool set<string>; array: element type


def compile_filter(text: str, schema: Schema, var_kind: Callable[[str], str | None]
                   ) -> Filter | None:
    """The compiled filter, or None for an empty one (no restriction)."""
    if not text or not text.strip():
        return None
    try:
        tree = json.loads(text)
    except ValueError as exc:
        raise FilterError("", f"not JSON ({exc})") from None
    c = _Compiler(schema, var_kind)
    fn = c.node(tree, "", 1)
    return Filter(text, fn, frozenset(c.vars))


class _Compiler:
    def __init__(self, schema: Schema, var_kind) -> None:
        self.schema = schema
        self.var_kind = var_kind
        self.count = 0
        self.vars: set[str] = set()

    def node(self, n: Any, path: str, depth: int) -> Mask:
        self.count += 1
        if self.count > MAX_NODES:
            raise FilterError(path, f"more than {MAX_NODES} nodes")
        if depth > MAX_DEPTH:
            raise FilterError(path, f"nested deeper than {MAX_DEPTH}")
        if not isinstance(n, dict) or "op" not in n:
            raise FilterError(path, 'a filter node is an object with an "op"')
        op = n["op"]
        at = (path + ".") if path else ""
        if op in ("and", "or"):
            self._keys(n, ("op", "args"), path)
            args = n.get("args")
            if not isinstance(args, list) or not args:
                raise FilterError(path, f'"{op}" needs a non-empty "args" array')
            fns = [self.node(a, f"{at}args[{i}]", depth + 1) for i, a in enumerate(args)]
            combine = np.logical_and if op == "and" else np.logical_or

            def both(cols, vars_, fns=fns, combine=combine):
                out = fns[0](cols, vars_)
                for f in fns[1:]:
                    out = combine(out, f(cols, vars_))
                return out
            return both
        if op == "not":
            self._keys(n, ("op", "arg"), path)
            if "arg" not in n:
                raise FilterError(path, '"not" needs an "arg"')
            inner = self.node(n["arg"], f"{at}arg", depth + 1)
            return lambda cols, vars_: ~inner(cols, vars_)
        if op in _CMP:
            self._keys(n, ("op", "lhs", "rhs"), path)
            lhs = self.operand(n.get("lhs"), f"{at}lhs")
            rhs = self.operand(n.get("rhs"), f"{at}rhs")
            return self.compare(op, lhs, rhs, path)
        if op == "in":
            self._keys(n, ("op", "needle", "haystack"), path)
            needle = self.operand(n.get("needle"), f"{at}needle")
            haystack = self.operand(n.get("haystack"), f"{at}haystack", array_ok=True)
            return self.member(needle, haystack, path)
        raise FilterError(path, f"unknown op {op!r} (and, or, not, eq, ne, lt, le, gt, ge, "
                                "in)")

    @staticmethod
    def _keys(n: dict, allowed: tuple, path: str) -> None:
        extra = set(n) - set(allowed)
        if extra:
            raise FilterError(path, f"unexpected key(s) {', '.join(sorted(extra))} for "
                                    f"\"{n['op']}\"")

    def operand(self, o: Any, path: str, array_ok: bool = False) -> _Operand:
        if not isinstance(o, dict) or len(o) != 1:
            raise FilterError(path, 'an operand is one of {"knowledge": field}, '
                                    '{"value": literal}, {"var": name}')
        (kind, ref), = o.items()
        if kind == "knowledge":
            field = self.schema.by_name.get(ref) if isinstance(ref, str) else None
            if field is None:
                names = ", ".join(f.name for f in self.schema.fields) or "none"
                raise FilterError(path, f"unknown knowledge field {ref!r} (fields: {names})")
            if not field.filterable:
                raise FilterError(path, f"field {ref!r} is declared filterable: false")
            if field.type == "set<string>" and not array_ok:
                raise FilterError(path, f"set<string> field {ref!r} can only be the "
                                        "haystack of \"in\"")
            return _Operand("field", ref, field.type)
        if kind == "var":
            vk = self.var_kind(ref) if isinstance(ref, str) else None
            if vk is None:
                raise FilterError(path, f"unknown agent variable {ref!r} (declare it in "
                                        "CreateAgent's variables)")
            t = _VAR_TYPES[vk]
            if t == "set<string>" and not array_ok:
                raise FilterError(path, f"string_set variable {ref!r} can only be the "
                                        "haystack of \"in\"")
            self.vars.add(ref)
            return _Operand("var", ref, t)
        if kind == "value":
            if isinstance(ref, list):
                if not array_ok:
                    raise FilterError(path, "an array literal can only be the haystack of "
                                            "\"in\"")
                types = {_literal_type(v, path) for v in ref}
                if types <= set(_NUMERIC) and types:
                    t = "float" if "float" in types else "int"
                elif len(types) == 1:
                    t = types.pop()
                elif not types:
                    t = "any"
                else:
                    raise FilterError(path, "an array literal mixes types "
                                            f"({', '.join(sorted(types))})")
                return _Operand("array", tuple(ref), t)
            return _Operand("value", ref, _literal_type(ref, path))
        raise FilterError(path, f"unknown operand namespace {kind!r} (knowledge, value, "
                                "var)")

    # ---- comparisons

    def compare(self, op: str, lhs: _Operand, rhs: _Operand, path: str) -> Mask:
        numeric = lhs.type in _NUMERIC and rhs.type in _NUMERIC
        if op not in ("eq", "ne") and not numeric:
            raise FilterError(path, f'"{op}" orders numbers; got {lhs.type} and {rhs.type}')
        if not numeric and lhs.type != rhs.type:
            raise FilterError(path, f"cannot compare {lhs.type} with {rhs.type}")
        if lhs.kind != "field" and rhs.kind == "field":
            lhs, rhs, op = rhs, lhs, _SWAP[op]
        cmp = _CMP[op]
        if lhs.kind != "field":                         # constants on both sides
            def const(cols, vars_):
                return np.full(cols.n, bool(cmp(_read(lhs, vars_), _read(rhs, vars_))))
            return const
        name = lhs.ref
        if rhs.kind == "field":
            other = rhs.ref

            def two_fields(cols, vars_):
                a, b = cols.by_name[name], cols.by_name[other]
                return cmp(_array(a), _array(b)) & a.present & b.present
            return two_fields
        if lhs.type == "string":
            def string_field(cols, vars_):
                col = cols.by_name[name]
                code = col.vocab.get(_read(rhs, vars_), -2)
                return cmp(col.codes, code) & col.present
            return string_field

        def field_value(cols, vars_):
            col = cols.by_name[name]
            return cmp(col.values, _read(rhs, vars_)) & col.present
        return field_value

    def member(self, needle: _Operand, haystack: _Operand, path: str) -> Mask:
        if needle.kind == "array" or needle.type == "set<string>":
            raise FilterError(path, "the needle of \"in\" is a single value")
        if haystack.kind == "array":
            element = haystack.type
        elif haystack.type == "set<string>":
            element = "string"
        else:
            raise FilterError(path, "the haystack of \"in\" is a set<string> field, an array "
                                    "literal or a string_set variable")
        if element != "any" and not (needle.type == element or
                                     (needle.type in _NUMERIC and element in _NUMERIC)):
            raise FilterError(path, f"a needle of type {needle.type} in a haystack of {element} "
                                    "values")
        if haystack.kind == "field":
            hay = haystack.ref
            if needle.kind == "field":
                name = needle.ref

                def field_in_field(cols, vars_):
                    a, b = cols.by_name[name], cols.by_name[hay]
                    out = np.zeros(cols.n, dtype=bool)
                    for item, rows in b.rows_of.items():
                        code = a.vocab.get(item)
                        if code is not None:
                            out[rows[a.codes[rows] == code]] = True
                    return out
                return field_in_field

            def value_in_field(cols, vars_):
                out = np.zeros(cols.n, dtype=bool)
                rows = cols.by_name[hay].rows_of.get(_read(needle, vars_))
                if rows is not None:
                    out[rows] = True
                return out
            return value_in_field
        if needle.kind == "field":
            name = needle.ref
            if needle.type == "string":
                def string_in(cols, vars_):
                    col = cols.by_name[name]
                    codes = [col.vocab[s] for s in _read(haystack, vars_) if s in col.vocab]
                    return np.isin(col.codes, codes) & col.present
                return string_in

            def scalar_in(cols, vars_):
                col = cols.by_name[name]
                items = list(_read(haystack, vars_))
                return np.isin(col.values, items) & col.present if items else \
                    np.zeros(cols.n, dtype=bool)
            return scalar_in

        def const_in(cols, vars_):
            return np.full(cols.n, _read(needle, vars_) in set(_read(haystack, vars_)))
        return const_in


def _literal_type(v: Any, path: str) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "string"
    raise FilterError(path, f"{v!r} is not an int, float, string or bool literal")


def _read(o: _Operand, variables) -> Any:
    if o.kind == "var":
        return variables.get(o.ref)
    return o.ref


def _array(col) -> np.ndarray:
    if col.codes is not None:
        return np.array(col.strings + [""], dtype=object)[col.codes]
    return col.values
