"""The wire codec: FlatBuffers frames of protocol v29, compiled with Cython.

Owns: reading (verify, then lazy typed field access over the received bytes),
building (the FlatBuffers layout written directly, one buffer per frame), and
splitting a byte stream into frames. It knows the schema (schema/*.fbs, via
the generated `_generated.pxi`) and nothing about sessions, sockets or models.

    from tryll_fast import codec
    frame = codec.encode(codec.AnswerText(request_id=1, agent_id=7, text="Hello", is_delta=True))
    msg = codec.decode_frame(frame)
    msg.body_type          # MessageBody.AnswerText
    msg.body.text          # 'Hello'

Errors are typed and carry the protocol code: MalformedMessage (5001),
UnknownMessageType (5002), FrameTooLarge (5003); FramingError means the
connection must close; EncodeError names the field and the constraint.
"""
from tryll_fast.codec._codec import *  # noqa: F401,F403
from tryll_fast.codec._codec import (  # noqa: F401
    ENUMS, GENERATED_NAMES, MAX_FRAME, SCHEMA_FINGERPRINT, STRUCTS, TABLES, UNIONS,
    CodecError, EncodeError, FrameSplitter, FrameTooLarge, FramingError,
    MalformedMessage, Struct, Table, UnknownMessageType,
    answer_text_of, decode, decode_frame, decode_root, encode, encode_answer_text, encode_root,
    encode_tts_audio,
    peek_body_type, peek_request_id,
)
