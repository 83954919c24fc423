"""A parser for the subset of the FlatBuffers schema language we use.

The conventions in schema/CONVENTIONS.md define that subset (tables, structs,
enums, unions, vectors, `deprecated`, `nested_flatbuffer`, user attributes).
Anything outside it is rejected with the file and line, so the generator never
silently disagrees with flatc. The conformance tests then check, byte for byte,
that the code generated from this parse agrees with flatc's own output.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

# name -> (size, struct/memoryview format, C load fn suffix)
SCALARS = {
    "bool": (1, "?", "u8"), "byte": (1, "b", "i8"), "ubyte": (1, "B", "u8"),
    "int8": (1, "b", "i8"), "uint8": (1, "B", "u8"),
    "short": (2, "h", "i16"), "ushort": (2, "H", "u16"),
    "int16": (2, "h", "i16"), "uint16": (2, "H", "u16"),
    "int": (4, "i", "i32"), "uint": (4, "I", "u32"),
    "int32": (4, "i", "i32"), "uint32": (4, "I", "u32"),
    "long": (8, "q", "i64"), "ulong": (8, "Q", "u64"),
    "int64": (8, "q", "i64"), "uint64": (8, "Q", "u64"),
    "float": (4, "f", "f32"), "double": (8, "d", "f64"),
    "float32": (4, "f", "f32"), "float64": (8, "d", "f64"),
}
INT_RANGES = {
    "byte": (-2**7, 2**7 - 1), "int8": (-2**7, 2**7 - 1),
    "ubyte": (0, 2**8 - 1), "uint8": (0, 2**8 - 1),
    "short": (-2**15, 2**15 - 1), "int16": (-2**15, 2**15 - 1),
    "ushort": (0, 2**16 - 1), "uint16": (0, 2**16 - 1),
    "int": (-2**31, 2**31 - 1), "int32": (-2**31, 2**31 - 1),
    "uint": (0, 2**32 - 1), "uint32": (0, 2**32 - 1),
    "long": (-2**63, 2**63 - 1), "int64": (-2**63, 2**63 - 1),
    "ulong": (0, 2**64 - 1), "uint64": (0, 2**64 - 1),
}


class SchemaError(Exception):
    pass


@dataclass
class Type:
    kind: str                  # scalar | enum | string | table | struct | union | vector
    name: str = ""             # scalar name or declared type name
    elem: "Type | None" = None  # for vectors
    decl: object = None        # resolved Enum/Table/Struct/Union

    @property
    def scalar(self) -> str:
        """Underlying scalar name (enums resolve to their base type)."""
        if self.kind == "enum":
            return self.decl.base
        return self.name

    def __str__(self):
        return f"[{self.elem}]" if self.kind == "vector" else self.name


@dataclass
class Field:
    name: str
    type: Type
    default: object = None     # python value for scalars/enums
    attrs: dict = field(default_factory=dict)
    doc: str = ""
    slot: int = 0              # vtable slot (union value slot for unions)
    line: int = 0
    optional: bool = False     # `= null`: absent reads as None, any set value is written

    @property
    def deprecated(self):
        return "deprecated" in self.attrs

    @property
    def voffset(self):
        return 4 + 2 * self.slot


@dataclass
class Enum:
    name: str
    base: str
    values: list               # [(name, value, doc)]
    doc: str = ""
    file: str = ""


@dataclass
class Union:
    name: str
    members: list              # [(name, tag)]; resolved tables in member_decls
    doc: str = ""
    file: str = ""
    member_decls: list = field(default_factory=list)


@dataclass
class Struct:
    name: str
    fields: list
    doc: str = ""
    file: str = ""
    size: int = 0
    align: int = 1
    offsets: list = field(default_factory=list)


@dataclass
class Table:
    name: str
    fields: list
    doc: str = ""
    file: str = ""
    nslots: int = 0


@dataclass
class Schema:
    decls: dict                # name -> decl, in declaration order
    roots: list                # [(table name, file_identifier or None, file)]
    attributes: set
    files: list

    def of(self, cls):
        return [d for d in self.decls.values() if isinstance(d, cls)]


_TOKEN = re.compile(r"""
    (?P<doc>///[^\n]*)
  | (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<ws>\s+)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<punct>[{}()\[\]:;=,])
