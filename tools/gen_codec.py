"""Generate tryll_fast/codec/_generated.pxi and its per-schema-file parts (and the .pyi
stub) from schema/.

    python tools/gen_codec.py            # write the files
    python tools/gen_codec.py --check    # exit 1 if the checked-in output is stale

For every table: a class (a lazy view over a decoded buffer, or a value built
from keyword arguments), a verifier, a view constructor and a builder that
follows flatc's object-API `Pack()` order. Enums and unions become IntEnums.
The hand-written primitives these call live in reader.pxi / builder.pxi.
"""
from __future__ import annotations

import hashlib
import keyword
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import checked_in  # noqa: E402
from fbs import INT_RANGES, SCALARS, Enum, Schema, Struct, Table, Union, parse  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = os.path.join(ROOT, "schema", "messages.fbs")
OUT_DIR = os.path.join(ROOT, "tryll_fast", "codec")
OUT_PYI = os.path.join(ROOT, "tryll_fast", "codec", "_codec.pyi")

# scalar name -> (C type, load fn, Builder.add_* method, cast for storing)
C = {
    "bool": ("bint", "tf_ld_u8", "add_u8", "uint8_t"),
    "byte": ("int8_t", "tf_ld_i8", "add_u8", "uint8_t"),
    "ubyte": ("uint8_t", "tf_ld_u8", "add_u8", "uint8_t"),
    "short": ("int16_t", "tf_ld_i16", "add_u16", "uint16_t"),
    "ushort": ("uint16_t", "tf_ld_u16", "add_u16", "uint16_t"),
    "int": ("int32_t", "tf_ld_i32", "add_u32", "uint32_t"),
    "uint": ("uint32_t", "tf_ld_u32", "add_u32", "uint32_t"),
    "long": ("int64_t", "tf_ld_i64", "add_u64", "uint64_t"),
    "ulong": ("uint64_t", "tf_ld_u64", "add_u64", "uint64_t"),
    "float": ("float", "tf_ld_f32", "add_f32", "double"),
    "double": ("double", "tf_ld_f64", "add_f64", "double"),
}
ALIASES = {"int8": "byte", "uint8": "ubyte", "int16": "short", "uint16": "ushort",
           "int32": "int", "uint32": "uint", "int64": "long", "uint64": "ulong",
           "float32": "float", "float64": "double"}
STORE = {"uint8_t": "tf_st_u8", "uint16_t": "tf_st_u16", "uint32_t": "tf_st_u32",
         "uint64_t": "tf_st_u64"}
PY_TYPE = {"bool": "bool", "float": "float", "double": "float"}


def canon(name):
    return ALIASES.get(name, name)


def pylit(v):
    if isinstance(v, float):
        r = repr(v)
        return {"inf": "float('inf')", "-inf": "float('-inf')", "nan": "float('nan')"}.get(r, r)
    return repr(v)


class Out:
    def __init__(self):
        self.lines = []

    def __call__(self, text="", indent=0):
        pad = "    " * indent
        for line in text.split("\n"):
            self.lines.append((pad + line) if line else "")

    def text(self):
        return "\n".join(self.lines).rstrip() + "\n"


def doc(text, fallback):
    text = (text or fallback).replace('"""', "'''").replace("\\", "\\\\")
    return f'"""{text}"""'


# ---------------------------------------------------------------------------
# scalar helpers


def conv_expr(scalar, x, where):
    """Cython expression converting python object `x` to the stored C value."""
    s = canon(scalar)
    if s == "bool":
        return f"_cv_bool({x}, {where!r})"
    if s in ("float", "double"):
        return f"_cv_float({x}, {where!r})"
    lo, hi = INT_RANGES[s]
    ctype, _, _, store = C[s]
    if lo == 0:
        return f"<{store}>_cv_uint({x}, {hi}u, {where!r})"
    lo_c = "INT64_MIN" if lo == -2**63 else str(lo)   # -2**63 has no C literal
    return f"<{store}><{ctype}>_cv_int({x}, {lo_c}, {hi}, {where!r})"


def default_c(scalar, v):
    s = canon(scalar)
    ctype, _, _, store = C[s]
    if s == "bool":
        return "1" if v else "0"
    if s in ("float", "double"):
        return pylit(float(v))
    if v < 0:
        return f"<{store}><{ctype}>({v})"
    return f"{v}u" if v else "0"


def read_expr(scalar, pos):
    s = canon(scalar)
    ctype, load, _, _ = C[s]
    e = f"{load}(self._src.buf + {pos})"
    return f"{e} != 0" if s == "bool" else e


# ---------------------------------------------------------------------------


