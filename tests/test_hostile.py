"""Hostile buffers for the decoder: every malformed input must end in the exact
typed error (MalformedMessage 5001, or UnknownMessageType 5002 for an unknown
Message.body tag) - never another exception, a crash, a hang or a read outside
the buffer. Buffers are laid out by hand (layouts documented inline) or made by
patching bytes of valid frames at positions computed by walking the FlatBuffers
layout (root uoffset -> table -> soffset to vtable -> field voffsets).

FlatBuffers primer for the layouts below (all little-endian):
  * payload[0:4]  uoffset of the root table (relative to position 0)
  * table at t:   int32 soffset; its vtable is at t - soffset
  * vtable at v:  u16 vtable size, u16 table (inline) size, then one u16 per
                  field slot: the field's offset from t (0 = absent)
  * uoffset at p: target = p + u32 (always forwards)
  * string:       u32 length n, n bytes of UTF-8, a 0 terminator
  * vector:       u32 count, then count elements (offsets are relative to
                  each element's own position)
  * union field:  two slots: u8 tag (`x_type`), then the uoffset of the value
"""
from __future__ import annotations

import json
import random
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tryll_fast import codec  # noqa: E402
from fuzz import corpus  # noqa: E402

SEEDS = dict(corpus.named_seeds())
MAX_U32 = 0xFFFFFFFF


# ---------------------------------------------------------------------------
# Assertions

def assert_malformed(data, *args):
    with pytest.raises(codec.MalformedMessage) as ei:
        codec.decode(data, *args)
    assert type(ei.value) is codec.MalformedMessage, type(ei.value)
    assert ei.value.code == 5001
    return ei.value


def assert_unknown_type(data):
    with pytest.raises(codec.UnknownMessageType) as ei:
        codec.decode(data)
    assert type(ei.value) is codec.UnknownMessageType, type(ei.value)
    assert ei.value.code == 5002
    assert not isinstance(ei.value, codec.MalformedMessage)
    return ei.value


def decode_and_read(data):
    """Decode and read everything; only the two typed decode errors may escape."""
    try:
        msg = codec.decode(data)
    except (codec.MalformedMessage, codec.UnknownMessageType) as e:
        assert type(e) in (codec.MalformedMessage, codec.UnknownMessageType)
        return None
    corpus.read_everything(msg)
    return msg


# ---------------------------------------------------------------------------
# Layout helpers

def u16(b, p):
    return struct.unpack_from("<H", b, p)[0]


def u32(b, p):
    return struct.unpack_from("<I", b, p)[0]


def i32(b, p):
    return struct.unpack_from("<i", b, p)[0]


def put_u16(b, p, v):
    struct.pack_into("<H", b, p, v & 0xFFFF)


def put_u32(b, p, v):
    struct.pack_into("<I", b, p, v & MAX_U32)


def root(b):
    return u32(b, 0)


def vtable_of(b, t):
    return t - i32(b, t)


def field(b, t, voffset):
    """Absolute position of the field at `voffset` of table t (None if absent)."""
    vt = vtable_of(b, t)
    if voffset >= u16(b, vt):
        return None
    fo = u16(b, vt + voffset)
    return t + fo if fo else None


def deref(b, p):
    return p + u32(b, p)


def child(b, t, voffset):
    return deref(b, field(b, t, voffset))


def elem(b, vec, i):
    """Target of the i-th offset element of the vector at `vec`."""
    return deref(b, vec + 4 + 4 * i)


# vtable offsets (4 + 2 * slot; a union takes two slots: tag, then value).
# test_voffsets_match_schema cross-checks every entry against schema/*.fbs.
VOFF = {
    ("Message", "body_type"): 4, ("Message", "body"): 6,
    ("AnswerText", "request_id"): 4, ("AnswerText", "text"): 8,
    ("CreateAgentRequest", "graph"): 6, ("CreateAgentRequest", "variables"): 14,
    ("CreateAgentRequest", "voice"): 20,
    ("GraphDescription", "nodes"): 4,
    ("NodeDescription", "params_type"): 6, ("NodeDescription", "params"): 8,
    ("ToolCallParams", "tools"): 10, ("ToolCallParams", "sampling"): 16,
    ("ToolDefinition", "parameters"): 8,
    ("ToolParamDefinition", "enum_values"): 12,
    ("AgentVariable", "value_type"): 6, ("AgentVariable", "value"): 8,
    ("UpdateAgentVariablesRequest", "updates"): 8,
    ("VariableUpdate", "value_type"): 8, ("VariableUpdate", "value"): 10,
    ("ChangeAgentParamRequest", "params_type"): 10,
    ("ListModelsResponse", "models"): 6,
    ("ModelInfo", "languages"): 12,
    ("ExportDialogResponse", "snapshot"): 8,
    ("PersistedDialogSnapshot", "graph_fingerprint"): 6,
    ("PersistedDialogSnapshot", "interactions"): 14,
    ("PersistedInteraction", "components"): 12,
    ("PersistedComponent", "body_type"): 16, ("PersistedComponent", "body"): 18,
    ("TtsAudioFrame", "pcm"): 8,
    ("TtsVisemeFrame", "visemes"): 10,
    ("CreateStringStorageRequest", "strings"): 10,
}


def V(table, name):
    return VOFF[(table, name)]


def body_of(b):
    return child(b, root(b), V("Message", "body"))