""", re.VERBOSE | re.DOTALL)


def _tokens(text, path):
    pos, line = 0, 1
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            raise SchemaError(f"{path}:{line}: unexpected character {text[pos]!r}")
        kind = m.lastgroup
        value = m.group()
        if kind not in ("ws", "comment"):
            yield kind, value, line
        line += value.count("\n")
        pos = m.end()


class _Parser:
    def __init__(self, path):
        self.path = path
        with open(path, encoding="utf-8") as f:
            self.toks = list(_tokens(f.read(), path))
        self.i = 0
        self.doc = []

    def _skip_docs(self):
        while self.i < len(self.toks) and self.toks[self.i][0] == "doc":
            self.doc.append(self.toks[self.i][1][3:].strip())
            self.i += 1

    def take_doc(self):
        d = " ".join(x for x in self.doc if x)
        self.doc = []
        return d

    def peek(self):
        self._skip_docs()
        return self.toks[self.i] if self.i < len(self.toks) else (None, None, -1)

    def next(self):
        tok = self.peek()
        if tok[0] is None:
            raise SchemaError(f"{self.path}: unexpected end of file")
        self.i += 1
        return tok

    def expect(self, value):
        kind, v, line = self.next()
        if v != value:
            raise SchemaError(f"{self.path}:{line}: expected {value!r}, got {v!r}")
        return line

    def ident(self):
        kind, v, line = self.next()
        if kind != "ident":
            raise SchemaError(f"{self.path}:{line}: expected a name, got {v!r}")
        return v

    def error(self, line, msg):
        return SchemaError(f"{self.path}:{line}: {msg}")

    def attrs(self):
        out = {}
        if self.peek()[1] != "(":
            return out
        self.next()
        while True:
            name = self.ident()
            value = True
            if self.peek()[1] == ":":
                self.next()
                kind, value, _ = self.next()
                if kind == "string":
                    value = value[1:-1]
            out[name] = value
            kind, v, line = self.next()
            if v == ")":
                return out
            if v != ",":
                raise self.error(line, f"expected ',' or ')' in attributes, got {v!r}")

    def type_(self):
        if self.peek()[1] == "[":
            self.next()
            elem = self.type_()
            self.expect("]")
            if elem.kind == "vector":
                raise self.error(self.peek()[2], "vectors of vectors are not supported")
            return Type("vector", elem=elem)
        return Type("named", name=self.ident())


def parse(main_path: str) -> Schema:
    decls: dict = {}
    roots = []
    attributes = {"deprecated", "nested_flatbuffer"}
    files = []
    seen = set()

    def parse_file(path):
        path = os.path.abspath(path)
        if path in seen:
            return
        seen.add(path)
        p = _Parser(path)
        base = os.path.basename(path)
        file_id = None
        root = None
        # includes first (they must come first in a .fbs file)
        while p.peek()[1] == "include":
            p.next()
            kind, v, line = p.next()
            p.expect(";")
            parse_file(os.path.join(os.path.dirname(path), v[1:-1]))
        files.append(path)
        while p.peek()[0] is not None:
            kind, word, line = p.next()
            if word == "namespace":
                p.ident()
                p.expect(";")
                p.doc = []
            elif word == "attribute":
                attributes.add(p.next()[1].strip('"'))
                p.expect(";")
            elif word == "root_type":
                root = p.ident()
                p.expect(";")
            elif word == "file_identifier":
                file_id = p.next()[1][1:-1]
                if len(file_id.encode()) != 4:
                    raise p.error(line, "file_identifier must be 4 bytes")
                p.expect(";")
            elif word == "file_extension":
                p.next()
                p.expect(";")
            elif word == "enum":
                doc = p.take_doc()
                name = p.ident()
                p.expect(":")
                base = p.ident()
                if base not in INT_RANGES:
                    raise p.error(line, f"enum {name}: underlying type {base} is not an integer type")
                p.attrs()
                p.expect("{")
                values, nxt = [], 0
                while p.peek()[1] != "}":
                    vdoc = p.take_doc()
                    vname = p.ident()
                    if p.peek()[1] == "=":
                        p.next()
                        nxt = int(p.next()[1], 0)
                    lo, hi = INT_RANGES[base]
                    if not lo <= nxt <= hi:
                        raise p.error(line, f"enum {name}.{vname} = {nxt} does not fit {base}")
                    values.append((vname, nxt, vdoc))
                    nxt += 1
                    if p.peek()[1] == ",":
                        p.next()
                p.expect("}")
                p.take_doc()
                _declare(decls, Enum(name, base, values, doc, base_name(path)), p, line)
            elif word == "union":
                doc = p.take_doc()
                name = p.ident()
                p.attrs()
                p.expect("{")
                members, tag = [], 1
                while p.peek()[1] != "}":
                    p.take_doc()
                    mname = p.ident()
                    if p.peek()[1] in (":", "="):
                        raise p.error(line, f"union {name}: aliased or numbered members are not supported")
                    members.append((mname, tag))
                    tag += 1
                    if p.peek()[1] == ",":
                        p.next()
                p.expect("}")
                p.take_doc()
                if len(members) > 255:
                    raise p.error(line, f"union {name} has more than 255 members")
                _declare(decls, Union(name, members, doc, base_name(path)), p, line)
            elif word in ("table", "struct"):
                doc = p.take_doc()
                name = p.ident()
                p.attrs()
                p.expect("{")
                fields = []
                while p.peek()[1] != "}":
                    fdoc = p.take_doc()
                    fline = p.peek()[2]
                    fname = p.ident()
                    p.expect(":")
                    ftype = p.type_()
                    default = None
                    if p.peek()[1] == "=":
                        p.next()
                        kind, default, _ = p.next()
                        if kind == "string":
                            raise p.error(fline, f"{name}.{fname}: string defaults are not supported")
                    fattrs = p.attrs()
                    if "id" in fattrs or "required" in fattrs or "key" in fattrs:
                        raise p.error(fline, f"{name}.{fname}: id/required/key attributes are not allowed")
                    for a in fattrs:
                        if a not in attributes:
                            raise p.error(fline, f"{name}.{fname}: undeclared attribute {a!r}")
                    p.expect(";")
                    optional = default == "null"
                    fields.append(Field(fname, ftype, None if optional else default, fattrs, fdoc,
                                        line=fline, optional=optional))
                p.expect("}")
                p.take_doc()
                cls = Table if word == "table" else Struct
                _declare(decls, cls(name, fields, doc, base_name(path)), p, line)
            else:
                raise p.error(line, f"unsupported declaration {word!r}")
        if root:
            roots.append((root, file_id, base_name(path)))

    parse_file(main_path)
    schema = Schema(decls, roots, attributes, files)
    _resolve(schema)
    return schema


def base_name(path):
    return os.path.basename(path)


def _declare(decls, decl, p, line):
    if decl.name in decls:
        raise p.error(line, f"{decl.name} is declared twice")
    decls[decl.name] = decl


def _resolve_type(schema, t: Type, where: str) -> Type:
    if t.kind == "vector":
        t.elem = _resolve_type(schema, t.elem, where)
        if t.elem.kind == "union":
            raise SchemaError(f"{where}: vectors of unions are not supported")
        return t
    if t.name in SCALARS:
        t.kind = "scalar"
        return t
    if t.name == "string":
        t.kind = "string"
        return t
    decl = schema.decls.get(t.name)
    if decl is None:
        raise SchemaError(f"{where}: unknown type {t.name}")
    t.decl = decl
    t.kind = {Enum: "enum", Union: "union", Table: "table", Struct: "struct"}[type(decl)]
    return t


def _parse_default(f: Field, where):
    t = f.type
    if f.optional:
        if t.kind not in ("scalar", "enum"):
            raise SchemaError(f"{where}: only scalars and enums can be optional (= null)")
        return None
    if t.kind not in ("scalar", "enum"):
        if f.default is not None:
            raise SchemaError(f"{where}: only scalars and enums take defaults")
        return None
    raw = f.default
    if t.kind == "enum":
        if raw is None:
            # flatc: the default of an enum field is 0, which must be a member
            vals = [v for _, v, _ in t.decl.values]
            if 0 not in vals:
                raise SchemaError(f"{where}: enum {t.decl.name} has no 0 member; give a default")
            return 0
        for vname, v, _ in t.decl.values:
            if vname == raw:
                return v
        try:
            return int(raw, 0)
        except ValueError:
            raise SchemaError(f"{where}: {raw} is not a member of {t.decl.name}") from None
    name = t.name
    if name == "bool":
        if raw is None:
            return False
        if raw in ("true", "false"):
            return raw == "true"
        return bool(int(raw, 0))
    if name in ("float", "double", "float32", "float64"):
        return 0.0 if raw is None else float(raw)
    if raw is None:
        return 0
    v = int(raw, 0)
    lo, hi = INT_RANGES[name]
    if not lo <= v <= hi:
        raise SchemaError(f"{where}: default {v} does not fit {name}")
    return v


def _resolve(schema: Schema):
    for decl in schema.decls.values():
        if isinstance(decl, Union):
            for mname, _ in decl.members:
                m = schema.decls.get(mname)
                if not isinstance(m, Table):
                    raise SchemaError(f"union {decl.name}: member {mname} is not a table")
                decl.member_decls.append(m)
    for decl in schema.decls.values():
        if isinstance(decl, (Table, Struct)):
            names = set()
            for f in decl.fields:
                where = f"{decl.file}:{f.line}: {decl.name}.{f.name}"
                if f.name in names:
                    raise SchemaError(f"{where}: duplicate field")
                names.add(f.name)
                _resolve_type(schema, f.type, where)
                if f.optional and isinstance(decl, Struct):
                    raise SchemaError(f"{where}: struct fields cannot be optional (= null)")
                f.default = _parse_default(f, where)
                if isinstance(decl, Struct) and f.type.kind not in ("scalar", "enum", "struct"):
                    raise SchemaError(f"{where}: struct fields must be scalars, enums or structs")
                if "nested_flatbuffer" in f.attrs:
                    if not (f.type.kind == "vector" and f.type.elem.name == "ubyte"):
                        raise SchemaError(f"{where}: nested_flatbuffer needs [ubyte]")
                    target = schema.decls.get(f.attrs["nested_flatbuffer"])
                    if not isinstance(target, Table):
                        raise SchemaError(f"{where}: nested_flatbuffer names no table")
    for decl in schema.decls.values():
        if isinstance(decl, Table):
            slot = 0
            for f in decl.fields:
                if f.type.kind == "union":
                    f.slot = slot + 1       # value slot; type slot is slot
                    slot += 2
                else:
                    f.slot = slot
                    slot += 1
            decl.nslots = slot
        elif isinstance(decl, Struct):
            _layout_struct(schema, decl)
    for root, _, _ in schema.roots:
        if not isinstance(schema.decls.get(root), Table):
            raise SchemaError(f"root_type {root} is not a table")


def _field_size_align(schema, t: Type):
    if t.kind == "struct":
        _layout_struct(schema, t.decl)
        return t.decl.size, t.decl.align
    size = SCALARS[t.scalar][0]
    return size, size


def _layout_struct(schema, s: Struct):
    if s.size:
        return
    off, align, offsets = 0, 1, []
    for f in s.fields:
        size, a = _field_size_align(schema, f.type)
        off = (off + a - 1) // a * a
        offsets.append(off)
        off += size
        align = max(align, a)
    s.size = (off + align - 1) // align * align
    s.align = align
    s.offsets = offsets
