"""TOML tables -> the codec's tables (node params, the voice profile), with errors that name
the key.

The codec is the one description of its tables: `FIELDS` lists a table's fields, an enum
field's default is a member of its enum, and a nested table's class is found by encoding
an empty one and reading it back (once per field, cached). So the converter follows the
schema as it grows, with nothing to keep in step by hand:
- a key must be one of the table's fields (the error lists them);
- an enum takes a member's name (`placement = "BeforeUserAsSystem"`) or its number;
- a nested table is a TOML table (`sampling = { max_tokens = 64 }`), a vector of tables
  an array of tables (`tools = [{ name = "give_item", … }]`);
- strings, booleans and numbers are checked against the field's default where it has one,
  and by the codec's encoder otherwise (optional scalars such as `sampling.temperature`).
Union fields have no TOML form here.
"""
from __future__ import annotations

import enum
import functools
from typing import Any, Mapping

from tryll_fast import codec
from tryll_fast.server.config import ConfigError


def to_table(cls: type, data: Any, key: str, source: str):
    """A `cls` table from a TOML table; ConfigError(source, key…) for any bad key or value.
    The result encodes (checked here), so CreateAgent sees only the graph's own rules."""
    table = _build(cls, data, key, source)
    try:
        codec.encode_root(table)
    except codec.EncodeError as exc:
        raise ConfigError(source, key, exc.message) from None
    return table


def _build(cls: type, data: Any, key: str, source: str):
    if not isinstance(data, Mapping):
        raise ConfigError(source, key, f"expected a table of {cls.__name__} fields, got "
                                       f"{_toml_kind(data)}")
    info = field_kinds(cls)
    values: dict[str, Any] = {}
    for name, raw in data.items():
        where = f"{key}.{name}"
        kind = info.get(name)
        if kind is None:
            raise ConfigError(source, where, f"{cls.__name__} has no field {name!r} (fields: "
                                             f"{', '.join(info)})")
        values[name] = _value(kind, raw, where, source)
    return cls(**values)


def _value(kind: tuple[str, Any], raw: Any, where: str, source: str) -> Any:
    what, detail = kind
    if what == "enum":
        return enum_member(detail, raw, where, source)
    if what == "table":
        return _build(detail, raw, where, source)
    if what == "tables":
        if not isinstance(raw, list):
            raise ConfigError(source, where, f"expected an array of {detail.__name__} tables, "
                                             f"got {_toml_kind(raw)}")
        return [_build(detail, item, f"{where}[{i}]", source) for i, item in enumerate(raw)]
    if what == "union":
        raise ConfigError(source, where, "a union field cannot be written in TOML")
    if what == "values":
        if not isinstance(raw, list):
            raise ConfigError(source, where, f"expected an array, got {_toml_kind(raw)}")
        return raw
    if detail is not None and not _same_kind(detail, raw):
        raise ConfigError(source, where, f"expected {_toml_kind(detail, article=True)}, got "
                                         f"{_toml_kind(raw)} {raw!r}")
    return raw


def enum_member(enum_cls: type, raw: Any, where: str, source: str):
    """A member of `enum_cls` by name (case-insensitive) or by number."""
    if isinstance(raw, str):
        for member in enum_cls:
            if member.name.lower() == raw.lower():
                return member
    elif isinstance(raw, int) and not isinstance(raw, bool):
        try:
            return enum_cls(raw)
        except ValueError:
            pass
    raise ConfigError(source, where, f"{raw!r} is not a {enum_cls.__name__} (one of "
                                     f"{', '.join(m.name for m in enum_cls)})")


def _same_kind(default: Any, raw: Any) -> bool:
    if isinstance(default, bool):
        return isinstance(raw, bool)
    if isinstance(default, int):
        return isinstance(raw, int) and not isinstance(raw, bool)
    if isinstance(default, float):
        return isinstance(raw, (int, float)) and not isinstance(raw, bool)
    return isinstance(raw, type(default))


_TOML_KINDS = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
               (list, "array"), (Mapping, "table"))


def _toml_kind(value: Any, article: bool = False) -> str:
    word = next((w for t, w in _TOML_KINDS if isinstance(value, t)), type(value).__name__)
    if not article:
        return word
    return ("an " if word[0] in "aeiou" else "a ") + word


@functools.lru_cache(maxsize=None)
def field_kinds(cls: type) -> dict[str, tuple[str, Any]]:
    """field -> (what, detail): ("enum", Enum) | ("table", cls) | ("tables", cls) |
    ("values", None) | ("union", None) | ("scalar", default or None when optional)."""
    blank = cls()
    out: dict[str, tuple[str, Any]] = {}
    for name in cls.FIELDS:
        if name in cls.UNION_FIELDS:
            out[name] = ("union", None)
            continue
        default = getattr(blank, name)
        if isinstance(default, enum.Enum):
            out[name] = ("enum", type(default))
        elif isinstance(default, (tuple, list)):
            nested = _probe(cls, name, [{}])
            out[name] = ("tables", type(nested[0])) if nested else ("values", None)
        elif default is None:
            nested = _probe(cls, name, {})
            out[name] = ("table", type(nested)) if nested is not None else ("scalar", None)
        else:
            out[name] = ("scalar", default)
    return out


def _probe(cls: type, name: str, value: Any):
    """Encode `cls` with `name` = value and read the field back: a table view (or a list of
    them) when the field holds tables, None when the codec refuses the value."""
    try:
        data = codec.encode_root(cls(**{name: value}))
    except (codec.EncodeError, TypeError):
        return None
    read = getattr(codec.decode_root(cls, data), name)
    if isinstance(read, codec.Table) or (read and isinstance(read[0], codec.Table)):
        return read
    return None
