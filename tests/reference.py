"""The reference side of the conformance tests: the official FlatBuffers runtime.

flatc generates the official Python object API (`<Name>T` classes) from
schema/messages.fbs at test time. Everything here is driven by the parsed schema
(tools/fbs.py), so one set of helpers covers every table:

- `Reference.pack_root/pack_frame`: a *value tree* (the keyword-argument shape our
  codec takes: {field: value}, missing key = absent field; nested tables and union
  members as dicts, unions as {"Member": {...}}, structs as tuples) -> official bytes.
- `Reference.read_root/read_frame`: official bytes -> the plain shape our `to_dict()`
  gives (strings as str, absent string "", absent vector [] / b"", absent table None).
- `Reference.expected`: the same plain shape computed from the value tree alone
  (defaults filled in, float32 rounding applied).
- `Reference.trees`: hypothesis strategies of random value trees for any table;
  `Reference.full_tree`: a deterministic tree with every field set.
- `Reference.flatc_binary`: the same tree built by flatc's C++ builder (`flatc -b`),
  whose layout differs from the Python runtime's.
"""
from __future__ import annotations

import functools
import importlib
import json
import os
import shutil
import struct
import subprocess
import sys

import flatbuffers
import numpy as np
from hypothesis import strategies as st

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA_DIR = os.path.join(ROOT, "schema")
MAIN_SCHEMA = os.path.join(SCHEMA_DIR, "messages.fbs")
sys.path.insert(0, os.path.join(ROOT, "tools"))

from fbs import INT_RANGES, SCALARS, Table, parse  # noqa: E402,F401 (Table: for tests)

MAX_DEPTH = 4           # table nesting below a generated root
FLOAT_TYPES = ("float", "float32", "double", "float64")


# ---------------------------------------------------------------------------
# flatc

def flatc_path() -> str:
    local = os.path.join(os.path.dirname(sys.executable), "flatc")
    path = local if os.path.exists(local) else shutil.which("flatc")
    if not path:
        raise RuntimeError("flatc not found next to the interpreter nor on PATH")
    return path


