"""Conformance of the compiled codec with the official FlatBuffers runtime.

For the same values our builder must write the same bytes as flatc's object-API
`Pack()`, our reader must read official bytes, and the official reader must read
ours. Every expectation comes from the official runtime or from the value tree
itself (reference.py), never from our own output alone.
"""
import array

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reference
from reference import Table, first_difference, live_fields

SCHEMA = reference.load_schema()
TABLES = [t.name for t in SCHEMA.of(Table)]
BODY_MEMBERS = [m for m, _ in SCHEMA.decls["MessageBody"].members]
NODE_PARAMS = [m for m, _ in SCHEMA.decls["NodeParams"].members]
NESTED = [t.name for t in SCHEMA.of(Table) if any("nested_flatbuffer" in f.attrs for f in t.fields)]
OPTIONAL_OFFSET_FIELDS = [(t.name, f.name) for t in SCHEMA.of(Table) for f in live_fields(t)
                          if f.type.kind in ("string", "vector")]
MAX = 1048576

FUZZ = settings(deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def numeric_fields(decl):
    return [f for f in live_fields(decl) if f.type.kind == "scalar" and f.type.name != "bool"]


def check_root(codec, ref, name, tree):
    """`tree` as a standalone root: both readers agree with it, bytes are identical."""
    cls = getattr(codec, name)
    expected = ref.expected(ref.decl(name), tree)
    official = ref.pack_root(name, tree)
    ours = codec.encode_root(cls(**tree))
    assert codec.decode_root(cls, official).to_dict() == expected, "our reader, official bytes"
    assert ref.read_root(name, ours) == expected, "official reader, our bytes"
    assert ours == official, first_difference(ours, official)
    return ours


def check_frame(codec, ref, member, tree):
    """`tree` as a whole frame (length prefix + Message{body}), like check_root."""
    expected = {"body": {member: ref.expected(ref.decl(member), tree)}}
    official = ref.pack_frame(member, tree)
    ours = codec.encode(getattr(codec, member)(**tree))
    msg = codec.decode_frame(official)
    assert msg.body_type == BODY_MEMBERS.index(member) + 1
    assert msg.to_dict() == expected, "our reader, official frame"
    assert ref.read_frame(ours) == expected, "official reader, our frame"
    assert ours == official, first_difference(ours, official)
    return ours


# ---------------------------------------------------------------------------
# every table, random values

@pytest.mark.parametrize("name", TABLES)
@settings(FUZZ, max_examples=15)
@given(data=st.data())
def test_random_values_every_table(codec, ref, name, data):
    check_root(codec, ref, name, data.draw(ref.trees(name), label="tree"))


@pytest.mark.parametrize("name", TABLES)
def test_every_field_set_every_table(codec, ref, name):
    check_root(codec, ref, name, ref.full_tree(name))


@pytest.mark.parametrize("name", [t.name for t in SCHEMA.of(Table) if numeric_fields(t)])
@pytest.mark.parametrize("end", [0, 1], ids=["min", "max"])
def test_numeric_extremes(codec, ref, name, end):
    decl = ref.decl(name)
    check_root(codec, ref, name, {f.name: reference.extreme(f.type.name, end)
                                  for f in numeric_fields(decl)})


@pytest.mark.parametrize("name", TABLES)
def test_reads_cpp_builder_layout(codec, ref, name, tmp_path):
    """flatc's C++ builder (`flatc -b` from JSON) lays fields out by size: read it too."""
    tree = ref.full_tree(name, seed=2)
    data = ref.flatc_binary(name, tree, str(tmp_path))
    expected = ref.expected(ref.decl(name), tree)
    assert ref.read_root(name, data) == expected, "the JSON helper is wrong"
    assert codec.decode_root(getattr(codec, name), data).to_dict() == expected


@pytest.mark.parametrize("name", TABLES)
def test_all_defaults(codec, ref, name):
    check_root(codec, ref, name, {})


def scalar_fields(decl):
    return [f for f in live_fields(decl) if f.type.kind in ("scalar", "enum")]


@pytest.mark.parametrize("name", [t.name for t in SCHEMA.of(Table) if scalar_fields(t)])
def test_explicit_defaults_are_omitted(codec, ref, name):
    tree = {f.name: f.default for f in scalar_fields(ref.decl(name))}
    ours = check_root(codec, ref, name, tree)
    assert ours == ref.pack_root(name, {}), "a field set to its default must not be written"


@pytest.mark.parametrize("name,field", OPTIONAL_OFFSET_FIELDS,
                         ids=[f"{t}.{f}" for t, f in OPTIONAL_OFFSET_FIELDS])
def test_empty_string_or_vector_is_present(codec, ref, name, field):
    f = next(f for f in ref.decl(name).fields if f.name == field)
    empty = "" if f.type.kind == "string" else (b"" if reference.is_bytes_vector(f.type) else [])
    ours = check_root(codec, ref, name, {field: empty})
    assert ref.official_present(ref.official_root(name, ours), field), "empty must be written"
    absent = codec.encode_root(getattr(codec, name)())
    assert not ref.official_present(ref.official_root(name, absent), field)


# ---------------------------------------------------------------------------
# every MessageBody member as a frame

@pytest.mark.parametrize("member", BODY_MEMBERS)
def test_frame_every_member_all_fields(codec, ref, member):
    check_frame(codec, ref, member, ref.full_tree(member))


@pytest.mark.parametrize("member", BODY_MEMBERS)
@settings(FUZZ, max_examples=4)
@given(data=st.data())
def test_frame_every_member_random(codec, ref, member, data):
    check_frame(codec, ref, member, data.draw(ref.trees(member), label="tree"))


# ---------------------------------------------------------------------------
# specific shapes

@pytest.mark.parametrize("member", NODE_PARAMS)
def test_node_params_member_in_create_agent(codec, ref, member):
    params = ref.full_tree(member, seed=3)
    tree = {"request_id": 77, "default_model_name": "llama", "workload": 1,
            "graph": {"start_node": "n1",
                      "nodes": [{"name": "n1", "params": {member: params}},
                                {"name": "n2"}]}}
    frame = check_frame(codec, ref, "CreateAgentRequest", tree)
    node = codec.decode_frame(frame).body.graph.nodes[0]
    assert node.params_type == getattr(codec.NodeParams, member)
    assert type(node.params).__name__ == member


def test_vector_of_ten_tables(codec, ref):
    models = [ref.full_tree("ModelInfo", seed=i) for i in range(10)]
    frame = check_frame(codec, ref, "ListModelsResponse", {"request_id": 5, "models": models})
    view = codec.decode_frame(frame).body
    assert [m.name for m in view.models] == [m["name"] for m in models]


def test_vector_of_structs(codec, ref):
    cues = [(off, v) for off, v in zip([0, 1, 2**31, 2**32 - 1] * 4, range(15))]
    frame = check_frame(codec, ref, "TtsVisemeFrame",
                        {"request_id": 6, "node_name": "n", "visemes": cues, "sentence_index": 4})
    as_structs = codec.TtsVisemeFrame(request_id=6, node_name="n",
                                      visemes=[codec.VisemeCue(*c) for c in cues],
                                      sentence_index=4)
    assert codec.encode(as_structs) == frame
    view = codec.decode_frame(frame).body
    assert all(type(c) is codec.VisemeCue for c in view.visemes)
    assert [c.to_tuple() for c in view.visemes] == cues


@pytest.mark.parametrize("text", ["héllo", "日本語", "🙂👍🏽🏳️‍🌈", "Ωμέγα ∑ €", "a\x00b", "\U0010ffff",
                                  "ä" * 1000])
def test_non_ascii_strings(codec, ref, text):
    frame = check_frame(codec, ref, "AnswerText",
                        {"request_id": 2**64 - 1, "agent_id": 3, "node_name": text, "text": text,
                         "is_delta": True})
    assert text.encode("utf-8") + b"\x00" in frame
    body = codec.decode_frame(frame).body
    assert (body.text, body.node_name) == (text, text)


@pytest.mark.parametrize("name", NESTED)
def test_nested_dialog_snapshot(codec, ref, name):
    snap_tree = ref.full_tree("PersistedDialogSnapshot")
    snapshot = codec.encode_root(codec.PersistedDialogSnapshot(**snap_tree))
    assert snapshot[4:8] == b"TDLG"
    official_snapshot = ref.pack_root("PersistedDialogSnapshot", snap_tree)
    assert snapshot == official_snapshot, first_difference(snapshot, official_snapshot)

    frame = check_frame(codec, ref, name, {"request_id": 1, "agent_id": 2, "snapshot": snapshot})
    expected = ref.expected(ref.decl("PersistedDialogSnapshot"), snap_tree)
    view = codec.decode_frame(frame).body
    assert bytes(view.snapshot) == snapshot
    assert codec.decode_root(codec.PersistedDialogSnapshot, view.snapshot).to_dict() == expected
    assert ref.official_nested_snapshot(frame) == expected


def test_max_size_frame(codec, ref):
    rng = np.random.default_rng(29)
    tree = ref.tree_with_payload("TtsAudioFrame", "pcm", MAX,
                                 {"node_name": "speaker", "sample_offset": 7, "sentence_index": 1})
    n = len(tree["pcm"])
    tree["pcm"] = rng.integers(0, 256, n, dtype=np.uint8)
    official = ref.pack_frame("TtsAudioFrame", tree)
    assert len(official) - 4 == MAX

    ours = codec.encode(codec.TtsAudioFrame(**tree))
    assert len(ours) - 4 == MAX
    assert ours == official, first_difference(ours, official)
    body = codec.decode_frame(official).body
    assert np.array_equal(np.frombuffer(body.pcm, dtype=np.uint8), tree["pcm"])
    assert np.array_equal(ref.official_body(ours).PcmAsNumpy(), tree["pcm"])

    bigger = dict(tree, pcm=np.zeros(n + 1, dtype=np.uint8))
    assert len(ref.pack_frame("TtsAudioFrame", bigger)) - 4 > MAX
    with pytest.raises(codec.FrameTooLarge) as err:
        codec.encode(codec.TtsAudioFrame(**bigger))
    assert err.value.code == 5003


def test_large_pcm_is_zero_copy(codec, ref):
    # int16 samples go into the [ubyte] pcm field as their little-endian bytes
    pcm = np.arange(400_000, dtype=np.int64).astype(np.int16)
    frame = codec.encode(codec.AudioBuffer(voice_input_id=9, pcm=pcm))
    official = ref.pack_frame("AudioBuffer",
                              {"voice_input_id": 9, "pcm": pcm.astype("<i2").view(np.uint8)})
    assert frame == official, first_difference(frame, official)

    view = codec.decode_frame(frame).body.pcm
    assert isinstance(view, memoryview) and view.format == "B" and view.readonly
    samples = np.frombuffer(view, dtype="<i2")
    raw = np.frombuffer(frame, dtype=np.uint8)
    start = samples.__array_interface__["data"][0] - raw.__array_interface__["data"][0]
    assert 0 < start and start + samples.nbytes <= len(frame), "pcm must point into the frame"
    assert np.shares_memory(samples, raw)
    assert frame[start:start + samples.nbytes] == pcm.tobytes()
    assert np.array_equal(samples, pcm)


def test_size_prefixed_root_with_identifier(codec, ref):
    tree = ref.full_tree("PersistedDialogSnapshot", seed=5)
    ours = codec.encode_root(codec.PersistedDialogSnapshot(**tree), size_prefix=True)
    official = ref.pack_root("PersistedDialogSnapshot", tree, size_prefix=True)
    assert ours[8:12] == b"TDLG"
    assert ours == official, first_difference(ours, official)


# ---------------------------------------------------------------------------
# values given in other forms, and decoded views given back to the encoder

SAMPLES = [-32768, -1, 0, 1, 32767, 1234]
PCM = array.array("h", SAMPLES).tobytes()         # int16 little-endian, as on the wire
PCM_FORMS = {
    "bytes": PCM, "bytearray": bytearray(PCM), "list": list(PCM), "tuple": tuple(PCM),
    "numpy_u8": np.frombuffer(PCM, dtype=np.uint8), "memoryview": memoryview(PCM),
    # samples as the game holds them: their bytes as they lie in memory
    "array_h": array.array("h", SAMPLES), "numpy_i16": np.array(SAMPLES, dtype=np.int16),
    "memoryview_h": memoryview(array.array("h", SAMPLES)),
}   # strided numpy views: see test_encode_errors.py::test_pcm_non_contiguous_array


@pytest.mark.parametrize("form", PCM_FORMS.values(), ids=PCM_FORMS.keys())
def test_pcm_accepted_forms(codec, ref, form):
    official = ref.pack_frame("AudioBuffer", {"voice_input_id": 1, "pcm": PCM})
    ours = codec.encode(codec.AudioBuffer(voice_input_id=1, pcm=form))
    assert ours == official, first_difference(ours, official)
    assert bytes(codec.decode_frame(ours).body.pcm) == PCM
    assert array.array("h", bytes(codec.decode_frame(ours).body.pcm)).tolist() == SAMPLES


@pytest.mark.parametrize("tree", [{"temperature": 0.0, "top_k": 0, "seed": 0},
                                  {"max_tokens": -5, "repeat_penalty": 1.0},
                                  {"presence_penalty": float("inf")}, {}])
def test_optional_scalars(codec, ref, tree):
    """`= null` fields: a set value is written even when it is 0; absent reads None."""
    check_root(codec, ref, "SamplingOverrides", tree)
    view = codec.decode_root(codec.SamplingOverrides,
                             codec.encode_root(codec.SamplingOverrides(**tree)))
    for f in live_fields(ref.decl("SamplingOverrides")):
        if f.name == "stop":
            continue
        assert getattr(view, f.name) == tree.get(f.name), f.name


@pytest.mark.parametrize("member", BODY_MEMBERS)
def test_reencoded_view_matches_official(codec, ref, member):
    """A decoded view (union member views, memoryviews, struct tuples) re-encodes to
    exactly the bytes it was decoded from: absent fields stay absent, as in flatc's
    unpack-then-pack."""
    sparse = {k: v for i, (k, v) in enumerate(ref.full_tree(member).items()) if i % 2}
    official = ref.pack_frame(member, sparse)
    msg = codec.decode_frame(official)
    ours = codec.encode(msg)
    assert ours == official, first_difference(ours, official)
    assert codec.encode(msg.body) == official