class Raw:
    """Forward-writing FlatBuffers layout with absolute positions.

    Position 0 holds the root uoffset (patched with `link(0, table)`). Targets
    must come after the fields that reference them (uoffsets are unsigned)."""

    def __init__(self):
        self.b = bytearray(4)

    def align(self, n):
        while len(self.b) % n:
            self.b.append(0)

    def put(self, data, align=4):
        self.align(align)
        p = len(self.b)
        self.b += data
        return p

    def vtable(self, tsize, *slots):
        """u16 vtable size, u16 table size, one u16 field offset per slot."""
        return self.put(struct.pack(f"<HH{len(slots)}H", 4 + 2 * len(slots), tsize, *slots), 2)

    def table(self, vt, inline: bytes):
        """int32 soffset (= table - vtable) followed by the inline fields."""
        self.align(4)
        p = len(self.b)
        self.b += struct.pack("<i", p - vt) + inline
        return p

    def string(self, s: bytes):
        return self.put(struct.pack("<I", len(s)) + s + b"\0")

    def offsets_vector(self, n):
        """u32 count + n zeroed offset slots (link them afterwards)."""
        return self.put(struct.pack("<I", n) + bytes(4 * n))

    def link(self, fieldpos, target):
        assert target >= fieldpos
        put_u32(self.b, fieldpos, target - fieldpos)

    def bytes(self):
        return bytes(self.b)


def answer_text_layout(text: bytes = b"hello", tag: int = 8):
    """A hand-built Message{body: AnswerText{request_id: 7, text}}.

      pos  bytes  content
        0      4  root uoffset = 12 -> Message table M
        4      8  Message vtable: vtsize 8 | tsize 12 | body_type @+4 | body @+8
       12     12  M: soffset 8 (-> 4) | u8 tag | 3 pad | u32 uoffset -> A
       24     10  AnswerText vtable: vtsize 10 | tsize 16 | request_id @+4 |
                  agent_id absent | text @+12
       34      2  pad
       36     16  A: soffset 12 (-> 24) | u64 request_id | u32 uoffset -> S
       52  4+n+1  S: u32 n | text | 0
    """
    r = Raw()
    mvt = r.vtable(12, 4, 8)
    m = r.table(mvt, struct.pack("<B3xI", tag, 0))
    r.link(0, m)
    avt = r.vtable(16, 4, 0, 12)
    a = r.table(avt, struct.pack("<QI", 7, 0))
    r.link(m + 8, a)
    s = r.string(text)
    r.link(a + 12, s)
    assert (mvt, m, avt, a, s) == (4, 12, 24, 36, 52)
    return r.b


# positions in answer_text_layout()
AT_MSG_VT, AT_MSG, AT_TAG, AT_BODY_FIELD = 4, 12, 16, 20
AT_VT, AT_TABLE, AT_TEXT_FIELD, AT_STR = 24, 36, 48, 52


# ---------------------------------------------------------------------------
# Controls: the layouts and navigation used below are right


def test_the_corpus_seeds_every_message_type():
    # each of the 96 MessageBody members has at least one seed the mutator starts from
    types = {type(codec.decode(p).body).__name__ for p in SEEDS.values()}
    assert types == {m.name for m in codec.MessageBody if m.value}

def test_voffsets_match_schema():
    from tools import fbs
    schema = fbs.parse(str(ROOT / "schema" / "messages.fbs"))
    tables = {t.name: t for t in schema.of(fbs.Table)}
    for (tname, fname), voff in VOFF.items():
        if fname.endswith("_type"):
            f = next(f for f in tables[tname].fields if f.name == fname[:-5])
            assert f.type.kind == "union"
            assert f.voffset - 2 == voff, (tname, fname)
        else:
            f = next(f for f in tables[tname].fields if f.name == fname)
            assert f.voffset == voff, (tname, fname)


def test_hand_layout_decodes():
    msg = codec.decode(bytes(answer_text_layout(b"hello")))
    assert msg.body_type == codec.MessageBody.AnswerText
    assert msg.body.to_dict() == {"request_id": 7, "agent_id": 0, "text": "hello",
                                  "is_delta": False, "is_final": False, "node_name": ""}


def test_seeds_decode_and_round_trip():
    assert len(SEEDS) >= 20
    for name, payload in SEEDS.items():
        msg = codec.decode(payload)
        assert type(msg.body).__name__ == name.split("_")[0]
        d = corpus.read_everything(msg)
        assert d == msg.to_dict()
        # a decoded view re-encodes to the very bytes it came from (our seeds
        # are built by our encoder, so the layouts agree)
        assert codec.encode(msg.body)[4:] == payload, name


def test_decode_accepts_any_buffer_and_unaligned_slices():
    p = SEEDS["CreateAgentRequest"]
    ref = codec.decode(p).to_dict()
    assert codec.decode(bytearray(p)).to_dict() == ref
    assert codec.decode(memoryview(p)).to_dict() == ref
    for pad in (1, 3, 5):  # payload at an unaligned position of a larger buffer
        buf = b"\xAA" * pad + p + b"\x55" * 7
        assert codec.decode(buf, pad, len(p)).to_dict() == ref


# ---------------------------------------------------------------------------
# Sizes, root, vtables, tables, fields, offsets

@pytest.mark.parametrize("n", range(8))
def test_shorter_than_any_message(n):
    assert_malformed(b"")
    assert_malformed(bytes(n))
    assert_malformed(b"\xff" * n)
    assert_malformed(bytes(answer_text_layout())[:n])


def test_decode_offset_and_length_outside_the_buffer():
    p = bytes(answer_text_layout())
    for args in [(-1,), (len(p) + 1,), (0, len(p) + 1), (4, len(p)), (len(p), 8),
                 (2 ** 62,), (2 ** 62, 8)]:
        assert_malformed(p, *args)


@pytest.mark.parametrize("cut", [1, 2, 3, 6, 8])
def test_verification_is_confined_to_the_slice(cut):
    """The bytes exist in the underlying buffer, but lie outside `length`."""
    p = bytes(answer_text_layout(b"hello"))
    buf = p + b"\0" * 16
    assert codec.decode(buf, 0, len(p)).body.text == "hello"
    assert_malformed(buf, 0, len(p) - cut)


@pytest.mark.parametrize("delta", [-3, -2, -1, 0, 1, 4, 0x7FFFFFFF, MAX_U32])
def test_root_offset_past_the_end(delta):
    b = answer_text_layout()
    put_u32(b, 0, len(b) + delta if delta < 0x1000 else delta)
    assert_malformed(bytes(b))


