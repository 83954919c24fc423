"""Builder rejections: every bad value raises EncodeError (a CodecError and a
TypeError) whose message names "Table.field" and the violated constraint;
oversized frames raise FrameTooLarge (5003)."""
from __future__ import annotations

import array
import re
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tryll_fast import codec  # noqa: E402

U32 = "[0, 4294967295]"
U64 = "[0, 18446744073709551615]"
I32 = "[-2147483648, 2147483647]"


def expect(body, where: str, constraint: str, *, root=False):
    """encode(body) must raise EncodeError naming `where` and `constraint`."""
    with pytest.raises(codec.EncodeError) as ei:
        codec.encode_root(body) if root else codec.encode(body)
    e = ei.value
    assert isinstance(e, codec.CodecError) and isinstance(e, TypeError)
    msg = str(e)
    assert re.match(rf"{re.escape(where)}(\[\])?: ", msg), msg
    assert constraint in msg, msg
    return msg


def voice(**kw):
    return codec.SetAgentVoiceRequest(voice=codec.VoiceProfile(**kw))


# ---------------------------------------------------------------------------
# Scalars

@pytest.mark.parametrize("body, where, constraint", [
    (codec.AnswerText(agent_id=-1), "AnswerText.agent_id", f"-1 is outside {U64}"),
    (codec.SendMessageRequest(request_id=-1), "SendMessageRequest.request_id",
     f"-1 is outside {U64}"),
    (codec.TurnComplete(tokens_generated=-5), "TurnComplete.tokens_generated",
     f"-5 is outside {U32}"),
    (codec.ErrorResponse(code=-(2 ** 70)), "ErrorResponse.code", "is outside [0, 4294967295]"),
], ids=["ulong", "ulong-request_id", "uint", "uint-huge-negative"])
def test_negative_value_for_an_unsigned_field(body, where, constraint):
    expect(body, where, constraint)


@pytest.mark.parametrize("body, where, constraint", [
    (codec.TtsAudioFormatFrame(format=codec.WireAudioFormat(channels=65536)),
     "WireAudioFormat.channels", "65536 is outside [0, 65535]"),
    (codec.TtsAudioFormatFrame(format=codec.WireAudioFormat(bits_per_sample=-1)),
     "WireAudioFormat.bits_per_sample", "-1 is outside [0, 65535]"),
    (voice(speaker_id=2 ** 31), "VoiceProfile.speaker_id", f"2147483648 is outside {I32}"),
    (voice(speaker_id=-2 ** 31 - 1), "VoiceProfile.speaker_id", f"-2147483649 is outside {I32}"),
    (codec.AnswerText(agent_id=2 ** 64), "AnswerText.agent_id",
     f"18446744073709551616 is outside {U64}"),
    (codec.SendMessageRequest(request_id=2 ** 64), "SendMessageRequest.request_id",
     f"18446744073709551616 is outside {U64}"),
    (codec.UpdateAgentVariablesRequest(updates=[codec.VariableUpdate(
        name="hp", value=codec.VarInt(value=2 ** 63))]), "VarInt.value",
     "9223372036854775808 is outside [-9223372036854775808, 9223372036854775807]"),
    (codec.TurnComplete(status=256), "TurnComplete.status", "256 is outside [0, 255]"),
    (codec.TtsVisemeFrame(visemes=[(2 ** 32, 1)]),
     "TtsVisemeFrame.visemes", f"VisemeCue.sample_offset: 4294967296 is outside {U32}"),
], ids=["ushort", "ushort-negative", "int-high", "int-low", "ulong", "ulong-request_id", "long",
        "enum-ubyte", "struct-uint"])
def test_overflow(body, where, constraint):
    expect(body, where, constraint)


def test_struct_values_are_checked_when_built():
    with pytest.raises(codec.EncodeError) as ei:
        codec.VisemeCue(sample_offset=-1, viseme=1)
    assert str(ei.value).startswith("VisemeCue.sample_offset: -1 is outside")
    with pytest.raises(codec.EncodeError) as ei:
        codec.VisemeCue(sample_offset=1, viseme=256)
    assert str(ei.value).startswith("VisemeCue.viseme: 256 is outside [0, 255]")
    expect(codec.TtsVisemeFrame(visemes=[5]), "TtsVisemeFrame.visemes",
           "expected VisemeCue, a tuple or a dict, got int")


