"""Our schema against the original lineage's layout: the public ancestor's tables, enums
and unions (tests/ancestor_layout.py, facts we wrote down) edited by the version history,
slot by slot; the shipped layout lock (schema/shipped_layout.json) that lets every table
grow only at the end; and frames built by hand to the ancestor's layout with the official
runtime's Builder, read by our codec, and the reverse."""
import math
import os
import struct
import sys

import ancestor_layout as A
import flatbuffers
import pytest
import reference
from flatbuffers import number_types as N
from flatbuffers.table import Table as FbTable

sys.path.insert(0, os.path.join(reference.ROOT, "tools"))
import ship_layout

SCHEMA = reference.load_schema()
OURS = ship_layout.layout(SCHEMA)
EXPECTED = A.expected_v29()


def ours(table):
    return OURS["tables"][table]


def _norm(rows):
    """Float defaults compared as float32 values, the only thing on the wire."""
    out = []
    for r in rows:
        r = dict(r)
        if isinstance(r["default"], float):
            r["default"] = struct.unpack("<f", struct.pack("<f", r["default"]))[0]
        out.append(r)
    return out


def prefix_problem(expected, actual):
    """None, or the first slot where `actual` does not start with `expected`."""
    expected, actual = _norm(expected), _norm(actual)
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e != a:
            return f"field {i}: ours {a}, the lineage's {e}"
    if len(actual) < len(expected):
        return f"ours ends after {len(actual)} fields; the lineage has {expected[len(actual)]}"
    return None


# ---------------------------------------------------------------------------
# the ancestor, edited by the version history

@pytest.mark.parametrize("table", sorted(EXPECTED))
def test_table_keeps_the_lineage_layout(table):
    assert table in OURS["tables"], f"{table} is missing"
    problem = prefix_problem(EXPECTED[table], ours(table))
    assert problem is None, f"{table}: {problem}"


@pytest.mark.parametrize("enum", sorted(A.ANCESTOR_ENUMS))
def test_enum_keeps_the_ancestor_values(enum):
    base, members = A.ANCESTOR_ENUMS[enum]
    decl = SCHEMA.decls[enum]
    assert decl.base in (base, {"ubyte": "uint8"}.get(base))
    assert OURS["enums"][enum] == {**members, **A.ENUM_APPENDS.get(enum, {})}


@pytest.mark.parametrize("union", sorted(A.ANCESTOR_UNIONS))
def test_union_keeps_the_ancestor_order(union):
    renames = A.UNION_RENAMES.get(union, {})
    members = [renames.get(m, m) for m in A.ANCESTOR_UNIONS[union]]
    assert OURS["unions"][union][:len(members)] == members


def test_node_params_appended_members():
    # Speak was node type 10 in the original's 0.3.0; v22 put Summarize after
    # WriteToMemory and v26 ClassifyAttributesLLM after Summarize (docs/protocol.md)
    assert OURS["unions"]["NodeParams"][10:] == [
        "SpeakParams", "PauseParams", "WriteToMemoryParams", "SummarizeParams",
        "ClassifyAttributesLLMParams"]


def test_seed_fixed_slots():
    fields = [f["name"] for f in ours("CreateAgentRequest")]
    assert fields.index("workload") == 7
    assert A.slots(ours("ChangeAgentParamRequest"))[3] == 4      # params after its type slot


def test_every_request_and_reply_starts_with_a_uint64_request_id():
    lacking = {"ConnectionReady", "AudioBuffer", "SetInferenceThrottle", "WireTranscriptUpdate"}
    for name in OURS["unions"]["MessageBody"]:
        first = ours(name)[0]
        if name in lacking:
            assert first["name"] != "request_id", name
        else:
            assert (first["name"], first["type"]) == ("request_id", "ulong"), name


def test_the_checker_fails_on_an_inserted_field():
    """A field added anywhere but the end of a shipped table must fail both checks."""
    rows = [dict(r) for r in ours("SendMessageRequest")]
    inserted = rows[:2] + [{"name": "x", "type": "uint", "default": 0, "deprecated": False}] \
        + rows[2:]
    assert prefix_problem(EXPECTED["SendMessageRequest"], inserted) is not None
    current = {**OURS, "tables": {**OURS["tables"], "SendMessageRequest": inserted}}
    assert ship_layout.differences(ship_layout.load_lock(), current)
    appended = rows + [{"name": "x", "type": "uint", "default": 0, "deprecated": False}]
    current = {**OURS, "tables": {**OURS["tables"], "SendMessageRequest": appended}}
    assert prefix_problem(EXPECTED["SendMessageRequest"], appended) is None
    assert not ship_layout.differences(ship_layout.load_lock(), current)


# ---------------------------------------------------------------------------
# the shipped layout lock

def test_schema_only_grew_since_shipping():
    assert ship_layout.differences(ship_layout.load_lock(), OURS) == []


def test_lock_records_the_whole_schema():
    assert ship_layout.main(["--check"]) == 0, "run tools/ship_layout.py"


# ---------------------------------------------------------------------------
# frames to the ancestor's layout, with the official runtime's Builder and Table

