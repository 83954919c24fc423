"""peek_request_id / peek_body_type: what a server can still read from a frame that failed
verification, with bounds checks only."""
import struct

import pytest

from tryll_fast import codec


def payload(body) -> bytes:
    return codec.encode(body)[4:]


def test_request_id_of_valid_requests_and_replies():
    assert codec.peek_request_id(payload(codec.ListModelsRequest(request_id=77))) == 77
    assert codec.peek_request_id(payload(codec.Ack(request_id=2**32 - 1))) == 2**32 - 1
    assert codec.peek_request_id(payload(codec.ListModelsRequest())) == 0


def test_tables_without_request_id_give_zero():
    # AudioBuffer's field 0 is voice_input_id: it must not be mistaken for a request id
    assert codec.peek_request_id(payload(codec.AudioBuffer(voice_input_id=55))) == 0
    assert codec.peek_request_id(payload(codec.SetInferenceThrottle(throttle=0.5))) == 0
    assert codec.peek_request_id(payload(codec.WireTranscriptUpdate(voice_input_id=5))) == 0


def test_request_id_is_64_bit():
    rid = 2**64 - 3
    assert codec.peek_request_id(payload(codec.ListModelsRequest(request_id=rid))) == rid
    assert codec.peek_request_id(payload(codec.AnswerText(request_id=rid, agent_id=1))) == rid


def test_request_id_survives_damage_elsewhere():
    data = bytearray(payload(codec.SetSessionLocaleRequest(request_id=31337, locale="de")))
    at = bytes(data).rfind(b"de\x00")
    struct.pack_into("<I", data, at - 4, 10_000)       # the string now runs past the end
    with pytest.raises(codec.MalformedMessage):
        codec.decode(bytes(data))
    assert codec.peek_request_id(bytes(data)) == 31337


@pytest.mark.parametrize("data", [b"", b"\x00" * 3, b"\xff" * 64, b"\x04\x00\x00\x00" * 2,
                                  bytes(range(40))])
def test_garbage_gives_zero(data):
    assert codec.peek_request_id(data) == 0
    assert codec.peek_body_type(data) in range(256)


def test_answer_text_fast_path_is_byte_identical():
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=300, deadline=None)
    @given(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.text(max_size=40),
           st.text(max_size=300), st.booleans(), st.booleans())
    def check(request_id, agent_id, node, text, delta, final):
        slow = codec.encode(codec.AnswerText(request_id=request_id, agent_id=agent_id,
                                             node_name=node, text=text, is_delta=delta,
                                             is_final=final))
        assert codec.encode_answer_text(request_id, agent_id, node, text, delta, final) == slow

    check()
    with pytest.raises(codec.FrameTooLarge):
        codec.encode_answer_text(1, 1, "n", "x" * (1 << 20), True, False)


def test_structural_fields_come_from_the_schema():
    assert codec.GenerateParams.STRUCTURAL == {"model_name", "input", "context_size", "context",
                                              "default_exit", "adaptation"}
    assert "sampling" not in codec.ToolCallParams.STRUCTURAL
    assert {"tools", "pause_timeout_ms", "tool_called_exit"} <= codec.ToolCallParams.STRUCTURAL
    assert codec.SamplingOverrides.STRUCTURAL == {"max_tokens"}
    assert codec.AnswerText.STRUCTURAL == frozenset()


def test_answer_text_of_reads_a_whole_answer_text_frame():
    frame = codec.encode(codec.AnswerText(request_id=2**64 - 1, agent_id=4, node_name="n",
                                          text="héllo ", is_delta=True))
    assert codec.answer_text_of(frame) == (2**64 - 1, "héllo ")
    assert codec.answer_text_of(codec.encode(codec.AnswerText(request_id=3))) == (3, "")
    assert codec.answer_text_of(codec.encode(codec.Ack(request_id=3))) is None


def test_answer_text_of_is_none_for_anything_unreadable():
    frame = codec.encode(codec.AnswerText(request_id=9, text="token "))
    assert codec.answer_text_of(frame[4:]) is None                # no length prefix
    assert codec.answer_text_of(frame[:-2]) is None               # the prefix disagrees
    for cut in range(len(frame)):                                 # garbage after a good prefix
        mangled = bytearray(frame)
        mangled[cut] ^= 0xFF
        got = codec.answer_text_of(bytes(mangled))
        assert got is None or isinstance(got, tuple)
    assert codec.answer_text_of(b"") is None
