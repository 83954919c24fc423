"""Keep schema/shipped_layout.json: the wire layout every shipped table, enum and union
has, so that a later edit can only grow them at the end.

    python tools/ship_layout.py           # record new tables / trailing fields / members
    python tools/ship_layout.py --check   # exit 1 if the schema has anything unrecorded

It never rewrites what is recorded: a field moved, retyped, renamed or removed, an enum
value changed, or a union member moved is an error naming it (tests/test_wire_layout.py
runs the same comparison). Recording a field is shipping it: do it when the schema change
is final.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fbs import Enum, Table, Union, parse
from gen_codec import canon

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = os.path.join(ROOT, "schema", "messages.fbs")
LOCK = os.path.join(ROOT, "schema", "shipped_layout.json")


def type_name(t) -> str:
    """A field's type as the lock spells it: canonical scalars, [T], union U."""
    if t.kind == "vector":
        return f"[{type_name(t.elem)}]"
    if t.kind == "union":
        return f"union {t.decl.name}"
    if t.kind == "scalar":
        return canon(t.name)
    return t.name


def default_of(f):
    if f.optional or f.type.kind not in ("scalar", "enum"):
        return None
    if f.type.kind == "enum":
        return next((n for n, v, _ in f.type.decl.values if v == f.default), f.default)
    return f.default


def field_row(f) -> dict:
    return {"name": f.name, "type": type_name(f.type), "default": default_of(f),
            "deprecated": f.deprecated}


def layout(schema) -> dict:
    """{"tables": {name: [field rows]}, "enums": {name: {member: value}},
    "unions": {name: [members]}} of a parsed schema."""
    return {
        "tables": {t.name: [field_row(f) for f in t.fields] for t in schema.of(Table)},
        "enums": {e.name: {n: v for n, v, _ in e.values} for e in schema.of(Enum)},
        "unions": {u.name: [m for m, _ in u.members] for u in schema.of(Union)},
    }


def differences(shipped: dict, current: dict) -> list[str]:
    """What `current` changed in `shipped` (anything but growth at the end)."""
    out = []
    for name, fields in shipped["tables"].items():
        now = current["tables"].get(name)
        if now is None:
            out.append(f"table {name} was removed or renamed")
            continue
        for i, f in enumerate(fields):
            if i >= len(now):
                out.append(f"table {name}: field {f['name']} (slot {i}) was removed")
                break
            if now[i] != f:
                out.append(f"table {name}: field {i} is {now[i]}, shipped as {f}")
                break
    for name, members in shipped["enums"].items():
        now = current["enums"].get(name)
        if now is None:
            out.append(f"enum {name} was removed or renamed")
            continue
        for member, value in members.items():
            if now.get(member) != value:
                out.append(f"enum {name}.{member}: {now.get(member)}, shipped as {value}")
    for name, members in shipped["unions"].items():
        now = current["unions"].get(name)
        if now is None or now[:len(members)] != members:
            out.append(f"union {name}: members {now}, shipped as {members} (append only)")
    return out


def grown(shipped: dict, current: dict) -> dict:
    """`shipped` plus what `current` added (new tables, trailing fields, new members)."""
    out = json.loads(json.dumps(shipped))
    for kind in ("tables", "enums", "unions"):
        for name, value in current[kind].items():
            out[kind][name] = value
    return out


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def load_lock(path: str = LOCK) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def render(lock: dict) -> str:
    """JSON with one line per field row, enum and union (readable diffs)."""
    def one(x):
        return json.dumps(x, ensure_ascii=False, sort_keys=True)
    parts = []
    for kind in ("tables", "enums", "unions"):
        items = []
        for name in sorted(lock[kind]):
            value = lock[kind][name]
            if kind == "tables":
                rows = ",\n".join(f"   {one(r)}" for r in value)
                items.append(f"  {one(name)}: [\n{rows}\n  ]" if value else f"  {one(name)}: []")
            else:
                items.append(f"  {one(name)}: {one(value)}")
        parts.append(f" {one(kind)}: {{\n" + ",\n".join(items) + "\n }")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail if anything is unrecorded")
    args = ap.parse_args(argv)
    current = layout(parse(SCHEMA))
    shipped = load_lock() if os.path.exists(LOCK) else {"tables": {}, "enums": {}, "unions": {}}
    problems = differences(shipped, current)
    if problems:
        print("the schema changes what was shipped:\n  " + "\n  ".join(problems),
              file=sys.stderr)
        return 1
    text = render(grown(shipped, current))
    if args.check:
        if not os.path.exists(LOCK) or _read(LOCK) != text:
            print(f"{LOCK} does not record the whole schema: run tools/ship_layout.py",
                  file=sys.stderr)
            return 1
        return 0
    with open(LOCK, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {LOCK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