def test_largest_and_smallest_values_are_accepted():
    for body in (codec.AnswerText(agent_id=2 ** 64 - 1),
                 codec.TtsAudioFormatFrame(format=codec.WireAudioFormat(channels=65535)),
                 voice(speaker_id=2 ** 31 - 1), voice(speaker_id=-2 ** 31),
                 codec.SendMessageRequest(request_id=2 ** 64 - 1)):
        assert codec.decode_frame(codec.encode(body)).body.to_dict() == body.to_dict()


@pytest.mark.parametrize("body, where, got", [
    (codec.AnswerText(agent_id="1"), "AnswerText.agent_id", "str"),
    (codec.SendMessageRequest(request_id="7"), "SendMessageRequest.request_id", "str"),
    (voice(speaker_id="3"), "VoiceProfile.speaker_id", "str"),
    (codec.AnswerText(agent_id=1.0), "AnswerText.agent_id", "float"),
    (codec.AnswerText(agent_id=b"1"), "AnswerText.agent_id", "bytes"),
    (codec.TurnComplete(status="Success"), "TurnComplete.status", "str"),
])
def test_wrong_type_for_an_int_field(body, where, got):
    expect(body, where, f"expected an int, got {got}")


@pytest.mark.parametrize("value, got", [("x", "str"), ("1.5", "str"), (b"1", "bytes"),
                                        (1j, "complex"), ([1.0], "list"), (object(), "object")])
def test_float_field_rejects_non_numbers(value, got):
    expect(codec.SetInferenceThrottle(throttle=value), "SetInferenceThrottle.throttle",
           f"expected a number, got {got}")
    expect(voice(speed=value), "VoiceProfile.speed", f"expected a number, got {got}")


def test_float_field_given_a_multi_element_array():
    """BUG: a 2-element numpy array for a float field escapes as numpy's plain
    TypeError ('only 0-dimensional arrays can be converted to Python scalars')
    from float(x) in _cv_float, without the field name."""
    expect(codec.SetInferenceThrottle(throttle=np.array([0.5, 0.25])),
           "SetInferenceThrottle.throttle", "expected a number")


@pytest.mark.parametrize("value, got", [("yes", "str"), ("", "str"), (b"\x01", "bytes"),
                                        (1.0, "float"), ([True], "list")])
def test_bool_field_rejects_non_bools(value, got):
    expect(codec.AnswerText(is_delta=value), "AnswerText.is_delta", f"expected a bool, got {got}")


@pytest.mark.parametrize("value, got", [(5, "int"), (1.5, "float"), (["a"], "list"),
                                        (True, "bool"), (object(), "object")])
def test_string_field_rejects_non_strings(value, got):
    expect(codec.AnswerText(text=value), "AnswerText.text", f"expected str, got {got}")
    expect(codec.SendMessageRequest(text=value), "SendMessageRequest.text",
           f"expected str, got {got}")


@pytest.mark.parametrize("raw, at", [(b"\xff", 0), (b"ok\xc0\xaf", 2), (b"\xed\xa0\x80", 0),
                                     (b"abc\xe2\x82", 3), (b"\xf4\x90\x80\x80", 0)])
def test_string_field_rejects_bytes_that_are_not_utf8(raw, at):
    for value in (raw, bytearray(raw), memoryview(raw)):
        expect(codec.AnswerText(text=value), "AnswerText.text",
               f"bytes are not valid UTF-8 (at byte {at})")


def test_string_field_accepts_utf8_bytes_likes():
    ref = codec.encode(codec.AnswerText(text="grüße"))
    for value in ("grüße".encode(), bytearray("grüße".encode()), memoryview("grüße".encode())):
        assert codec.encode(codec.AnswerText(text=value)) == ref


def test_string_field_rejects_a_lone_surrogate():
    """BUG: a str holding a lone surrogate escapes as UnicodeEncodeError from
    PyUnicode_AsUTF8AndSize (declared `except NULL`, so the EncodeError branch
    after it in _cv_string is dead code) instead of EncodeError naming the field."""
    expect(codec.AnswerText(text="ok\ud800"), "AnswerText.text", "UTF-8")


# ---------------------------------------------------------------------------
# Vectors, tables, unions

@pytest.mark.parametrize("value, got", [("abc", "str"), ({"a": 1}, "dict"), (b"ab", "bytes"),
                                        (5, "int"), (iter(["a"]), "list_iterator")])
def test_vector_field_rejects_a_str_or_a_dict(value, got):
    expect(codec.CreateStringStorageRequest(strings=value), "CreateStringStorageRequest.strings",
           f"expected a list, got {got}")
    expect(codec.NodeEvent(kv_pairs=value), "NodeEvent.kv_pairs", f"expected a list, got {got}")