@pytest.mark.parametrize("vt_pos", ["minus1", "minus4", "past_end", "straddles_end",
                                    "int32_max", "int32_min"])
def test_soffset_to_a_vtable_outside_the_buffer(vt_pos):
    b = answer_text_layout()
    n = len(b)
    soffset = {  # vtable = table - soffset
        "minus1": AT_MSG + 1, "minus4": AT_MSG + 4,                 # before the buffer
        "past_end": AT_MSG - n, "straddles_end": AT_MSG - (n - 3),  # negative soffsets
        "int32_max": 0x7FFFFFFF, "int32_min": -0x80000000,
    }[vt_pos]
    struct.pack_into("<i", b, AT_MSG, soffset)
    assert_malformed(bytes(b))
    # the same for a table below the root
    b = answer_text_layout()
    struct.pack_into("<i", b, AT_TABLE, {"minus1": AT_TABLE + 1, "minus4": AT_TABLE + 4,
                                         "past_end": AT_TABLE - n,
                                         "straddles_end": AT_TABLE - (n - 3),
                                         "int32_max": 0x7FFFFFFF,
                                         "int32_min": -0x80000000}[vt_pos])
    assert_malformed(bytes(b))


@pytest.mark.parametrize("vtsize", [0, 1, 2, 3, 5, 7, 9, 11, 0xFFFF, 0xFFFE, "past_end"])
def test_bad_vtable_size(vtsize):
    for vt in (AT_MSG_VT, AT_VT):
        b = answer_text_layout()
        put_u16(b, vt, len(b) - vt + 2 if vtsize == "past_end" else vtsize)
        assert_malformed(bytes(b))


@pytest.mark.parametrize("tsize", [0, 1, 2, 3, 0xFFFF, "past_end"])
def test_bad_table_size(tsize):
    for vt, t in ((AT_MSG_VT, AT_MSG), (AT_VT, AT_TABLE)):
        b = answer_text_layout()
        put_u16(b, vt + 2, len(b) - t + 1 if tsize == "past_end" else tsize)
        assert_malformed(bytes(b))


@pytest.mark.parametrize("slot_pos, fo", [
    (AT_MSG_VT + 4, 1), (AT_MSG_VT + 4, 3),        # body_type overlapping the soffset
    (AT_MSG_VT + 4, 12), (AT_MSG_VT + 4, 0xFFFF),  # 1-byte tag at/after the table end
    (AT_MSG_VT + 6, 2), (AT_MSG_VT + 6, 9),        # 4-byte uoffset crossing the end
    (AT_MSG_VT + 6, 12), (AT_MSG_VT + 6, 0xFFFF),
    (AT_VT + 4, 9), (AT_VT + 4, 12),               # u64 request_id crossing tsize 16
    (AT_VT + 8, 13), (AT_VT + 8, 16),              # text uoffset crossing tsize 16
])
def test_field_offset_outside_its_table(slot_pos, fo):
    b = answer_text_layout()
    put_u16(b, slot_pos, fo)
    assert_malformed(bytes(b))


@pytest.mark.parametrize("where", [AT_BODY_FIELD, AT_TEXT_FIELD])
@pytest.mark.parametrize("target", ["end-3", "end-1", "end", "end+1", 0x80000000, MAX_U32])
def test_uoffset_past_the_end(where, target):
    b = answer_text_layout()
    n = len(b)
    value = {"end-3": n - 3 - where, "end-1": n - 1 - where, "end": n - where,
             "end+1": n + 1 - where}.get(target, target)
    put_u32(b, where, value)
    assert_malformed(bytes(b))


# ---------------------------------------------------------------------------
# Strings

@pytest.mark.parametrize("length", ["no_room_for_terminator", "one_past", 0x7FFFFFFF,
                                    0x80000000, MAX_U32, MAX_U32 - 4])
def test_string_length_runs_past_the_end(length):
    b = answer_text_layout(b"hello")
    rest = len(b) - AT_STR - 4
    put_u32(b, AT_STR, {"no_room_for_terminator": rest, "one_past": rest + 1}.get(length, length))
    assert_malformed(bytes(b))


def test_string_without_terminator():
    b = answer_text_layout(b"hello")
    assert b[AT_STR + 4 + 5] == 0
    b[AT_STR + 4 + 5] = ord("!")
    assert_malformed(bytes(b))
    # string ending exactly at the buffer end: no byte left for the terminator
    b = answer_text_layout(b"hello")
    assert_malformed(bytes(b[:-1]))


def test_string_in_a_string_vector_without_terminator():
    p = bytearray(SEEDS["CreateStringStorageRequest"])
    vec = child(p, body_of(p), V("CreateStringStorageRequest", "strings"))
    s = elem(p, vec, 0)
    assert p[s + 4:s + 4 + u32(p, s)] == b"Hi"
    p[s + 4 + 2] = ord("x")
    assert_malformed(bytes(p))


BAD_UTF8 = [
    b"\xc0\xaf", b"\xc1\xbf", b"\xe0\x80\xaf", b"\xe0\x9f\xbf", b"\xf0\x80\x80\xaf",
    b"\xf0\x8f\xbf\xbf",                                   # overlong encodings
    b"\xed\xa0\x80", b"\xed\xbf\xbf", b"\xed\xb2\x80",     # UTF-16 surrogates
    b"\xe2\x82", b"\xc3", b"\xf0\x9f\x98", b"ab\xf0\x9f",  # truncated at the end
    b"\xe2\x82A", b"\xf0\x9f\x98A", b"\xc3 ",              # truncated before ASCII
    b"\xff", b"\xfe", b"\xf8\x88\x80\x80\x80", b"\x80", b"\xbf", b"a\x80b",
    b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80",              # above U+10FFFF
    b"ABCDEFGH\xff", b"ABCDEFG\xff", b"ABCDEFGHIJKLMNOP\xe2\x82", b"ABCDEFGHIJKLMNOP\x80",
]
GOOD_UTF8 = [b"", b"\x00", b"a\x00b", b"\xc2\x80", b"\xdf\xbf", b"\xe0\xa0\x80", b"\xed\x9f\xbf",
             b"\xee\x80\x80", b"\xef\xbf\xbf", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf",
             "ABCDEFGHé€😀".encode()]