SCALAR = {  # canonical type -> (flags, Builder.Prepend…Slot, sample value)
    "bool": (N.BoolFlags, "PrependBoolSlot", True),
    "ubyte": (N.Uint8Flags, "PrependUint8Slot", 3),
    "ushort": (N.Uint16Flags, "PrependUint16Slot", 2),
    "int": (N.Int32Flags, "PrependInt32Slot", -7),
    "uint": (N.Uint32Flags, "PrependUint32Slot", 4_000_000_000),
    "ulong": (N.Uint64Flags, "PrependUint64Slot", 2**64 - 5),
    "float": (N.Float32Flags, "PrependFloat32Slot", 0.75),
}
ENUM_BASE = {name: base for name, (base, _) in A.ANCESTOR_ENUMS.items()}


def _rows(table):
    return A.ancestor_fields(table)


def _kind(type_):
    if type_ in SCALAR:
        return "scalar"
    if type_ in ENUM_BASE:
        return "enum"
    if type_ == "string":
        return "string"
    if type_.startswith("["):
        return "vector"
    if type_.startswith("union "):
        return "union"
    return "table"


def sample_tree(table, depth=0):
    """A value for every field of an ancestor table (no unions: they nest whole graphs)."""
    tree = {}
    for i, f in enumerate(_rows(table)):
        t, k = f["type"], _kind(f["type"])
        if k == "scalar":
            tree[f["name"]] = SCALAR[t][2] if t != "bool" or f["default"] is not True else False
        elif k == "enum":
            members = list(A.ANCESTOR_ENUMS[t][1].values())
            default = A.ANCESTOR_ENUMS[t][1].get(f["default"], 0)
            tree[f["name"]] = next(v for v in reversed(members) if v != default)
        elif k == "string":
            tree[f["name"]] = f"{f['name']} ✓ {i}"
        elif k == "vector":
            elem = t[1:-1]
            if elem == "string":
                tree[f["name"]] = ["añ", "", "日本"]
            elif elem == "ubyte":
                tree[f["name"]] = bytes(range(7))
            elif elem in A.ANCESTOR_TABLES and depth < 2:
                tree[f["name"]] = [sample_tree(elem, depth + 1) for _ in range(2)]
        elif k == "table" and t in A.ANCESTOR_TABLES and depth < 2:
            tree[f["name"]] = sample_tree(t, depth + 1)
    return tree


def build_official(b, table, tree):
    """`tree` written to the ancestor's layout of `table` with flatbuffers.Builder."""
    rows = _rows(table)
    offsets = {}
    for f in rows:                       # children first, as the Builder requires
        v = tree.get(f["name"])
        if v is None:
            continue
        k = _kind(f["type"])
        if k == "string":
            offsets[f["name"]] = b.CreateString(v)
        elif k == "table":
            offsets[f["name"]] = build_official(b, f["type"], v)
        elif k == "vector":
            elem = f["type"][1:-1]
            if elem == "ubyte":
                offsets[f["name"]] = b.CreateByteVector(v)
                continue
            items = [b.CreateString(x) if elem == "string" else build_official(b, elem, x)
                     for x in v]
            b.StartVector(4, len(items), 4)
            for off in reversed(items):
                b.PrependUOffsetTRelative(off)
            offsets[f["name"]] = b.EndVector()
    slots = A.slots(rows)
    b.StartObject(slots[-1] + 1 if rows else 0)
    for f, slot in zip(rows, slots):
        v = tree.get(f["name"])
        if v is None:
            continue
        k = _kind(f["type"])
        if k in ("scalar", "enum"):
            scalar = f["type"] if k == "scalar" else ENUM_BASE[f["type"]]
            default = f["default"]
            if k == "enum":
                default = A.ANCESTOR_ENUMS[f["type"]][1][default]
            getattr(b, SCALAR[scalar][1])(slot, v, default if default is not None else 0)
        else:
            b.PrependUOffsetTRelativeSlot(slot, offsets[f["name"]], 0)
    return b.EndObject()


def official_frame(table, tree):
    """A whole frame: Message{body: table} at the ancestor's union position."""
    tag = A.ANCESTOR_UNIONS["MessageBody"].index(table) + 1
    b = flatbuffers.Builder(0)
    body = build_official(b, table, tree)
    b.StartObject(2)
    b.PrependUint8Slot(0, tag, 0)
    b.PrependUOffsetTRelativeSlot(1, body, 0)
    b.FinishSizePrefixed(b.EndObject())
    return bytes(b.Output())