def run_flatc(args, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([flatc_path(), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def generate_python(outdir: str) -> str:
    """flatc's official Python object API for the whole schema, into outdir."""
    r = run_flatc(["--python", "--gen-object-api", "--gen-all", "-o", outdir, MAIN_SCHEMA])
    if r.returncode != 0:
        raise RuntimeError(f"flatc failed: {r.stdout}{r.stderr}")
    return outdir


def link_generated_modules(pkg_dir: str):
    """flatc 25.12's multi-file Python output uses other files' classes (LoraAdapter,
    NodeParamsCreator, ...) without importing them: give every module every class."""
    names = sorted(f[:-3] for f in os.listdir(pkg_dir) if f.endswith(".py") and f != "__init__.py")
    mods = [importlib.import_module(f"Tryll.{n}") for n in names]
    shared = {k: v for m in mods for k, v in vars(m).items()
              if getattr(v, "__module__", None) == m.__name__
              and (isinstance(v, type) or k.endswith("Creator"))}
    for m in mods:
        for k, v in shared.items():
            m.__dict__.setdefault(k, v)


def load_schema():
    return parse(MAIN_SCHEMA)


# ---------------------------------------------------------------------------
# schema helpers

def live_fields(decl):
    return [f for f in decl.fields if not f.deprecated]


def camel(name: str) -> str:
    """flatc's object-API attribute name: agent_id -> agentId."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def pascal(name: str) -> str:
    """flatc's reader accessor name: agent_id -> AgentId."""
    c = camel(name)
    return c[:1].upper() + c[1:]


def is_bytes_vector(t) -> bool:
    """[ubyte] comes back as bytes from our to_dict() (memoryview format 'B')."""
    return (t.kind == "vector" and t.elem.kind in ("scalar", "enum")
            and SCALARS[t.elem.scalar][1] == "B")


def absent_value(f):
    """What our views (and to_dict) give for an absent field."""
    k = f.type.kind
    if k in ("scalar", "enum"):
        return f.default
    if k == "string":
        return ""
    if k == "vector":
        return b"" if is_bytes_vector(f.type) else []
    return None     # table, struct, union


def is_default(f, v) -> bool:
    return f.type.kind in ("scalar", "enum") and v == f.default


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def first_difference(a: bytes, b: bytes) -> str:
    """A readable description of where two buffers differ (for assert messages)."""
    n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return (f"ours {len(a)} bytes, official {len(b)} bytes; first difference at offset {n}: "
            f"ours {a[n:n + 16].hex(' ')} | official {b[n:n + 16].hex(' ')}")


# ---------------------------------------------------------------------------

class Reference:
    """Official object-API classes, addressed through the parsed schema."""

    def __init__(self, schema, gen_dir: str):
        self.schema = schema
        if gen_dir not in sys.path:
            sys.path.insert(0, gen_dir)
        link_generated_modules(os.path.join(gen_dir, "Tryll"))
        self.file_ids = {root: fid.encode() for root, fid, _ in schema.roots if fid}
        self.message_body = next(f for f in schema.decls["Message"].fields if f.name == "body")

    # -- generated modules -------------------------------------------------
    @functools.cache
    def module(self, name):
        return importlib.import_module(f"Tryll.{name}")

    def T(self, name):
        return getattr(self.module(name), name + "T")

    def reader(self, name):
        return getattr(self.module(name), name)

    def decl(self, name):
        return self.schema.decls[name]

    # -- value tree -> official objects -> bytes ---------------------------
    def to_object(self, decl, tree):
        obj = self.T(decl.name)()
        for f in live_fields(decl):
            if tree.get(f.name) is None:
                continue
            v = tree[f.name]
            attr = camel(f.name)
            k = f.type.kind
            if k == "union":
                (member, sub), = v.items()
                setattr(obj, attr + "Type", dict(f.type.decl.members)[member])
                setattr(obj, attr, self.to_object(self.decl(member), sub))
            elif k == "table":
                setattr(obj, attr, self.to_object(f.type.decl, v))
            elif k == "struct":
                setattr(obj, attr, self.struct_object(f.type.decl, v))
            elif k == "vector":
                setattr(obj, attr, self.vector_object(f.type.elem, v))
            else:
                setattr(obj, attr, v)
        return obj

    def struct_object(self, decl, value):
        obj = self.T(decl.name)()
        for f, x in zip(decl.fields, tuple(value)):
            setattr(obj, camel(f.name), self.struct_object(f.type.decl, x)
                    if f.type.kind == "struct" else x)
        return obj

    def vector_object(self, elem, v):
        if elem.kind == "table":
            return [self.to_object(elem.decl, x) for x in v]
        if elem.kind == "struct":
            return [self.struct_object(elem.decl, x) for x in v]
        if isinstance(v, np.ndarray):
            return v            # Pack() takes the CreateNumpyVector path
        return list(v)          # bytes -> ints, tuples -> lists

    def pack_root(self, name, tree, size_prefix=False) -> bytes:
        """Official bytes of `tree` as a standalone root (with file_identifier if declared)."""
        b = flatbuffers.Builder(0)
        off = self.to_object(self.decl(name), tree).Pack(b)
        finish = b.FinishSizePrefixed if size_prefix else b.Finish
        finish(off, file_identifier=self.file_ids.get(name))
        return bytes(b.Output())

    def pack_frame(self, member, tree) -> bytes:
        """Official frame: MessageT{body: member} with FinishSizePrefixed."""
        b = flatbuffers.Builder(0)
        msg = self.to_object(self.decl("Message"), {"body": {member: tree}})
        b.FinishSizePrefixed(msg.Pack(b))
        return bytes(b.Output())

    # -- official bytes -> plain data --------------------------------------
    def read_root(self, name, data):
        return self.plain(self.decl(name), self.T(name).InitFromPackedBuf(data, 0))

    def read_frame(self, frame):
        return self.plain(self.decl("Message"), self.T("Message").InitFromPackedBuf(frame, 4))

    def plain(self, decl, obj):
        out = {}
        for f in live_fields(decl):
            v = getattr(obj, camel(f.name))
            k = f.type.kind
            if k == "string":
                out[f.name] = "" if v is None else v.decode("utf-8")
            elif k == "table":
                out[f.name] = None if v is None else self.plain(f.type.decl, v)
            elif k == "struct":
                out[f.name] = None if v is None else self.plain_struct(f.type.decl, v)
            elif k == "union":
                tag = getattr(obj, camel(f.name) + "Type")
                if v is None or tag == 0:
                    out[f.name] = None
                else:
                    member = f.type.decl.members[tag - 1][0]
                    out[f.name] = {member: self.plain(self.decl(member), v)}
            elif k == "vector":
                out[f.name] = self.plain_vector(f.type, v)
            else:
                out[f.name] = v
        return out

    def plain_struct(self, decl, obj):
        return tuple(self.plain_struct(f.type.decl, getattr(obj, camel(f.name)))
                     if f.type.kind == "struct" else getattr(obj, camel(f.name))
                     for f in decl.fields)

    def plain_vector(self, t, v):
        e = t.elem
        if v is None:
            v = []
        if e.kind == "table":
            return [self.plain(e.decl, x) for x in v]
        if e.kind == "struct":
            return [self.plain_struct(e.decl, x) for x in v]
        if e.kind == "string":
            return [x.decode("utf-8") for x in v]
        items = v.tolist() if isinstance(v, np.ndarray) else list(v)
        return bytes(items) if is_bytes_vector(t) else items

    # -- the official table API (no object API) -----------------------------
    def official_body(self, frame):
        """The official reader object of a frame's body (e.g. Tryll.AudioBuffer)."""
        msg = self.reader("Message").GetRootAs(frame, 4)
        member = self.message_body.type.decl.members[msg.BodyType() - 1][0]
        body, tab = self.reader(member)(), msg.Body()
        body.Init(tab.Bytes, tab.Pos)
        return body

    def official_root(self, name, data):
        """The official reader object of a standalone root (e.g. Tryll.AnswerText)."""
        return self.reader(name).GetRootAs(data, 0)

    @staticmethod
    def official_present(obj, field) -> bool:
        """Whether official reader object `obj` sees string/vector `field` as present."""
        acc = pascal(field)
        if hasattr(obj, acc + "IsNone"):
            return not getattr(obj, acc + "IsNone")()
        return getattr(obj, acc)() is not None

    def official_nested_snapshot(self, frame):
        """The body's nested_flatbuffer field, read by the official `...NestedRoot()`."""
        body = self.official_body(frame)
        decl = self.decl(type(body).__name__)
        f = next(f for f in decl.fields if "nested_flatbuffer" in f.attrs)
        root = f.attrs["nested_flatbuffer"]
        nested = getattr(body, pascal(f.name) + "NestedRoot")()
        return self.plain(self.decl(root), self.T(root).InitFromObj(nested))

    def tree_with_payload(self, member, field, target, base):
        """`base` plus the longest scalar vector `field` whose official frame payload
        (after the 4-byte length) is exactly `target` bytes (zeros as placeholder)."""
        f = next(f for f in self.decl(member).fields if f.name == field)
        dtype = np.dtype(SCALARS[f.type.elem.scalar][1])

        def payload(n):
            return len(self.pack_frame(member, {**base, field: np.zeros(n, dtype)})) - 4
        guess = (target - payload(0)) // dtype.itemsize
        for n in range(guess + 4, max(guess - 5, -1), -1):
            if payload(n) == target:
                return {**base, field: np.zeros(n, dtype)}
        raise AssertionError(f"no {member}.{field} length gives a {target}-byte payload")

    # -- the C++ builder, through `flatc -b` (a different layout) -----------
    def flatc_binary(self, name, tree, workdir) -> bytes:
        """`tree` as JSON, turned into a binary by flatc's own (C++) builder."""
        schema_file = next((os.path.join(SCHEMA_DIR, f) for root, _, f in self.schema.roots
                            if root == name and root in self.file_ids), MAIN_SCHEMA)
        src = os.path.join(workdir, f"{name}.json")
        with open(src, "w", encoding="utf-8") as fh:
            json.dump(self.to_json(self.decl(name), tree), fh, ensure_ascii=False)
        r = run_flatc(["-b", "--json-nested-bytes", "--root-type", f"Tryll.{name}",
                       "-o", workdir, schema_file, src])
        if r.returncode != 0:
            raise RuntimeError(f"flatc -b failed: {r.stdout}{r.stderr}")
        with open(os.path.join(workdir, f"{name}.bin"), "rb") as fh:
            return fh.read()

    def to_json(self, decl, tree):
        out = {}
        for f in live_fields(decl):
            if tree.get(f.name) is None:
                continue
            v, t = tree[f.name], f.type
            if t.kind == "union":
                (member, sub), = v.items()
                out[f.name + "_type"] = member
                out[f.name] = self.to_json(self.decl(member), sub)
            else:
                out[f.name] = self.json_value(t, v)
        return out

    def json_value(self, t, v):
        if t.kind == "table":
            return self.to_json(t.decl, v)
        if t.kind == "struct":
            return {f.name: self.json_value(f.type, x) for f, x in zip(t.decl.fields, tuple(v))}
        if t.kind == "vector":
            return [self.json_value(t.elem, x) for x in v]
        return v

    # -- value tree -> expected plain data ---------------------------------
    def expected(self, decl, tree):
        """What to_dict() of a decoded `tree` must be: defaults filled in. A scalar
        equal to its default is not written, so it reads back as the exact default
        (which matters for float defaults such as 0.15 that float32 cannot hold)."""
        return {f.name: absent_value(f) if tree.get(f.name) is None or is_default(f, tree[f.name])
                else self.expected_value(f.type, tree[f.name]) for f in live_fields(decl)}

    def expected_value(self, t, v):
        k = t.kind
        if k == "scalar":
            if t.name in ("float", "float32"):
                return f32(v)
            return float(v) if t.name in FLOAT_TYPES else (bool(v) if t.name == "bool" else int(v))
        if k == "enum":
            return int(v)
        if k == "string":
            return v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else v
        if k == "table":
            return self.expected(t.decl, v)
        if k == "struct":
            return tuple(self.expected_value(f.type, x) for f, x in zip(t.decl.fields, tuple(v)))
        if k == "union":
            (member, sub), = v.items()
            return {member: self.expected(self.decl(member), sub)}
        v = v.tolist() if isinstance(v, np.ndarray) else v
        items = [self.expected_value(t.elem, x) for x in v]
        return bytes(items) if is_bytes_vector(t) else items

    # -- hypothesis strategies ---------------------------------------------
    @functools.cache
    def trees(self, name, depth=0):
        """Random value trees for table `name`: every field absent or present."""
        optional = {}
        for f in live_fields(self.decl(name)):
            s = self.field_values(f, depth)
            if s is not None:
                optional[f.name] = s
        return st.fixed_dictionaries({}, optional=optional)

    def field_values(self, f, depth):
        t = f.type
        if "nested_flatbuffer" in f.attrs:
            root = f.attrs["nested_flatbuffer"]
            if depth >= MAX_DEPTH:
                return st.just(b"")
            return st.one_of(st.just(b""), self.trees(root, depth + 1).map(
                functools.partial(self.pack_root, root)))
        if t.kind == "vector":
            return self.vector_values(t.elem, depth)
        return self.values(t, depth)

    def values(self, t, depth):
        k = t.kind
        if k == "scalar":
            return scalar_values(t.name)
        if k == "enum":
            return st.sampled_from([v for _, v, _ in t.decl.values])
        if k == "string":
            return TEXT
        if k == "struct":
            return st.tuples(*(self.values(f.type, depth) for f in t.decl.fields))
        if depth >= MAX_DEPTH:
            return None
        if k == "table":
            return self.trees(t.decl.name, depth + 1)
        if k == "union":
            return st.one_of([self.trees(m, depth + 1).map(functools.partial(_wrap, m))
                              for m, _ in t.decl.members])
        raise AssertionError(t)

    def vector_values(self, e, depth):
        if e.kind in ("scalar", "enum") and SCALARS[e.scalar][1] == "B":
            return st.binary(max_size=12)
        if e.kind == "table":
            if depth >= MAX_DEPTH:
                return None
            return st.lists(self.trees(e.decl.name, depth + 1), max_size=2)
        size = 3 if e.kind == "string" else 6
        return st.lists(self.values(e, depth), max_size=size)

    # -- a deterministic tree with every field present ----------------------
    def full_tree(self, name, seed=1, depth=0):
        """Every field present with a non-default value (union: the member picked by seed)."""
        tree = {}
        for i, f in enumerate(live_fields(self.decl(name))):
            v = self.full_value(f, seed + i, depth)
            if v is not None:
                tree[f.name] = v
        return tree

    def full_value(self, f, seed, depth):
        t = f.type
        if "nested_flatbuffer" in f.attrs:
            root = f.attrs["nested_flatbuffer"]
            return self.pack_root(root, self.full_tree(root, seed, depth + 1))
        if t.kind == "vector":
            e = t.elem
            if e.kind == "table":
                if depth >= MAX_DEPTH:
                    return None
                return [self.full_tree(e.decl.name, seed + j, depth + 1) for j in range(2)]
            vals = [self.sample(e, seed + j) for j in range(3)]
            return bytes(vals) if is_bytes_vector(t) else vals
        if t.kind == "table":
            return None if depth >= MAX_DEPTH else self.full_tree(t.decl.name, seed, depth + 1)
        if t.kind == "union":
            if depth >= MAX_DEPTH:
                return None
            member = t.decl.members[seed % len(t.decl.members)][0]
            return {member: self.full_tree(member, seed, depth + 1)}
        v = self.sample(t, seed)
        if t.kind in ("scalar", "enum") and v == f.default:
            v = self.sample(t, seed + 1)
        return v

    def sample(self, t, seed):
        """A deterministic value of type t (cycles through extremes and texts)."""
        k = t.kind
        if k == "string":
            return SAMPLE_TEXTS[seed % len(SAMPLE_TEXTS)]
        if k == "enum":
            vals = [v for _, v, _ in t.decl.values]
            return vals[seed % len(vals)]
        if k == "struct":
            return tuple(self.sample(f.type, seed + i) for i, f in enumerate(t.decl.fields))
        name = t.name
        if name == "bool":
            return seed % 2 == 0
        if name in ("float", "float32"):
            return [1.5, -0.25, 3.4028234663852886e38, 1e-45, 7.0, float("inf")][seed % 6]
        if name in ("double", "float64"):
            return [2.5e300, -1.0 / 3, 5e-324, 42.0][seed % 4]
        lo, hi = INT_RANGES[name]
        return [hi, lo if lo else 1, hi - 1, (lo + hi) // 2 or 7, 1][seed % 5]


def _wrap(member, tree):
    return {member: tree}


SAMPLE_TEXTS = ["héllo wörld", "🙂👍🏽 emoji", "日本語のテキスト", "plain ascii",
                "Ünïcödé — “quotes” ✓", "x"]

TEXT = st.one_of(
    st.just(""),
    st.sampled_from(SAMPLE_TEXTS + ["🏳️‍🌈", "a\x00b", "\U0010ffff", "é" * 40]),
    st.text(st.characters(codec="utf-8"), max_size=12),
)


def extreme(name, end):
    """The smallest (end=0) or largest (end=1) value of a numeric scalar type."""
    if name in ("float", "float32"):
        return (float("-inf"), 3.4028234663852886e38)[end]
    if name in ("double", "float64"):
        return (-1.7976931348623157e308, float("inf"))[end]
    return INT_RANGES[name][end]


def scalar_values(name):
    if name == "bool":
        return st.booleans()
    if name in ("float", "float32"):
        return st.floats(width=32, allow_nan=False)
    if name in ("double", "float64"):
        return st.floats(allow_nan=False)
    lo, hi = INT_RANGES[name]
    return st.one_of(st.sampled_from(sorted({lo, hi, 0, lo + 1, hi - 1})), st.integers(lo, hi))