@pytest.mark.parametrize("raw", BAD_UTF8, ids=lambda r: r.hex())
def test_invalid_utf8_is_rejected(raw):
    assert_malformed(bytes(answer_text_layout(raw)))


@pytest.mark.parametrize("raw", GOOD_UTF8, ids=lambda r: r.hex() or "empty")
def test_valid_utf8_edges_are_accepted(raw):
    assert codec.decode(bytes(answer_text_layout(raw))).body.text == raw.decode("utf-8")


def test_invalid_utf8_in_string_vector_and_nested_snapshot():
    p = bytearray(SEEDS["CreateStringStorageRequest"])
    vec = child(p, body_of(p), V("CreateStringStorageRequest", "strings"))
    p[elem(p, vec, 2) + 4] = 0xFF                       # "Grüß Gott" -> 0xFF...
    assert_malformed(bytes(p))

    p = bytearray(SEEDS["ExportDialogResponse"])
    vec = child(p, body_of(p), V("ExportDialogResponse", "snapshot"))
    nested_root = deref(p, vec + 4)                    # nested buffer starts at vec + 4
    s = child(p, nested_root, V("PersistedDialogSnapshot", "graph_fingerprint"))
    assert p[s + 4:s + 6] == b"ab"
    p[s + 5] = 0xC0
    assert_malformed(bytes(p))


# ---------------------------------------------------------------------------
# Vectors

def _pcm_vec(p):
    return child(p, body_of(p), V("TtsAudioFrame", "pcm"))


def _visemes_vec(p):
    return child(p, body_of(p), V("TtsVisemeFrame", "visemes"))


def _strings_vec(p):
    return child(p, body_of(p), V("CreateStringStorageRequest", "strings"))


def _models_vec(p):
    return child(p, body_of(p), V("ListModelsResponse", "models"))


def _snapshot_vec(p):
    return child(p, body_of(p), V("ExportDialogResponse", "snapshot"))


@pytest.mark.parametrize("seed, find, elemsize", [
    ("TtsAudioFrame", _pcm_vec, 1),            # [ubyte] PCM
    ("TtsVisemeFrame", _visemes_vec, 8),       # [VisemeCue] (struct)
    ("CreateStringStorageRequest", _strings_vec, 4),
    ("ListModelsResponse", _models_vec, 4),    # [ModelInfo]
    ("ExportDialogResponse", _snapshot_vec, 1),  # [ubyte] nested_flatbuffer
], ids=lambda x: x if isinstance(x, str) else None)
@pytest.mark.parametrize("count", ["one_past", MAX_U32, 0x80000000, 0x7FFFFFFF,
                                   "wraps32", "wraps32+1"])
def test_vector_count_overflows_or_exceeds_the_buffer(seed, find, elemsize, count):
    p = bytearray(SEEDS[seed])
    vec = find(p)
    assert u32(p, vec) > 0
    value = {"one_past": (len(p) - vec - 4) // elemsize + 1,
             # count * elemsize == 2**32 (+ elemsize): 0 (or tiny) in 32-bit arithmetic
             "wraps32": (1 << 32) // elemsize, "wraps32+1": (1 << 32) // elemsize + 1,
             }.get(count, count)
    if value > MAX_U32:
        value = MAX_U32
    put_u32(p, vec, value)
    assert_malformed(bytes(p))