def read_official(buf, pos, table):
    """The ancestor-layout fields of the table at `pos`, read with flatbuffers' Table."""
    tab = FbTable(buf, pos)
    out = {}
    for f, slot in zip(_rows(table), A.slots(_rows(table))):
        o = tab.Offset(4 + 2 * slot)
        k, t = _kind(f["type"]), f["type"]
        if k in ("scalar", "enum"):
            scalar = t if k == "scalar" else ENUM_BASE[t]
            default = f["default"]
            if k == "enum":
                default = A.ANCESTOR_ENUMS[t][1][default]
            out[f["name"]] = tab.Get(SCALAR[scalar][0], o + tab.Pos) if o else (
                default if default is not None else 0)
        elif k == "union":
            out[f["name"]] = None           # the samples write no unions
        elif k == "string":
            out[f["name"]] = tab.String(o + tab.Pos).decode() if o else ""
        elif k == "table":
            out[f["name"]] = read_official(buf, tab.Indirect(o + tab.Pos), t) if o else None
        elif k == "vector":
            elem = t[1:-1]
            if not o:
                out[f["name"]] = b"" if elem == "ubyte" else []
                continue
            start, n = tab.Vector(o), tab.VectorLen(o)
            if elem == "ubyte":
                out[f["name"]] = bytes(buf[start:start + n])
            elif elem == "string":
                out[f["name"]] = [tab.String(start + 4 * i).decode() for i in range(n)]
            else:
                out[f["name"]] = [read_official(buf, tab.Indirect(start + 4 * i), elem)
                                  for i in range(n)]
    return out


def unchanged_messages():
    """Messages whose v29 layout still begins with the ancestor's fields, unedited."""
    out = []
    for name in A.ANCESTOR_UNIONS["MessageBody"]:
        if name not in EXPECTED:
            continue
        anc = [dict(r) for r in _rows(name)]
        if _norm(EXPECTED[name][:len(anc)]) == _norm(anc) and not any(
                _kind(r["type"]) == "union" for r in anc):
            out.append(name)
    return out


UNCHANGED = unchanged_messages()


def test_the_unchanged_messages_are_the_expected_ones():
    assert {"SendMessageRequest", "TurnComplete", "ErrorResponse", "ListModelsResponse",
            "AnswerText", "NodeEvent", "Ack", "DownloadProgress", "DownloadComplete",
            "CreateStringStorageRequest", "TtsAudioFrame", "AudioBuffer",
            "WireTranscriptUpdate"} <= set(UNCHANGED)


def _ours_plain(view, table):
    """Our view's fields, restricted to the ancestor's, in the official reader's shape."""
    out = {}
    for f in _rows(table):
        v = getattr(view, f["name"])
        k = _kind(f["type"])
        if k == "table":
            v = None if v is None else _ours_plain(v, f["type"])
        elif k == "vector":
            elem = f["type"][1:-1]
            if elem == "ubyte":
                v = bytes(v)
            elif elem in A.ANCESTOR_TABLES:
                v = [_ours_plain(x, elem) for x in v]
            else:
                v = list(v)
        elif k in ("scalar", "enum"):
            v = int(v) if not isinstance(v, float) else v
        out[f["name"]] = v
    return out


def _close(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("table", UNCHANGED)
def test_official_builder_frame_reads_in_our_codec(codec, table):
    tree = sample_tree(table)
    frame = official_frame(table, tree)
    msg = codec.decode_frame(frame)
    assert type(msg.body).__name__ == table
    got = _ours_plain(msg.body, table)
    assert _close(got, _plain_tree(table, tree)), (got, tree)


@pytest.mark.parametrize("table", UNCHANGED)
def test_our_frame_reads_with_the_official_table_api(codec, table):
    tree = sample_tree(table)
    cls = getattr(codec, table)
    frame = codec.encode(cls(**_ours_tree(codec, table, tree)))
    buf = bytearray(frame)
    root = FbTable(buf, struct.unpack_from("<I", frame, 4)[0] + 4)
    tag = root.Get(N.Uint8Flags, root.Offset(4) + root.Pos)
    assert tag == A.ANCESTOR_UNIONS["MessageBody"].index(table) + 1
    got = read_official(buf, root.Indirect(root.Offset(6) + root.Pos), table)
    assert _close(got, _plain_tree(table, tree)), (got, tree)


def _ours_tree(codec, table, tree):
    """The same tree as keyword arguments for our codec's classes."""
    out = {}
    for f in _rows(table):
        if f["name"] not in tree:
            continue
        v = tree[f["name"]]
        k, t = _kind(f["type"]), f["type"]
        if k == "table":
            v = getattr(codec, t)(**_ours_tree(codec, t, v))
        elif k == "vector" and t[1:-1] in A.ANCESTOR_TABLES:
            elem = t[1:-1]
            v = [getattr(codec, elem)(**_ours_tree(codec, elem, x)) for x in v]
        out[f["name"]] = v
    return out


def _plain_tree(table, tree):
    """What the official reader gives for `tree` (absent fields at their defaults)."""
    out = {}
    for f in _rows(table):
        k, t = _kind(f["type"]), f["type"]
        v = tree.get(f["name"])
        if v is None:
            if k in ("scalar", "enum"):
                d = f["default"]
                v = A.ANCESTOR_ENUMS[t][1][d] if k == "enum" else (0 if d is None else d)
            elif k == "string":
                v = ""
            elif k == "vector":
                v = b"" if t == "[ubyte]" else []
        elif k == "table":
            v = _plain_tree(t, v)
        elif k == "vector" and t[1:-1] in A.ANCESTOR_TABLES:
            v = [_plain_tree(t[1:-1], x) for x in v]
        out[f["name"]] = v
    return out