class Gen:
    def __init__(self, schema: Schema):
        self.s = schema
        self.o = Out()
        self.tables = schema.of(Table)
        self.structs = schema.of(Struct)
        self.enums = schema.of(Enum)
        self.unions = schema.of(Union)
        self.root_union = None
        for root, _, _ in schema.roots:
            t = schema.decls[root]
            for f in t.fields:
                if f.type.kind == "union" and self.root_union is None and root == "Message":
                    self.root_union = f.type.decl

    def check_names(self):
        bad = {"object", "property", "include", "cdef", "cpdef", "ctypedef", "struct",
               "union", "enum", "extern", "inline", "api", "public", "readonly", "gil",
               "nogil", "new", "operator", "namespace", "self", "cls", "bytes",
               "len", "init", "frame"}
        for t in self.tables + self.structs:
            for f in t.fields:
                if keyword.iskeyword(f.name) or f.name in bad or f.name.startswith("_"):
                    raise SystemExit(f"{t.name}.{f.name}: reserved field name (see CONVENTIONS.md)")
                if f.type.kind == "union" and any(g.name == f.name + "_type" for g in t.fields):
                    raise SystemExit(f"{t.name}.{f.name}_type clashes with the union type field")

    # -- enums and unions -------------------------------------------------
    def gen_enum(self, e: Enum):
        o = self.o
        o(f"class {e.name}(_NamedIntEnum):")
        o(doc(e.doc, f"enum {e.name} : {e.base}"), 1)
        for name, v, _ in e.values:
            pyname = name + "_" if keyword.iskeyword(name) else name
            o(f"{pyname} = {v}", 1)
        o()
        o(f"cdef dict _EV_{e.name} = {{m.value: m for m in {e.name}}}")
        o()
        o()

    def gen_union_enum(self, u: Union):
        o = self.o
        o(f"class {u.name}(_NamedIntEnum):")
        o(doc(u.doc, f"union {u.name}: the tag of each member (NONE = 0)"), 1)
        o("NONE = 0", 1)
        for name, tag in u.members:
            o(f"{name} = {tag}", 1)
        o()
        o(f"cdef dict _EV_{u.name} = {{m.value: m for m in {u.name}}}")
        o()
        o()

    def gen_union_funcs(self, u: Union):
        o = self.o
        n = len(u.members)
        unknown = "UnknownMessageType" if u is self.root_union else "MalformedMessage"
        o(f"cdef _vf_fn _VF_{u.name}[{n + 1}]")
        o(f"cdef _view_fn _VW_{u.name}[{n + 1}]")
        o(f"cdef _bf_fn _BF_{u.name}[{n + 1}]")
        o(f"cdef dict _UTAG_{u.name} = {{}}")
        o(f"cdef tuple _UCLS_{u.name} = (None, {', '.join(m for m, _ in u.members)},)")
        o()
        o(f"cdef _init_{u.name}():")
        o(f"_VF_{u.name}[0] = NULL", 1)
        o(f"_VW_{u.name}[0] = NULL", 1)
        o(f"_BF_{u.name}[0] = NULL", 1)
        for m, tag in u.members:
            o(f"_VF_{u.name}[{tag}] = _vf_{m}", 1)
            o(f"_VW_{u.name}[{tag}] = _vw_{m}", 1)
            o(f"_BF_{u.name}[{tag}] = _bg_{m}", 1)
            o(f"_UTAG_{u.name}[{m}] = {tag}", 1)
        o()
        o(f"_init_{u.name}()")
        o()
        o()
        o(f"cdef inline int _vt_u_{u.name}(uint8_t tag) except -1:")
        o('"""The tag must name a member even when the value is absent."""', 1)
        o(f"if tag > {n}:", 1)
        o(f"raise {unknown}(f\"unknown {u.name} member {{tag}} (this build knows 1..{n})\")", 2)
        o("return 0", 1)
        o()
        o()
        o(f"cdef inline int _vf_u_{u.name}(_V* v, uint8_t tag, Py_ssize_t t, int depth) except -1:")
        o(f"return _VF_{u.name}[tag](v, t, depth)", 1)
        o()
        o()
        o(f"cdef inline uint8_t _tag_{u.name}(object x, str where) except 0:")
        o(f"cdef object tag = _UTAG_{u.name}.get(type(x))", 1)
        o("if tag is None:", 1)
        o(f"raise EncodeError(f\"{{where}}: expected a {u.name} member table, got {{type(x).__name__}}\")", 2)
        o("return <uint8_t>tag", 1)
        o()
        o()
        o(f"cdef object _as_{u.name}(object x, str where):")
        o('"""A member table, or the {"Member": {...}} form that to_dict() gives."""', 1)
        o("cdef object cls", 1)
        o("if isinstance(x, dict) and len(x) == 1:", 1)
        o("(name, fields), = x.items()", 2)
        o(f"cls = {u.name}.__members__.get(name)", 2)
        o("if cls is None or cls == 0:", 2)
        o(f"raise EncodeError(f\"{{where}}: {{name!r}} is not a {u.name} member\")", 3)
        o(f"return _as_table(_UCLS_{u.name}[cls], fields, where)", 2)
        o("return x", 1)
        o()
        o()

    # -- structs -------------------------------------------------------------
    def gen_struct(self, s: Struct):
        o = self.o
        o("@cython.final")
        o(f"cdef class {s.name}(Struct):")
        o(doc(s.doc, f"struct {s.name} ({s.size} bytes)"), 1)
        for f in s.fields:
            o(f"cdef readonly {C[canon(f.type.scalar)][0] if f.type.kind != 'struct' else 'object'} {f.name}", 1)
        o(f"FIELDS = ({', '.join(repr(f.name) for f in s.fields)},)", 1)
        o(f"SIZE = {s.size}", 1)
        o()
        args = ", ".join(f"{f.name}={pylit(f.default) if f.type.kind != 'struct' else 'None'}" for f in s.fields)
        o(f"def __init__(self, {args}):", 1)
        for f in s.fields:
            if f.type.kind == "struct":
                o(f"self.{f.name} = _as_struct_{f.type.decl.name}({f.name}, '{s.name}.{f.name}')", 2)
            else:
                o(f"self.{f.name} = {conv_expr(f.type.scalar, f.name, s.name + '.' + f.name)}", 2)
        o()
        o("def to_tuple(self):", 1)
        o(f"return ({', '.join(('self.' + f.name + '.to_tuple()') if f.type.kind == 'struct' else 'self.' + f.name for f in s.fields)},)", 2)
        o()
        o()
        # reader
        o(f"cdef {s.name} _rs_{s.name}(const uint8_t* p):")
        o(f"cdef {s.name} r = {s.name}.__new__({s.name})", 1)
        for f, off in zip(s.fields, s.offsets):
            if f.type.kind == "struct":
                o(f"r.{f.name} = _rs_{f.type.decl.name}(p + {off})", 1)
            else:
                ctype, load, _, _ = C[canon(f.type.scalar)]
                e = f"{load}(p + {off})"
                o(f"r.{f.name} = {e}", 1)
        o("return r", 1)
        o()
        o()
        # writer (p points at a zeroed, reserved image)
        o(f"cdef int _ws_{s.name}(uint8_t* p, object x, str where) except -1:")
        o(f"cdef {s.name} v = _as_struct_{s.name}(x, where)", 1)
        for f, off in zip(s.fields, s.offsets):
            if f.type.kind == "struct":
                o(f"_ws_{f.type.decl.name}(p + {off}, v.{f.name}, where)", 1)
                continue
            sc = canon(f.type.scalar)
            size = SCALARS[sc][0]
            if sc == "float":
                o(f"tf_st_f32(p + {off}, v.{f.name})", 1)
            elif sc == "double":
                o(f"tf_st_f64(p + {off}, v.{f.name})", 1)
            elif size == 1:
                o(f"p[{off}] = <uint8_t>v.{f.name}", 1)
            else:
                st = {2: "uint16_t", 4: "uint32_t", 8: "uint64_t"}[size]
                o(f"{STORE[st]}(p + {off}, <{st}>v.{f.name})", 1)
        o("return 0", 1)
        o()
        o()
        o(f"cdef {s.name} _as_struct_{s.name}(object x, str where):")
        o(f"if isinstance(x, {s.name}):", 1)
        o("return x", 2)
        o("if isinstance(x, (tuple, list)):", 1)
        o("try:", 2)
        o(f"return {s.name}(*x)", 3)
        o("except TypeError as e:", 2)
        o("raise EncodeError(f\"{where}: {e}\") from None", 3)
        o("if isinstance(x, dict):", 1)
        o("try:", 2)
        o(f"return {s.name}(**x)", 3)
        o("except TypeError as e:", 2)
        o("raise EncodeError(f\"{where}: {e}\") from None", 3)
        o(f"raise EncodeError(f\"{{where}}: expected {s.name}, a tuple or a dict, got {{type(x).__name__}}\")", 1)
        o()
        o()

    # -- tables ----------------------------------------------------------------
    def live(self, t: Table):
        return [f for f in t.fields if not f.deprecated]

    def gen_table_class(self, t: Table):
        o = self.o
        fields = self.live(t)
        # Views hold no reference cycles (a view -> its _Source -> bytes), so
        # they skip the cyclic GC.
        o("@cython.final")
        o("@cython.no_gc")
        o(f"cdef class {t.name}(Table):")
        o(doc(t.doc, f"table {t.name}"), 1)
        for f in fields:
            o(f"cdef object _v_{f.name}", 1)
        o(f"FIELDS = ({''.join(repr(f.name) + ', ' for f in fields)})", 1)
        o(f"UNION_FIELDS = frozenset(({''.join(repr(f.name) + ', ' for f in fields if f.type.kind == 'union')}))", 1)
        o(f"_VOFFSETS = ({''.join(str(f.voffset) + ', ' for f in fields)})", 1)
        # Fields marked `(structural)`: fixed at CreateAgent (ChangeAgentParam -> 3006).
        o(f"STRUCTURAL = frozenset(({''.join(repr(f.name) + ', ' for f in fields if 'structural' in f.attrs)}))", 1)
        o()
        if fields:
            o(f"def __init__(self, *, {', '.join(f.name + '=None' for f in fields)}):", 1)
            for f in fields:
                o(f"self._v_{f.name} = {f.name}", 2)
        else:
            o("def __init__(self):", 1)
            o("pass", 2)
        o()
        for f in fields:
            self.gen_property(t, f)
        o()

    def gen_property(self, t: Table, f):
        o = self.o
        k = f.type.kind
        fdoc = f.doc or f"{f.name}: {f.type}"
        if k == "union":
            u = f.type.decl
            o("@property", 1)
            o(f"def {f.name}_type(self):", 1)
            o(doc("", f"The {u.name} member tag of `{f.name}`."), 2)
            o("cdef Py_ssize_t p", 2)
            o("if self._src is None:", 2)
            o(f"return {u.name}.NONE if self._v_{f.name} is None else {u.name}(_tag_{u.name}(_as_{u.name}(self._v_{f.name}, '{t.name}.{f.name}'), '{t.name}.{f.name}'))", 3)
            o(f"p = _tfield(self, {4 + 2 * (f.slot - 1)}, 1)", 2)
            o("if p == 0:", 2)
            o(f"return {u.name}.NONE", 3)
            o("v = tf_ld_u8(self._src.buf + p)", 2)
            o(f"return _EV_{u.name}.get(v, v)", 2)
            o()
        o("@property", 1)
        o(f"def {f.name}(self):", 1)
        o(doc(fdoc, ""), 2)
        o("cdef Py_ssize_t p", 2)
        if k in ("scalar", "enum") and f.optional:
            # `= null`: absent is None, distinct from every value (flatc's optional scalars)
            sc = canon(f.type.scalar)
            o("if self._src is None:", 2)
            o(f"return self._v_{f.name}", 3)
            o(f"p = _tfield(self, {f.voffset}, {SCALARS[sc][0]})", 2)
            o("if p == 0:", 2)
            o("return None", 3)
            if k == "enum":
                o(f"v = {read_expr(sc, 'p')}", 2)
                o(f"return _EV_{f.type.decl.name}.get(v, v)", 2)
            else:
                o(f"return {read_expr(sc, 'p')}", 2)
        elif k in ("scalar", "enum"):
            sc = canon(f.type.scalar)
            dflt = pylit(f.default)
            if k == "enum":
                e = f.type.decl
                dmember = next((n for n, v, _ in e.values if v == f.default), None)
                dflt = f"{e.name}.{dmember}" if dmember else pylit(f.default)
            o("if self._src is None:", 2)
            o(f"return {dflt} if self._v_{f.name} is None else self._v_{f.name}", 3)
            o(f"p = _tfield(self, {f.voffset}, {SCALARS[sc][0]})", 2)
            o("if p == 0:", 2)
            o(f"return {dflt}", 3)
            if k == "enum":
                o(f"v = {read_expr(sc, 'p')}", 2)
                o(f"return _EV_{f.type.decl.name}.get(v, v)", 2)
            else:
                o(f"return {read_expr(sc, 'p')}", 2)
        elif k == "string":
            o("if self._src is None:", 2)
            o(f"return '' if self._v_{f.name} is None else self._v_{f.name}", 3)
            o(f"return _rd_string(self._src, _tfield(self, {f.voffset}, 4))", 2)
        elif k == "table":
            o("if self._src is None:", 2)
            o(f"return self._v_{f.name}", 3)
            o(f"p = _tfield(self, {f.voffset}, 4)", 2)
            o(f"return _vw_{f.type.decl.name}(self._src, _rd_target(self._src, p)) if p else None", 2)
        elif k == "struct":
            s = f.type.decl
            o("if self._src is None:", 2)
            o(f"return self._v_{f.name}", 3)
            o(f"p = _tfield(self, {f.voffset}, {s.size})", 2)
            o(f"return _rs_{s.name}(self._src.buf + p) if p else None", 2)
        elif k == "union":
            u = f.type.decl
            o("cdef uint8_t tag", 2)
            o("if self._src is None:", 2)
            o(f"return self._v_{f.name}", 3)
            o(f"p = _tfield(self, {4 + 2 * (f.slot - 1)}, 1)", 2)
            o("tag = tf_ld_u8(self._src.buf + p) if p else 0", 2)
            o(f"p = _tfield(self, {f.voffset}, 4)", 2)
            o(f"if p == 0 or tag == 0 or tag > {len(u.members)}:", 2)
            o("return None", 3)
            o(f"return _VW_{u.name}[tag](self._src, _rd_target(self._src, p))", 2)
        elif k == "vector":
            e = f.type.elem
            o("cdef Py_ssize_t target, n, i", 2)
            o("if self._src is None:", 2)
            o(f"return () if self._v_{f.name} is None else self._v_{f.name}", 3)
            o(f"p = _tfield(self, {f.voffset}, 4)", 2)
            if e.kind in ("scalar", "enum"):
                sc = canon(e.scalar)
                size, fmt, _ = SCALARS[sc]
                o(f"return _scalar_vector(self._src, p, {size}, b{fmt!r})", 2)
            else:
                o("if p == 0:", 2)
                o("return ()", 3)
                o("target = _rd_target(self._src, p)", 2)
                if e.kind == "struct":
                    s = e.decl
                    o(f"n = _rd_vec_len(self._src, target, {s.size})", 2)
                    o(f"return tuple([_rs_{s.name}(self._src.buf + target + 4 + {s.size} * i) for i in range(n)])", 2)
                else:
                    o("n = _rd_vec_len(self._src, target, 4)", 2)
                    if e.kind == "string":
                        item = "_rd_string_at(self._src, _rd_target(self._src, target + 4 + 4 * i))"
                    else:
                        item = f"_vw_{e.decl.name}(self._src, _rd_target(self._src, target + 4 + 4 * i))"
                    o(f"return tuple([{item} for i in range(n)])", 2)
        o()

    def gen_table_funcs(self, t: Table):
        o = self.o
        T = t.name
        fields = self.live(t)
        # view
        o(f"cdef Table _vw_{T}(_Source src, Py_ssize_t pos):")
        o(f"cdef {T} t = {T}.__new__({T})", 1)
        o("_bind(t, src, pos)", 1)
        o("return t", 1)
        o()
        o()
        # verifier
        o(f"cdef int _vf_{T}(_V* v, Py_ssize_t t, int depth) except -1:")
        o("cdef Py_ssize_t vt, vs, ts, p, target, n, i", 1)
        o("cdef uint8_t tag", 1)
        o("_v_table(v, t, depth, &vt, &vs, &ts)", 1)
        for f in t.fields:   # deprecated fields are not verified (flatc does the same)
            if f.deprecated:
                continue
            k = f.type.kind
            fo = f"_v_field(v, t, vt, vs, ts, {f.voffset}, %d)"
            if k in ("scalar", "enum"):
                o(fo % SCALARS[canon(f.type.scalar)][0], 1)
            elif k == "struct":
                o(fo % f.type.decl.size, 1)
            elif k == "string":
                o(f"_v_string_field(v, {fo % 4})", 1)
            elif k == "table":
                o(f"p = {fo % 4}", 1)
                o("if p:", 1)
                o(f"_vf_{f.type.decl.name}(v, _v_target(v, p), depth + 1)", 2)
            elif k == "union":
                u = f.type.decl
                o(f"p = _v_field(v, t, vt, vs, ts, {4 + 2 * (f.slot - 1)}, 1)", 1)
                o("tag = v.buf[p] if p else 0", 1)
                o(f"_vt_u_{u.name}(tag)", 1)
                o(f"p = {fo % 4}", 1)
                o("if p and tag:", 1)
                o(f"_vf_u_{u.name}(v, tag, _v_target(v, p), depth + 1)", 2)
            elif k == "vector":
                e = f.type.elem
                o(f"p = {fo % 4}", 1)
                if e.kind in ("scalar", "enum"):
                    nested = f.attrs.get("nested_flatbuffer")
                    if nested:
                        o("if p:", 1)
                        o("target = _v_target(v, p)", 2)
                        o("n = _v_vector(v, target, 1)", 2)
                        o("if n:", 2)
                        o(f"_vf_nested(v, target + 4, n, _vf_{nested}, depth + 1, "
                          f"{t.name + '.' + f.name!r})", 3)
                    else:
                        o(f"_v_scalar_vector(v, p, {SCALARS[canon(e.scalar)][0]})", 1)
                elif e.kind == "struct":
                    o(f"_v_scalar_vector(v, p, {e.decl.size})", 1)
                elif e.kind == "string":
                    o("_v_string_vector(v, p)", 1)
                else:
                    o("if p:", 1)
                    o("target = _v_target(v, p)", 2)
                    o("n = _v_vector(v, target, 4)", 2)
                    o("for i in range(n):", 2)
                    o(f"_vf_{e.decl.name}(v, _v_target(v, target + 4 + 4 * i), depth + 1)", 3)
        o("return 0", 1)
        o()
        o()
        # builder
        o(f"cdef uint32_t _bg_{T}(Builder b, object x) except 0:")
        o(f"return _b_{T}(b, <{T}>x)", 1)
        o()
        o()
        o(f"cdef uint32_t _b_{T}(Builder b, {T} t) except 0:")
        o('"""Same order as flatc\'s object-API Pack(): children, then fields."""', 1)
        offs = [f for f in fields if f.type.kind in ("string", "table", "union", "vector")]
        for f in offs:
            o(f"cdef uint32_t o_{f.name} = 0", 1)
        for f in fields:
            if f.type.kind == "union":
                o(f"cdef uint8_t tag_{f.name} = 0", 1)
        o("cdef object x", 1)
        o("cdef Py_ssize_t base, n, i", 1)
        o("cdef uint8_t* img", 1)
        o("if t._src is not None:", 1)
        o(f"t = _detach(t, {T})", 2)
        for f in offs:
            where = f"{T}.{f.name}"
            k = f.type.kind
            o(f"x = t._v_{f.name}", 1)
            o("if x is not None:", 1)
            if k == "string":
                o(f"o_{f.name} = _cv_string(b, x, {where!r})", 2)
            elif k == "table":
                d = f.type.decl.name
                o(f"o_{f.name} = _b_{d}(b, <{d}>_as_table({d}, x, {where!r}))", 2)
            elif k == "union":
                u = f.type.decl.name
                o(f"x = _as_{u}(x, {where!r})", 2)
                o(f"tag_{f.name} = _tag_{u}(x, {where!r})", 2)
                o(f"o_{f.name} = _BF_{u}[tag_{f.name}](b, x)", 2)
            else:
                e = f.type.elem
                if e.kind in ("scalar", "enum"):
                    sc = canon(e.scalar)
                    size, fmt, _ = SCALARS[sc]
                    nested = f.attrs.get("nested_flatbuffer")
                    if nested:
                        idx = self.tables.index(self.s.decls[nested])
                        o("if not _is_buffer(x):", 2)
                        o(f"x = _nested_bytes(x, {where!r})", 3)
                        o(f"_check_nested(x, {idx}, {where!r})", 2)
                    o("if _is_buffer(x):", 2)
                    o(f"o_{f.name} = _cv_buffer_vector(b, x, {size}, b{fmt!r}, {where!r})", 3)
                    o("else:", 2)
                    o(f"x = _cv_sequence(x, {where!r})", 3)
                    o("n = len(x)", 3)
                    o(f"b.start_vector({size}, n, {size})", 3)
                    o("for i in range(n - 1, -1, -1):", 3)
                    put = {1: "put_u8", 2: "put_u16", 4: "put_u32", 8: "put_u64"}[size]
                    if sc == "float":
                        put = "put_f32"
                    elif sc == "double":
                        put = "put_f64"
                    o(f"b.prep({size}, 0)", 4)
                    o(f"b.{put}({conv_expr(sc, 'x[i]', where + '[]')})", 4)
                    o(f"o_{f.name} = b.end_vector(n)", 3)
                elif e.kind == "struct":
                    s = e.decl
                    o(f"x = _cv_sequence(x, {where!r})", 2)
                    o("n = len(x)", 2)
                    o(f"b.start_vector({s.size}, n, {s.align})", 2)
                    o("for i in range(n - 1, -1, -1):", 2)
                    o(f"b.prep({s.align}, {s.size})", 3)
                    o(f"img = b.reserve({s.size})", 3)
                    o(f"_ws_{s.name}(img, x[i], {where + '[]'!r})", 3)
                    o(f"o_{f.name} = b.end_vector(n)", 2)
                elif e.kind == "string":
                    o(f"x = _cv_sequence(x, {where!r})", 2)
                    o("base = b.n_scratch", 2)
                    o("for item in x:", 2)
                    o(f"b.push_scratch(_cv_string(b, item, {where + '[]'!r}))", 3)
                    o(f"o_{f.name} = b.offsets_vector(base)", 2)
                else:
                    d = e.decl.name
                    o(f"x = _cv_sequence(x, {where!r})", 2)
                    o("base = b.n_scratch", 2)
                    o("for item in x:", 2)
                    o(f"b.push_scratch(_b_{d}(b, <{d}>_as_table({d}, item, {where + '[]'!r})))", 3)
                    o(f"o_{f.name} = b.offsets_vector(base)", 2)
        o(f"b.start_object({t.nslots})", 1)
        for f in fields:
            k = f.type.kind
            where = f"{T}.{f.name}"
            if k in ("scalar", "enum"):
                sc = canon(f.type.scalar)
                _, _, add, _ = C[sc]
                o(f"x = t._v_{f.name}", 1)
                o("if x is not None:", 1)
                if f.optional:      # a set optional scalar is written even when it is 0
                    o(f"b.{add.replace('add_', 'set_')}({f.slot}, {conv_expr(sc, 'x', where)})", 2)
                else:
                    o(f"b.{add}({f.slot}, {conv_expr(sc, 'x', where)}, "
                      f"{default_c(sc, f.default)})", 2)
            elif k == "union":
                o(f"b.add_u8({f.slot - 1}, tag_{f.name}, 0)", 1)
                o(f"if o_{f.name}:", 1)
                o(f"b.add_offset({f.slot}, o_{f.name})", 2)
            elif k == "struct":
                s = f.type.decl
                o(f"x = t._v_{f.name}", 1)
                o("if x is not None:", 1)
                o(f"b.prep({s.align}, {s.size})", 2)
                o(f"img = b.reserve({s.size})", 2)
                o(f"_ws_{s.name}(img, x, {where!r})", 2)
                o(f"b.slot({f.slot})", 2)
            else:
                o(f"if o_{f.name}:", 1)
                o(f"b.add_offset({f.slot}, o_{f.name})", 2)
        o("return b.end_object()", 1)
        o()
        o()

    def gen_dispatch(self):
        """Index every table so decode_root()/encode_root() reach any of them."""
        o = self.o
        n = len(self.tables)
        o("# Any table as a standalone root (snapshots, conformance tests).")
        o(f"cdef _vf_fn _VF_ALL[{n}]")
        o(f"cdef _view_fn _VW_ALL[{n}]")
        o(f"cdef _bf_fn _BF_ALL[{n}]")
        o("cdef dict _TINDEX = {}")
        o()
        o("cdef _init_all():")
        for i, t in enumerate(self.tables):
            o(f"_VF_ALL[{i}] = _vf_{t.name}", 1)
            o(f"_VW_ALL[{i}] = _vw_{t.name}", 1)
            o(f"_BF_ALL[{i}] = _bg_{t.name}", 1)
            o(f"_TINDEX[{t.name}] = {i}", 1)
        o()
        o("_init_all()")
        o()
        ids = ", ".join(f"{root}: {('b' + repr(fid)) if fid else 'None'}"
                        for root, fid, _ in self.s.roots)
        o(f"cdef dict _FILE_IDS = {{{ids}}}")
        o()

    def generate(self) -> dict[str, str]:
        """{file name: text}: `_generated.pxi`, which includes, per schema file, its types
        (`_gen_<file>_types.pxi`: enums, structs, table classes) and then its code
        (`_gen_<file>_code.pxi`: verifiers, views, builders, union tables)."""
        self.check_names()
        outs: dict[str, Out] = {}
        stems = [os.path.splitext(os.path.basename(f))[0] for f in self.s.files]

        def use(name: str, title: str | None = None) -> None:
            first = name not in outs
            self.o = outs.setdefault(name, Out())
            if first and title:
                self.o(f"# GENERATED by tools/gen_codec.py from schema/{title} -- do not edit.")
                self.o()

        def of(decls, stem):
            return [d for d in decls if os.path.splitext(d.file)[0] == stem]

        for stem in stems:
            use(f"_gen_{stem}_types.pxi", f"{stem}.fbs: its enums, structs and tables")
            for e in of(self.enums, stem):
                self.gen_enum(e)
            for u in of(self.unions, stem):
                self.gen_union_enum(u)
            for st in of(self.structs, stem):
                self.gen_struct(st)
            for t in of(self.tables, stem):
                self.gen_table_class(t)
        for stem in stems:
            use(f"_gen_{stem}_code.pxi", f"{stem}.fbs: verifiers, views and builders")
            for t in of(self.tables, stem):
                self.gen_table_funcs(t)
            for u in of(self.unions, stem):
                self.gen_union_funcs(u)
        use("_generated.pxi")
        o = self.o
        o("# GENERATED by tools/gen_codec.py from schema/*.fbs -- do not edit.")
        o("# Regenerate with `python tools/gen_codec.py`; tests fail if it is stale.")
        o()
        o("from enum import Enum, IntEnum")
        o()
        o()
        o("class _NamedIntEnum(IntEnum):")
        o('"""An IntEnum that prints its name (ModelStatus.Downloaded), not its number."""', 1)
        o("__str__ = Enum.__str__", 1)
        o("__format__ = Enum.__format__", 1)
        o()
        o()
        o("ctypedef int (*_vf_fn)(_V*, Py_ssize_t, int) except -1")
        o("ctypedef Table (*_view_fn)(_Source, Py_ssize_t)")
        o("ctypedef uint32_t (*_bf_fn)(Builder, object) except 0")
        o()
        o("# Every file's types before any file's code: the code uses the types of all.")
        for stem in stems:
            if f"_gen_{stem}_types.pxi" in outs:
                o(f'include "_gen_{stem}_types.pxi"')
        for stem in stems:
            if f"_gen_{stem}_code.pxi" in outs:
                o(f'include "_gen_{stem}_code.pxi"')
        o()
        o()
        self.gen_dispatch()
        names = [d.name for d in self.enums + self.unions + self.structs + self.tables]
        o("TABLES = (" + "".join(f"{t.name}, " for t in self.tables) + ")")
        o("STRUCTS = (" + "".join(f"{st.name}, " for st in self.structs) + ")")
        o("ENUMS = (" + "".join(f"{e.name}, " for e in self.enums) + ")")
        o("UNIONS = (" + "".join(f"{u.name}, " for u in self.unions) + ")")
        o(f"GENERATED_NAMES = {tuple(names)!r}")
        # ConnectionReady.codegen_fingerprint: which schema this build speaks
        o(f"SCHEMA_FINGERPRINT = {self.fingerprint()!r}")
        return {name: out.text() for name, out in outs.items()}

    def fingerprint(self):
        """sha256 (first 16 hex digits) of the schema files' bytes, in include order."""
        h = hashlib.sha256()
        for path in self.s.files:
            with open(path, "rb") as f:
                h.update(f.read())
        return h.hexdigest()[:16]

    def stub(self):
        """A .pyi so editors and mypy see the generated API."""
        o = Out()
        o("# GENERATED by tools/gen_codec.py -- do not edit.")
        o("from enum import IntEnum")
        o("from typing import Any, Optional, Sequence")
        o()
        o("MAX_FRAME: int")
        o("SCHEMA_FINGERPRINT: str")
        o("from tryll_fast.errors import FrameTooLarge as FrameTooLarge")
        o("from tryll_fast.errors import MalformedMessage as MalformedMessage")
        o("from tryll_fast.errors import ProtocolError as CodecError")
        o("from tryll_fast.errors import UnknownMessageType as UnknownMessageType")
        o("class FramingError(CodecError): ...")
        o("class EncodeError(CodecError, TypeError): ...")
        o("class Table:\n    FIELDS: tuple[str, ...]\n    STRUCTURAL: frozenset[str]\n"
          "    is_view: bool\n    def to_dict(self) -> dict[str, Any]: ...")
        o("class Struct:\n    FIELDS: tuple[str, ...]\n    def to_tuple(self) -> tuple: ...")
        o("class FrameSplitter:\n    pending: int\n    def feed(self, data: bytes) -> list[bytes]: ...")
        o("def decode(data: Any, offset: int = 0, length: int = -1) -> Message: ...")
        o("def decode_frame(frame: Any) -> Message: ...")
        o("def encode(body: Table) -> bytes: ...")
        o("def encode_root(table: Table, size_prefix: bool = False) -> bytes: ...")
        o("def decode_root(cls: type, data: Any) -> Any: ...")
        o("def peek_body_type(payload: Any) -> int: ...")
        o("def peek_request_id(payload: Any) -> int: ...")
        o("def answer_text_of(frame: Any) -> tuple[int, str] | None: ...")
        o("def encode_answer_text(request_id: int, agent_id: int, node_name: str, text: str,"
          " is_delta: bool, is_final: bool) -> bytes: ...")
        o("def encode_tts_audio(request_id: int, agent_id: int, node_name: str, samples: Any,"
          " chunk_samples: int, first_offset: int, sentence_index: int) -> list[bytes]: ...")
        o()
        for e in self.enums + self.unions:
            o(f"class {e.name}(IntEnum):")
            if isinstance(e, Union):
                o("NONE = 0", 1)
                for m, tag in e.members:
                    o(f"{m} = {tag}", 1)
            else:
                for n, v, _ in e.values:
                    o(f"{n + '_' if keyword.iskeyword(n) else n} = {v}", 1)
        for s in self.structs:
            o(f"class {s.name}(Struct):")
            for f in s.fields:
                o(f"{f.name}: {PY_TYPE.get(canon(f.type.scalar), 'int') if f.type.kind != 'struct' else f.type.decl.name}", 1)
            o(f"def __init__(self, {', '.join(f.name + ': Any = ...' for f in s.fields)}) -> None: ...", 1)
        for t in self.tables:
            fields = self.live(t)
            o(f"class {t.name}(Table):")
            for f in fields:
                o(f"{f.name}: {self.pytype(f.type, f.optional)}", 1)
                if f.type.kind == "union":
                    o(f"{f.name}_type: {f.type.decl.name}", 1)
            if fields:
                o(f"def __init__(self, *, {', '.join(f.name + ': Any = ...' for f in fields)}) -> None: ...", 1)
            else:
                o("def __init__(self) -> None: ...", 1)
        return o.text()

    def pytype(self, t, optional=False):
        if optional:
            return f"Optional[{self.pytype(t)}]"
        k = t.kind
        if k == "scalar":
            return PY_TYPE.get(canon(t.name), "int")
        if k == "enum":
            return t.decl.name
        if k == "string":
            return "str"
        if k in ("table", "struct"):
            return f"Optional[{t.decl.name}]"
        if k == "union":
            return "Optional[Table]"
        e = t.elem
        if e.kind in ("scalar", "enum"):
            return "memoryview"
        return f"Sequence[{self.pytype(e).replace('Optional[', '').rstrip(']') if e.kind != 'string' else 'str'}]"


def render():
    g = Gen(parse(SCHEMA))
    return g.generate(), g.stub()


def main(argv=None):
    def outputs():
        pxis, pyi = render()
        return [(os.path.join(OUT_DIR, name), text) for name, text in pxis.items()] + [
            (OUT_PYI, pyi)]
    return checked_in.run(__doc__.splitlines()[0], outputs, argv)


if __name__ == "__main__":
    sys.exit(main())