def test_nested_buffer_is_verified_within_its_own_bounds():
    p = bytearray(SEEDS["ExportDialogResponse"])
    vec = _snapshot_vec(p)
    n = u32(p, vec)
    for short in (0, 1, 7):          # nested buffer shorter than any root
        q = bytearray(p)
        put_u32(q, vec, short)
        if short == 0:
            codec.decode(bytes(q))   # an empty [ubyte] is simply absent
        else:
            assert_malformed(bytes(q))
    # shrink it so its tables lie outside the nested slice but inside the frame
    assert p[vec + 4 + n - 4:vec + 4 + n] == b"\0\0\0\0"  # ...terminator + 3 pad bytes
    for cut in (8, 16, n // 2, n - 4):
        q = bytearray(p)
        put_u32(q, vec, cut)
        assert_malformed(bytes(q))
    # nested root uoffset pointing past the nested slice (but inside the frame)
    q = bytearray(p)
    put_u32(q, vec + 4, n)
    assert_malformed(bytes(q))


# ---------------------------------------------------------------------------
# Unions

@pytest.mark.parametrize("tag", [97, 98, 128, 200, 255])
def test_unknown_message_body_tag(tag):
    assert_unknown_type(bytes(answer_text_layout(tag=tag)))
    for name, payload in SEEDS.items():
        p = bytearray(payload)
        tpos = field(p, root(p), V("Message", "body_type"))
        p[tpos] = tag
        assert_unknown_type(bytes(p))


def test_message_body_tag_none_with_a_value_is_an_empty_message():
    msg = codec.decode(bytes(answer_text_layout(tag=0)))
    assert msg.body_type == codec.MessageBody.NONE
    assert msg.body is None


def test_unknown_message_body_tag_without_a_value():
    """BUG: a Message whose body_type is unknown (200) but whose body offset
    is absent passes verification; `msg.body_type` then raises a plain
    ValueError ('200 is not a valid MessageBody'). An unknown Message.body tag
    must be UnknownMessageType (5002).

      0: root uoffset 12 | 4: vtable (vtsize 6, tsize 8, body_type @+4)
      10: pad | 12: table (soffset 8, u8 tag 200, 3 pad) - no body slot at all
    """
    r = Raw()
    vt = r.vtable(8, 4)
    t = r.table(vt, bytes([200, 0, 0, 0]))
    r.link(0, t)
    assert_unknown_type(r.bytes())


def _node_params_tag_pos(p, i=0):
    car = body_of(p)
    graph = child(p, car, V("CreateAgentRequest", "graph"))
    nodes = child(p, graph, V("GraphDescription", "nodes"))
    return field(p, elem(p, nodes, i), V("NodeDescription", "params_type"))


def _variable_tag_pos(p, i=0):
    vec = child(p, body_of(p), V("CreateAgentRequest", "variables"))
    return field(p, elem(p, vec, i), V("AgentVariable", "value_type"))


def _update_tag_pos(p, i=0):
    vec = child(p, body_of(p), V("UpdateAgentVariablesRequest", "updates"))
    return field(p, elem(p, vec, i), V("VariableUpdate", "value_type"))


def _change_param_tag_pos(p):
    return field(p, body_of(p), V("ChangeAgentParamRequest", "params_type"))


def _component_tag_pos(p):
    vec = _snapshot_vec(p)
    snap = deref(p, vec + 4)
    inter = elem(p, child(p, snap, V("PersistedDialogSnapshot", "interactions")), 0)
    comp = elem(p, child(p, inter, V("PersistedInteraction", "components")), 0)
    return field(p, comp, V("PersistedComponent", "body_type"))


@pytest.mark.parametrize("seed, find, valid, bad", [
    ("CreateAgentRequest", _node_params_tag_pos,
     codec.NodeParams.HumanMessageGuardrailParams, (16, 17, 100, 255)),
    ("ChangeAgentParamRequest", _change_param_tag_pos,
     codec.NodeParams.GenerateParams, (16, 255)),
    ("CreateAgentRequest", _variable_tag_pos, codec.VariableValue.VarInt, (6, 7, 255)),
    ("UpdateAgentVariablesRequest", _update_tag_pos, codec.VariableValue.VarInt, (6, 255)),
    ("ExportDialogResponse", _component_tag_pos,
     codec.PersistedComponentBody.PersistedUserMessage, (8, 9, 255)),
], ids=["NodeParams", "NodeParams-change", "VariableValue", "VariableValue-update",
        "PersistedComponentBody-nested"])
def test_nested_union_tag_out_of_range_is_malformed(seed, find, valid, bad):
    p = bytearray(SEEDS[seed])
    pos = find(p)
    assert p[pos] == valid
    for tag in bad:
        q = bytearray(p)
        q[pos] = tag
        assert_malformed(bytes(q))


def test_unknown_nested_union_tag_without_a_value():
    """BUG: NodeDescription.params_type = 99 with no params value passes
    verification and `node.params_type` then raises a plain ValueError
    ('99 is not a valid NodeParams'). An out-of-range nested union tag must be
    MalformedMessage whether or not the value is present."""
    p = bytearray(SEEDS["CreateAgentRequest"])
    tpos = _node_params_tag_pos(p, 0)
    car = body_of(p)
    node0 = elem(p, child(p, child(p, car, V("CreateAgentRequest", "graph")),
                          V("GraphDescription", "nodes")), 0)
    vt = vtable_of(p, node0)
    put_u16(p, vt + V("NodeDescription", "params"), 0)  # drop the value slot (shared vtable)
    p[tpos] = 99
    assert_malformed(bytes(p))


# ---------------------------------------------------------------------------
# Cycles and depth

def _schema_depth():
    from tools import fbs
    schema = fbs.parse(str(ROOT / "schema" / "messages.fbs"))
    tables = {t.name: t for t in schema.of(fbs.Table)}

    def children(t):
        out = []
        for f in t.fields:
            ty = f.type.elem if f.type.kind == "vector" else f.type
            if ty.kind == "table":
                out.append(ty.decl.name)
            elif ty.kind == "union":
                out += [m.name for m in ty.decl.member_decls]
            if "nested_flatbuffer" in f.attrs:
                out.append(f.attrs["nested_flatbuffer"].strip('"'))
        return out

    def depth(name, stack):
        assert name not in stack, f"recursive schema type: {' -> '.join(stack + (name,))}"
        return 1 + max((depth(c, stack + (name,)) for c in children(tables[name])), default=0)

    return depth("Message", ())


def test_schema_is_acyclic_so_every_walk_is_bounded():
    """The verifier walks by schema type; uoffsets only point forwards (u32
    added to a position). With an acyclic schema a byte-level 'cycle' is read as
    a different table type at every level, so no buffer can make decode()
    nest deeper than the schema (7 levels incl. the nested TDLG snapshot); the
    64-level depth limit is a second line of defence that decode() cannot reach."""
    assert _schema_depth() < 64


def _table_refs(p):
    """(name, position of a table-typed uoffset, position of its parent table)."""
    car = body_of(p)
    graph = child(p, car, V("CreateAgentRequest", "graph"))
    nodes = child(p, graph, V("GraphDescription", "nodes"))
    node1 = elem(p, nodes, 1)
    params1 = child(p, node1, V("NodeDescription", "params"))
    tools = child(p, params1, V("ToolCallParams", "tools"))
    return [
        ("Message.body", field(p, root(p), V("Message", "body")), root(p)),
        ("CreateAgentRequest.graph", field(p, car, V("CreateAgentRequest", "graph")), car),
        ("CreateAgentRequest.voice", field(p, car, V("CreateAgentRequest", "voice")), car),
        ("GraphDescription.nodes[1]", nodes + 4 + 4, graph),
        ("NodeDescription.params", field(p, node1, V("NodeDescription", "params")), node1),
        ("ToolCallParams.sampling", field(p, params1, V("ToolCallParams", "sampling")), params1),
        ("ToolCallParams.tools[2]", tools + 4 + 8, params1),
    ]


@pytest.mark.parametrize("mode", ["self", "parent", "root", "vector_head"])
def test_offsets_pointing_back_to_themselves_or_a_parent(mode):
    base = SEEDS["CreateAgentRequest"]
    for name, fpos, parent in _table_refs(bytearray(base)):
        p = bytearray(base)
        if mode == "self":          # uoffset 0: the 'table' is the offset itself ->
            value = 0               # soffset 0 -> vtable = table -> vtable size 0
        elif mode == "parent":      # backwards: only reachable by 32-bit wrap-around
            value = parent - fpos
        elif mode == "root":
            value = -fpos
        else:
            value = -4
        put_u32(p, fpos, value)
        try:
            assert_malformed(bytes(p))
        except AssertionError as e:
            raise AssertionError(f"{name} ({mode}): {e}") from None


def test_deepest_legal_nesting_decodes():
    # Message > ExportDialogResponse > [nested] PersistedDialogSnapshot >
    # PersistedInteraction > PersistedComponent > PersistedKnowledge > PersistedKnowledgeEntry
    msg = codec.decode(SEEDS["ExportDialogResponse"])
    snap = codec.decode_root(codec.PersistedDialogSnapshot, bytes(msg.body.snapshot))
    knowledge = snap.interactions[0].components[1].body
    assert knowledge.entries[0].text == "North of the river."


def _dag(k1, k2, k3, k4=0):
    """A DAG of shared tables (each level's vector repeats ONE child offset):

      Message -> CreateAgentRequest -> graph: GraphDescription
        nodes: [k1 x N]            N  = NodeDescription{params: ToolCallParams P}
        P.tools: [k2 x D]          D  = ToolDefinition
        D.parameters: [k3 x T]     T  = ToolParamDefinition
        T.enum_values: [k4 x E]    E  = "" (one empty string)

    The verifier visits 3 + k1 * (2 + k2 * (1 + k3)) tables and
    k1 * k2 * k3 * k4 strings; the buffer is only ~4 * (k1+k2+k3+k4) bytes."""
    r = Raw()
    mvt = r.vtable(12, 4, 8)
    m = r.table(mvt, struct.pack("<B3xI", int(codec.MessageBody.CreateAgentRequest), 0))
    r.link(0, m)
    cvt = r.vtable(8, 0, 4)                         # CreateAgentRequest: graph @+4
    c = r.table(cvt, bytes(4))
    r.link(m + 8, c)
    gvt = r.vtable(8, 4)                            # GraphDescription: nodes @+4
    g = r.table(gvt, bytes(4))
    r.link(c + 4, g)
    nodes = r.offsets_vector(k1)
    r.link(g + 4, nodes)
    nvt = r.vtable(12, 0, 4, 8)                     # NodeDescription: params_type @+4,
    n = r.table(nvt, struct.pack("<B3xI", int(codec.NodeParams.ToolCallParams), 0))
    for i in range(k1):
        r.link(nodes + 4 + 4 * i, n)
    pvt = r.vtable(8, 0, 0, 0, 4)                   # ToolCallParams: tools @+4
    pt = r.table(pvt, bytes(4))
    r.link(n + 8, pt)
    tools = r.offsets_vector(k2)
    r.link(pt + 4, tools)
    dvt = r.vtable(8, 0, 0, 4)                      # ToolDefinition: parameters @+4
    d = r.table(dvt, bytes(4))
    for i in range(k2):
        r.link(tools + 4 + 4 * i, d)
    params = r.offsets_vector(k3)
    r.link(d + 4, params)
    tvt = r.vtable(8, 0, 0, 0, 0, 4)                # ToolParamDefinition: enum_values @+4
    t = r.table(tvt, bytes(4))
    for i in range(k3):
        r.link(params + 4 + 4 * i, t)
    values = r.offsets_vector(k4)
    r.link(t + 4, values)
    e = r.string(b"")
    for i in range(k4):
        r.link(values + 4 + 4 * i, e)
    return r.bytes()


def test_shared_table_dag_control():
    msg = codec.decode(_dag(3, 2, 2, 2))
    nodes = msg.body.graph.nodes
    assert len(nodes) == 3
    assert nodes[2].params.tools[1].parameters[1].enum_values == ("", "")


def test_table_count_limit_stops_a_fan_out_bomb():
    data = _dag(128, 128, 128)      # ~2.1 million table visits from a 1.6 KB buffer
    assert len(data) < 4096
    assert_malformed(data)


def test_shared_large_string_zip_bomb_hits_the_work_budget():
    """CreateStringStorageRequest.strings = 100 000 offsets to ONE 256 KiB
    non-ASCII string: ~25 GB of UTF-8 validation without a budget.

      0 root | 4 Message vtable | 12 Message(tag 17) | 24 CSSR vtable (strings @+4)
      CSSR table | strings vector: u32 K, K uoffsets | the shared string"""
    def build(k, text):
        r = Raw()
        mvt = r.vtable(12, 4, 8)
        m = r.table(mvt, struct.pack("<B3xI",
                                     int(codec.MessageBody.CreateStringStorageRequest), 0))
        r.link(0, m)
        svt = r.vtable(8, 0, 0, 0, 4)
        s = r.table(svt, bytes(4))
        r.link(m + 8, s)
        vec = r.offsets_vector(k)
        r.link(s + 4, vec)
        st_ = r.string(text)
        for i in range(k):
            r.link(vec + 4 + 4 * i, st_)
        return r.bytes()

    small = codec.decode(build(3, "é".encode() * 4)).body.strings
    assert small == ("éééé",) * 3
    bomb = build(100_000, "é".encode() * (128 * 1024))
    assert len(bomb) < codec.MAX_FRAME
    assert_malformed(bomb)


_CHILD_DECODE = textwrap.dedent("""
    import json, sys, time
    from tryll_fast import codec
    data = open(sys.argv[1], "rb").read()
    t0 = time.perf_counter()
    try:
        codec.decode(data)
        out = "ok"
    except codec.CodecError as e:
        out = type(e).__name__
    print(json.dumps({"result": out, "seconds": time.perf_counter() - t0}))
""")


def _decode_in_child(data, tmp_path, timeout):
    path = tmp_path / "input.bin"
    path.write_bytes(data)
    try:
        cp = subprocess.run([sys.executable, "-c", _CHILD_DECODE, str(path)], cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    assert cp.returncode == 0, cp.stderr[-2000:]
    return json.loads(cp.stdout)


def test_shared_empty_string_dag_is_bounded(tmp_path):
    """Verifier DoS guard: vectors of strings inside shared tables are
    re-walked on every visit, and an empty string occupies almost nothing. `_dag(64, 64, 64, 40000)` is a 160 KB frame
    (64**3 = 262 144 table visits, under the 1e6 limit) that makes the verifier
    check 64**3 * 40 000 = 1e10 empty strings: minutes of CPU for one frame
    (a 2-level ListModelsResponse{models: [131k x ModelInfo{languages:
    [131k x ""]}]} 1 MiB frame alone takes ~80 s). Verification must stay
    bounded by the buffer size: the work budget rejects it (MalformedMessage).
    The child-process timeout only guards against a hang."""
    small = _decode_in_child(_dag(2, 2, 2, 2), tmp_path, timeout=60)
    assert small is not None and small["result"] == "ok"
    data = _dag(64, 64, 64, 40_000)
    assert len(data) < codec.MAX_FRAME
    res = _decode_in_child(data, tmp_path, timeout=120)
    assert res is not None, (
        f"decode() of a {len(data)}-byte frame did not finish in 120 s "
        "(1e10 empty-string checks through shared vectors)")
    assert res["result"] == "MalformedMessage", res


# ---------------------------------------------------------------------------
# Decoded views over a buffer that changes after decode

def test_bytearray_cannot_be_resized_while_a_view_exists():
    ba = bytearray(SEEDS["TtsAudioFrame"])
    msg = codec.decode(ba)
    pcm = msg.body.pcm
    with pytest.raises(BufferError):
        ba.extend(b"\0" * 4096)
    with pytest.raises(BufferError):
        del ba[:]
    assert pcm.tolist() == list(codec.decode(bytes(ba)).body.pcm)


@pytest.mark.parametrize("patch", ["text_offset", "string_length", "table_soffset",
                                   "vtable_field", "body_offset"])
def test_view_rechecks_bounds_after_the_buffer_changes(patch):
    ba = answer_text_layout(b"hello")
    msg = codec.decode(ba)
    body = msg.body
    assert body.text == "hello"
    if patch == "text_offset":
        put_u32(ba, AT_TEXT_FIELD, MAX_U32)
        reader = lambda: body.text  # noqa: E731
    elif patch == "string_length":
        put_u32(ba, AT_STR, 0x7FFFFFFF)
        reader = lambda: body.text  # noqa: E731
    elif patch == "table_soffset":
        struct.pack_into("<i", ba, AT_TABLE, -0x7FFFFFFF)
        reader = lambda: msg.body  # noqa: E731  (a new view binds and checks)
    elif patch == "vtable_field":
        put_u16(ba, AT_VT + 8, 0xFFFF)
        reader = lambda: body.text  # noqa: E731
    else:
        put_u32(ba, AT_BODY_FIELD, 0xFFFFFFF0)
        reader = lambda: msg.body  # noqa: E731
    with pytest.raises(codec.MalformedMessage):
        reader()


def test_view_over_a_changed_vector_count_is_bounds_checked():
    ba = bytearray(SEEDS["TtsVisemeFrame"])
    msg = codec.decode(ba)
    body = msg.body
    assert len(body.visemes) == 9
    put_u32(ba, _visemes_vec(ba), MAX_U32)
    with pytest.raises(codec.MalformedMessage):
        body.visemes
    ba = bytearray(SEEDS["TtsAudioFrame"])
    body = codec.decode(ba).body
    put_u32(ba, _pcm_vec(ba), 0x80000000)
    with pytest.raises(codec.MalformedMessage):
        body.pcm


def test_view_over_changed_string_bytes_raises_a_codec_error():
    """BUG: after decode, making a string's bytes invalid UTF-8 makes the
    property raise UnicodeDecodeError (from PyUnicode_DecodeUTF8 in
    _rd_string_at), which is not a CodecError."""
    ba = answer_text_layout(b"hello")
    body = codec.decode(ba).body
    ba[AT_STR + 4] = 0xFF
    with pytest.raises(codec.CodecError):
        body.text


def test_view_over_a_changed_union_tag_reads_the_unknown_tag():
    """After decode, an unknown Message.body tag written into the buffer: `body` is None
    and `body_type` is the raw tag number (an unknown enum value reads as its number, as
    in flatc's runtimes), never a plain ValueError from the enum."""
    ba = answer_text_layout(b"hello")
    msg = codec.decode(ba)
    assert msg.body_type is codec.MessageBody.AnswerText
    ba[AT_TAG] = 200
    assert msg.body is None
    tag = msg.body_type
    assert tag == 200 and type(tag) is int


def test_any_change_after_decode_gives_values_or_codec_errors():
    """Patch every aligned u32 (hostile offset values) and every byte (0xFF)
    of each seed after decoding it from a bytearray, then read everything
    through the SAME view. Collects every distinct non-CodecError."""
    failures = {}
    for name, payload in SEEDS.items():
        ba = bytearray(payload)
        msg = codec.decode(ba)
        patches = [(pos, struct.pack("<I", v)) for pos in range(0, len(ba) - 3, 4)
                   for v in (MAX_U32, 0x7FFFFFFF, 0x80000000, len(ba) - pos)]
        patches += [(pos, b"\xff") for pos in range(len(ba))]
        for pos, new in patches:
            old = bytes(ba[pos:pos + len(new)])
            ba[pos:pos + len(new)] = new
            try:
                corpus.read_everything(msg)
            except codec.CodecError:
                pass
            except Exception as e:  # noqa: BLE001 - that is the finding
                kind = re.sub(r"0x[0-9a-f]+|\d+", "N", str(e).split(":")[0])[:50]
                failures.setdefault((type(e).__name__, kind), []).append(
                    f"{name}: bytes {pos}..{pos + len(new)} := {new.hex()}")
            ba[pos:pos + len(old)] = old
    assert not failures, "non-CodecError after changing a decoded buffer:\n" + "\n".join(
        f"  {k[0]} ({k[1]}) x{len(v)}, first: {v[0]}" for k, v in failures.items())


# ---------------------------------------------------------------------------
# Bounded fuzzing

FUZZ_SEED = 20240601
FUZZ_COUNT = 100_000

_CHILD_FUZZ = textwrap.dedent("""
    import json, os, random, struct, sys, time
    from tryll_fast import codec
    from fuzz import corpus
    seed, count, last_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    fd = os.open(last_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
    rng = random.Random(seed)
    seeds = corpus.seeds()
    failures = {}
    decoded = unknown = malformed = 0
    t0 = time.perf_counter()
    for i in range(count):
        data = corpus.mutate(seeds[i % len(seeds)], rng)
        # the current input, so a crash or hang can be reported
        os.pwrite(fd, struct.pack("<II", i, len(data)) + data, 0)
        try:
            if not isinstance(codec.peek_body_type(data), int):
                raise AssertionError("peek_body_type returned a non-int")
            try:
                msg = codec.decode(data)
            except codec.UnknownMessageType:
                unknown += 1
                continue
            except codec.MalformedMessage:
                malformed += 1
                continue
            decoded += 1
            corpus.read_everything(msg)      # incl. to_dict() and union tags
        except codec.CodecError:
            pass
        except BaseException as e:
            key = type(e).__name__ + ": " + str(e)[:80]
            if key not in failures:
                failures[key] = {"index": i, "hex": data.hex()}
    print(json.dumps({"seconds": time.perf_counter() - t0, "decoded": decoded,
                      "unknown": unknown, "malformed": malformed,
                      "failures": failures}))
""")


@pytest.mark.fuzz
def test_fuzz_mutated_seed_frames(tmp_path):
    """100 000 frames mutated from the corpus (fixed seed) through decode(),
    peek_body_type() and, when accepted, every accessor + to_dict(). Runs in a
    child process so that a crash or a hang is reported with its input."""
    last = tmp_path / "last_input.bin"
    try:
        cp = subprocess.run(
            [sys.executable, "-c", _CHILD_FUZZ, str(FUZZ_SEED), str(FUZZ_COUNT), str(last)],
            cwd=ROOT, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        cp = None
    if cp is None or cp.returncode != 0:
        raw = last.read_bytes()
        i, n = struct.unpack_from("<II", raw)
        how = "hung (600 s)" if cp is None else f"died with exit code {cp.returncode}"
        pytest.fail(f"fuzz child {how} on seed={FUZZ_SEED} index={i}: "
                    f"{raw[8:8 + n].hex()}\n{'' if cp is None else cp.stderr[-3000:]}")
    res = json.loads(cp.stdout)
    print(f"fuzz: {FUZZ_COUNT} frames in {res['seconds']:.1f} s; decoded {res['decoded']}, "
          f"malformed {res['malformed']}, unknown type {res['unknown']}")
    # the mutator must keep a useful share of valid frames and of each error
    assert res["decoded"] > FUZZ_COUNT // 50
    assert res["malformed"] > FUZZ_COUNT // 10
    assert res["unknown"] > 0
    assert not res["failures"], f"seed={FUZZ_SEED}: non-CodecError exceptions:\n" + "\n".join(
        f"  {k}\n    index={v['index']} hex={v['hex']}" for k, v in res["failures"].items())


def test_mutator_is_deterministic():
    a = [corpus.mutate(s, random.Random(5)) for s in corpus.seeds()]
    b = [corpus.mutate(s, random.Random(5)) for s in corpus.seeds()]
    assert a == b
    assert a != corpus.seeds()
    rng = random.Random(1)
    assert all(isinstance(corpus.mutate(b"", rng), bytes) for _ in range(100))


def test_corpus_writer(tmp_path):
    paths = corpus.write_corpus(str(tmp_path / "c"))
    assert len(paths) == len(SEEDS)
    assert sorted(Path(p).read_bytes() for p in paths) == sorted(SEEDS.values())


_HYP = settings(max_examples=1500, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@_HYP
@given(st.binary(max_size=600))
def test_random_garbage(data):
    decode_and_read(data)


@_HYP
@given(root_offset=st.integers(0, 64), rest=st.binary(min_size=4, max_size=300))
def test_random_garbage_with_a_plausible_root(root_offset, rest):
    decode_and_read(struct.pack("<I", root_offset) + rest)


_SEED_LIST = list(SEEDS.values())
_PATCH = st.one_of(
    st.tuples(st.just(1), st.integers(0, 1 << 16), st.integers(0, 255)),
    st.tuples(st.just(4), st.integers(0, 1 << 16),
              st.one_of(st.sampled_from([0, 1, 4, 0x7FFFFFFF, 0x80000000, MAX_U32]),
                        st.integers(0, MAX_U32))),
)


@settings(max_examples=1500, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, len(_SEED_LIST) - 1), patches=st.lists(_PATCH, min_size=1,
                                                                   max_size=6))
def test_structure_aware_patches_of_valid_frames(which, patches):
    p = bytearray(_SEED_LIST[which])
    for width, pos, value in patches:
        if width == 1:
            p[pos % len(p)] = value
        else:
            at = (pos % (len(p) // 4)) * 4
            put_u32(p, at, value)
    decode_and_read(bytes(p))
