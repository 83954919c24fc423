"""Typed record metadata of the embedded storages (docs/knowledge.md "Metadata").

A schema is a list of fields `{name, type, default | optional: true, filterable}`; type is
int (int64), float (double), string, bool or set<string> (sorted, deduplicated). Records'
metadata objects are validated against it once, at load, and stored by column: the filter
(filters.py) compares whole columns with numpy, so a query never looks at a record's JSON.
Keys a record has that the schema does not declare are ignored.

Without a declared schema (inline strings with metadata_json) the schema is inferred: each
key's JSON type across the records (integers mixed with decimals make a float; an array of
strings a set<string>); a key some records lack is optional. Values of one key with
different types are 8003 naming the key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from tryll_fast.errors import ErrorCode, TryllError

TYPES = ("int", "float", "string", "bool", "set<string>")
MAX_FIELDS = 64
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def bad(where: str, problem: str) -> TryllError:
    return TryllError(ErrorCode.InvalidEmbeddedStringStorageData, f"{where}: {problem}")


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    default: Any = None          # a typed value, or None when the field is optional
    optional: bool = False
    filterable: bool = True


def _typed(type_: str, value: Any, where: str) -> Any:
    """A JSON value as the field's Python value; 8003 naming `where` when it is not one."""
    if type_ == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                raise bad(where, f"{value!r} is not an integer")
        if not INT64_MIN <= value <= INT64_MAX:
            raise bad(where, f"{value} does not fit in 64 bits")
        return value
    if type_ == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(where, f"{value!r} is not a number")
        value = float(value)
        if not math.isfinite(value):
            raise bad(where, f"{value!r} is not a finite number")
        return value
    if type_ == "string":
        if not isinstance(value, str):
            raise bad(where, f"{value!r} is not a string")
        return value
    if type_ == "bool":
        if not isinstance(value, bool):
            raise bad(where, f"{value!r} is not true or false")
        return value
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad(where, f"{value!r} is not an array of strings")
    return tuple(sorted(set(value)))


class Schema:
    """The declared fields, by name."""

    def __init__(self, fields: Sequence[Field]) -> None:
        self.fields = tuple(fields)
        self.by_name = {f.name: f for f in self.fields}

    def __len__(self) -> int:
        return len(self.fields)

    @classmethod
    def parse(cls, raw: Any, where: str = "fields") -> Schema:
        if raw is None:
            return cls(())
        if not isinstance(raw, list):
            raise bad(where, "must be an array of field declarations")
        if len(raw) > MAX_FIELDS:
            raise bad(where, f"{len(raw)} fields; at most {MAX_FIELDS}")
        out: list[Field] = []
        seen: set[str] = set()
        for i, f in enumerate(raw):
            at = f"{where}[{i}]"
            if not isinstance(f, dict):
                raise bad(at, "must be an object {name, type, default | optional}")
            unknown = set(f) - {"name", "type", "default", "optional", "filterable"}
            if unknown:
                raise bad(at, f"unknown key(s) {', '.join(sorted(unknown))}")
            name = f.get("name")
            if not isinstance(name, str) or not name.strip():
                raise bad(f"{at}.name", "must be a non-empty string")
            if name in seen:
                raise bad(f"{at}.name", f"{name!r} is declared twice")
            seen.add(name)
            type_ = f.get("type")
            if type_ not in TYPES:
                raise bad(f"{at}.type", f"{type_!r} is not one of {', '.join(TYPES)}")
            optional = f.get("optional", False)
            if not isinstance(optional, bool):
                raise bad(f"{at}.optional", "must be true or false")
            has_default = "default" in f
            if has_default == optional:
                raise bad(at, f"field {name!r} needs exactly one of `default` or "
                              "`optional: true`")
            filterable = f.get("filterable", True)
            if not isinstance(filterable, bool):
                raise bad(f"{at}.filterable", "must be true or false")
            default = _typed(type_, f["default"], f"{at}.default") if has_default else None
            out.append(Field(name, type_, default, optional, filterable))
        return cls(out)

    @classmethod
    def infer(cls, objects: Sequence[dict], where: str) -> Schema:
        """The schema of undeclared metadata (see the module docstring)."""
        types: dict[str, str] = {}
        counts: dict[str, int] = {}
        for i, obj in enumerate(objects):
            for key, value in obj.items():
                if isinstance(value, bool):
                    t = "bool"
                elif isinstance(value, int):
                    t = "int"
                elif isinstance(value, float):
                    t = "float"
                elif isinstance(value, str):
                    t = "string"
                elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                    t = "set<string>"
                else:
                    raise bad(f"{where}[{i}].{key}", f"{value!r} is not an int, float, "
                                                     "string, bool or array of strings")
                old = types.get(key)
                if old is not None and old != t:
                    if {old, t} == {"int", "float"}:
                        t = "float"
                    else:
                        raise bad(f"{where}[{i}].{key}",
                                  f"is a {t} here and a {old} in an earlier record")
                types[key] = t
                counts[key] = counts.get(key, 0) + 1
        if len(types) > MAX_FIELDS:
            raise bad(where, f"{len(types)} metadata keys; at most {MAX_FIELDS}")
        return cls([Field(k, t, None, True) for k, t in types.items()])