def test_vector_elements_are_checked():
    expect(codec.CreateStringStorageRequest(strings=["a", 5]), "CreateStringStorageRequest.strings",
           "expected str, got int")
    expect(codec.TtsAudioFrame(pcm=[1, 256]), "TtsAudioFrame.pcm", "256 is outside "
           "[0, 255]")
    expect(codec.ExportDialogResponse(snapshot=[1, 256]), "ExportDialogResponse.snapshot",
           "256 is outside [0, 255]")
    expect(codec.NodeEvent(kv_pairs=[codec.NodeParam(key="a"), codec.VarInt()]),
           "NodeEvent.kv_pairs", "expected NodeParam or a dict, got VarInt")


def test_nested_table_of_the_wrong_type():
    expect(codec.CreateAgentRequest(voice=codec.DeliveryMode(name="x")),
           "CreateAgentRequest.voice", "expected VoiceProfile or a dict, got DeliveryMode")
    expect(codec.CreateAgentRequest(graph="graph"), "CreateAgentRequest.graph",
           "expected GraphDescription or a dict, got str")
    expect(codec.CreateAgentRequest(voice={"model_name": "m", "bogus": 1}),
           "CreateAgentRequest.voice", "bogus")


def test_errors_deep_inside_name_the_innermost_table():
    bad = codec.CreateAgentRequest(graph=codec.GraphDescription(nodes=[codec.NodeDescription(
        name="t", params=codec.ToolCallParams(tools=[codec.ToolDefinition(
            name="x", parameters=[codec.ToolParamDefinition(name="p", required="yes")])]))]))
    expect(bad, "ToolParamDefinition.required", "expected a bool, got str")


def test_union_field_given_a_non_member_table():
    expect(codec.ChangeAgentParamRequest(params=codec.VarInt(value=1)),
           "ChangeAgentParamRequest.params", "expected a NodeParams member table, got VarInt")
    expect(codec.UpdateAgentVariablesRequest(updates=[codec.VariableUpdate(
        name="x", value=codec.GenerateParams())]),
        "VariableUpdate.value", "expected a VariableValue member table, got GenerateParams")
    expect(codec.AgentVariable(name="x", value=codec.AnswerText()), "AgentVariable.value",
           "expected a VariableValue member table, got AnswerText", root=True)
    expect(codec.ChangeAgentParamRequest(params={"NotAMember": {}}),
           "ChangeAgentParamRequest.params", "'NotAMember' is not a NodeParams member")
    # Message.body itself
    expect(codec.VarInt(value=1), "Message.body", "expected a MessageBody member table, got VarInt")
    expect(codec.PersistedDialogSnapshot(), "Message.body",
           "expected a MessageBody member table, got PersistedDialogSnapshot")
    expect(5, "Message.body", "expected a MessageBody member table, got int")


def test_unknown_keyword_argument_is_a_type_error():
    for cls in (codec.AnswerText, codec.CreateAgentRequest, codec.VarInt, codec.Message):
        with pytest.raises(TypeError) as ei:
            cls(bogus_field=1)
        assert not isinstance(ei.value, codec.CodecError)
        assert "bogus_field" in str(ei.value)


# ---------------------------------------------------------------------------
# PCM ([ubyte] holding int16 little-endian) through the buffer protocol

PCM = [0, 1, -1, 32767, -32768, 1234, -4321, 7]
PCM_BYTES = array.array("h", PCM).tobytes()


def test_pcm_accepted_forms_give_identical_bytes():
    ref = codec.encode(codec.TtsAudioFrame(agent_id=3, node_name="n", pcm=PCM_BYTES))
    forms = {
        "bytes": PCM_BYTES,
        "bytearray": bytearray(PCM_BYTES),
        "list of bytes": list(PCM_BYTES),
        "numpy uint8": np.frombuffer(PCM_BYTES, dtype=np.uint8),
        "array('h')": array.array("h", PCM),
        "numpy int16": np.array(PCM, dtype=np.int16),
        "numpy <i2": np.array(PCM, dtype="<i2"),
        "numpy uint16": np.array(PCM).astype(np.uint16),
        "numpy 2-D C-contiguous": np.array(PCM, dtype=np.int16).reshape(2, 4),
        "memoryview cast h": memoryview(PCM_BYTES).cast("h"),
        "memoryview of array": memoryview(array.array("h", PCM)),
    }
    for name, pcm in forms.items():
        got = codec.encode(codec.TtsAudioFrame(agent_id=3, node_name="n", pcm=pcm))
        assert got == ref, name
    assert bytes(codec.decode_frame(ref).body.pcm) == PCM_BYTES
    # AudioBuffer.pcm is the same [ubyte] type
    ref = codec.encode(codec.AudioBuffer(pcm=PCM_BYTES))
    assert codec.encode(codec.AudioBuffer(pcm=np.array(PCM, dtype=np.int16))) == ref