class Column:
    """One field over every record. `present` is False where an optional field is absent.
    int/float/bool: `values` (int64 / float64 / bool). string: `codes` (int32 into `vocab`,
    -1 absent). set<string>: `rows_of` (element -> sorted int64 row numbers) and `sets`
    (the tuple per row)."""

    def __init__(self, field: Field, n: int) -> None:
        self.field = field
        self.present = np.ones(n, dtype=bool)
        self.values: np.ndarray | None = None
        self.codes: np.ndarray | None = None
        self.vocab: dict[str, int] = {}
        self.strings: list[str] = []
        self.rows_of: dict[str, np.ndarray] = {}
        self.sets: list[tuple[str, ...]] = []

    def value(self, row: int) -> Any:
        """The record's value, or None when absent (for diagnostics and export)."""
        if not self.present[row]:
            return None
        t = self.field.type
        if t == "string":
            return self.strings[self.codes[row]]
        if t == "set<string>":
            return list(self.sets[row])
        v = self.values[row]
        return bool(v) if t == "bool" else (int(v) if t == "int" else float(v))


class Columns:
    """The records' metadata stored by field (the filter's input)."""

    def __init__(self, schema: Schema, objects: Sequence[dict | None], where: str) -> None:
        n = len(objects)
        self.schema = schema
        self.n = n
        self.by_name: dict[str, Column] = {}
        for field in schema.fields:
            col = Column(field, n)
            raw: list[Any] = []
            for i, obj in enumerate(objects):
                if obj is not None and field.name in obj:
                    raw.append(_typed(field.type, obj[field.name],
                                      f"{where}[{i}].metadata.{field.name}"))
                elif field.optional:
                    raw.append(None)
                    col.present[i] = False
                else:
                    raw.append(field.default)
            self._fill(col, raw)
            self.by_name[field.name] = col

    @staticmethod
    def _fill(col: Column, raw: list[Any]) -> None:
        t = col.field.type
        if t in ("int", "float", "bool"):
            dtype = {"int": np.int64, "float": np.float64, "bool": bool}[t]
            zero = {"int": 0, "float": 0.0, "bool": False}[t]
            col.values = np.array([zero if v is None else v for v in raw], dtype=dtype)
        elif t == "string":
            codes = np.full(len(raw), -1, dtype=np.int32)
            for i, v in enumerate(raw):
                if v is None:
                    continue
                code = col.vocab.get(v)
                if code is None:
                    code = col.vocab[v] = len(col.strings)
                    col.strings.append(v)
                codes[i] = code
            col.codes = codes
        else:
            rows: dict[str, list[int]] = {}
            col.sets = [v or () for v in raw]
            for i, v in enumerate(raw):
                for item in v or ():
                    rows.setdefault(item, []).append(i)
            col.rows_of = {k: np.array(v, dtype=np.int64) for k, v in rows.items()}

    def record(self, row: int) -> dict[str, Any]:
        """The record's typed metadata (absent optional fields left out)."""
        out = {}
        for name, col in self.by_name.items():
            v = col.value(row)
            if v is not None:
                out[name] = v
        return out