@pytest.mark.parametrize("pcm, fmt", [
    (np.array(PCM, dtype=np.float32), "'f'"),
    (np.array(PCM, dtype=np.int32), "'i'"),
    (np.array(PCM, dtype=">i2"), "'>h'"),
    (array.array("f", PCM), "'f'"),
], ids=["float32", "int32", "big-endian", "array-f"])
def test_pcm_buffer_of_the_wrong_format(pcm, fmt):
    msg = expect(codec.TtsAudioFrame(pcm=pcm), "TtsAudioFrame.pcm", "does not match element "
                 "format 'B' (or int16 samples)")
    assert f"buffer of format {fmt}" in msg


def test_pcm_non_contiguous_array():
    """One channel of interleaved stereo (`stereo[::2]`, a strided int16 view) is copied
    sample by sample: the same bytes as the mono samples."""
    stereo = np.array([v for s in PCM for v in (s, -1)], dtype=np.int16)
    mono = stereo[::2]
    ref = codec.encode(codec.TtsAudioFrame(pcm=PCM_BYTES))
    assert codec.encode(codec.TtsAudioFrame(pcm=mono)) == ref
    strided_bytes = np.frombuffer(PCM_BYTES * 2, dtype=np.uint8)[::2]
    assert bytes(codec.decode_frame(codec.encode(
        codec.TtsAudioFrame(pcm=strided_bytes))).body.pcm) == bytes(strided_bytes)


# ---------------------------------------------------------------------------
# Frame size

def test_frame_too_large():
    with pytest.raises(codec.FrameTooLarge) as ei:
        codec.encode(codec.AnswerText(text="x" * (codec.MAX_FRAME + 1)))
    e = ei.value
    assert e.code == 5003
    assert isinstance(e, codec.CodecError) and not isinstance(e, codec.EncodeError)
    assert "1048576" in str(e)
    for big in (codec.TtsAudioFrame(pcm=np.zeros(codec.MAX_FRAME // 2, dtype=np.int16)),
                codec.CreateStringStorageRequest(strings=["y" * 1000] * 1100),
                codec.AnswerText(text="z" * (4 * codec.MAX_FRAME))):
        with pytest.raises(codec.FrameTooLarge) as ei:
            codec.encode(big)
        assert ei.value.code == 5003


def test_frame_size_limit_is_exact():
    """The largest payload is exactly MAX_FRAME bytes; 4 more bytes of text
    (the next size with this layout) is FrameTooLarge."""
    overhead = len(codec.encode(codec.AnswerText(node_name="n", text="x" * 1000))) - 4 - 1000
    sizes = {}
    for n in range(codec.MAX_FRAME - overhead - 8, codec.MAX_FRAME - overhead + 8):
        try:
            sizes[n] = len(codec.encode(codec.AnswerText(node_name="n", text="x" * n))) - 4
        except codec.FrameTooLarge as e:
            assert e.code == 5003
            sizes[n] = None
    assert codec.MAX_FRAME in sizes.values()
    largest = max(n for n, s in sizes.items() if s is not None)
    assert sizes[largest] == codec.MAX_FRAME
    assert sizes[largest + 1] is None


def test_builder_is_clean_after_errors():
    """Builders are pooled: a failed encode must not leak state into the next."""
    ref = [codec.encode(codec.CreateAgentRequest(request_id=i, default_model_name="m"))
           for i in range(3)]
    for i in range(3):
        with pytest.raises(codec.EncodeError):
            codec.encode(codec.CreateAgentRequest(request_id=i, graph=codec.GraphDescription(
                nodes=[codec.NodeDescription(name="a", params=codec.SpeakParams(
                    min_sentence_chars="x"))])))
        with pytest.raises(codec.FrameTooLarge):
            codec.encode(codec.AnswerText(text="x" * (2 * codec.MAX_FRAME)))
        assert codec.encode(codec.CreateAgentRequest(request_id=i, default_model_name="m")) \
            == ref[i]
