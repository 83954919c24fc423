"""Session and dispatch rules of the wire protocol, over real sockets."""
import math
import struct

import pytest

from tryll_fast import PROTOCOL_VERSION, codec
from tryll_fast.server.dispatch import CLIENT_MESSAGES, SERVER_MESSAGES, build_table
from tryll_fast.errors import ErrorCode

from wire import Wire, start_server, wait_for


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("srv"))
    yield srv
    srv.shutdown(2)


@pytest.fixture
def wire(server):
    w = Wire(server.address)
    yield w
    w.close()


@pytest.fixture
def session(wire):
    wire.create_session()
    return wire


def test_every_client_message_has_exactly_one_route():
    table = build_table()
    assert len(CLIENT_MESSAGES) + len(SERVER_MESSAGES) == 96
    for member in codec.MessageBody:
        route = table[int(member)]
        if member.name in CLIENT_MESSAGES:
            assert route is not None and route.name == member.name
        else:
            assert route is None, member.name


def test_connection_ready_comes_first(server):
    w = Wire(server.address, read_ready=False)
    ready = w.recv()
    assert isinstance(ready, codec.ConnectionReady)
    assert ready.protocol_version == PROTOCOL_VERSION == 29
    assert ready.mode == "dev"
    # which schema this build speaks: 16 hex digits of the schema files' sha256
    assert ready.codegen_fingerprint == codec.SCHEMA_FINGERPRINT
    assert len(ready.codegen_fingerprint) == 16 and int(ready.codegen_fingerprint, 16) >= 0
    w.close()


def test_game_name_is_kept_for_the_logs(server):
    with Wire(server.address) as w:
        reply = w.request(codec.CreateSessionRequest(request_id=1, game_name="Oakvale ✓"))
        assert isinstance(reply, codec.CreateSessionResponse)
        assert server.sessions[reply.session_id].game_name == "Oakvale ✓"


def test_release_mode_is_announced(tmp_path):
    srv = start_server(tmp_path, dev=False)
    try:
        with Wire(srv.address) as w:
            assert w.ready.mode == "release"
    finally:
        srv.shutdown(1)


def test_requests_before_create_session_get_2002_with_request_id(wire):
    err = wire.expect_error(codec.ListModelsRequest(request_id=77), ErrorCode.SessionNotReady)
    assert err.request_id == 77 and "CreateSessionRequest" in err.message
    wire.expect_error(codec.SetSessionLocaleRequest(request_id=78, locale="de"),
                      ErrorCode.SessionNotReady)


def test_throttle_and_audio_before_session_are_dropped_silently(wire, server):
    wire.send(codec.SetInferenceThrottle(throttle=0.9))
    wire.send(codec.AudioBuffer(voice_input_id=1, pcm=[1, 2, 3]))
    wire.nothing(0.3)
    assert server.throttle.effective == 0.0
    wire.create_session()          # the connection is fine, the frames were just dropped


def test_create_session_is_one_shot(wire):
    sid = wire.create_session(locale="en-US")
    assert sid > 0
    err = wire.expect_error(codec.CreateSessionRequest(request_id=5),
                            ErrorCode.SessionAlreadyExists)
    assert err.request_id == 5 and str(sid) in err.message


def test_session_ids_are_distinct(server):
    with Wire(server.address) as a, Wire(server.address) as b:
        assert a.create_session() != b.create_session()


@pytest.mark.parametrize("tag", ["de", "pt-BR", "en-US", "zh-Hant-TW", "sgn-BE-FR", "x-klingon",
                                 "de-DE-1996", "EN-us"])
def test_valid_locales(wire, tag):
    wire.create_session(locale=tag)
    assert isinstance(wire.request(codec.SetSessionLocaleRequest(request_id=9, locale=tag)),
                      codec.Ack)


@pytest.mark.parametrize("tag,why", [
    ("en_US", "'-'"), ("xx", "not a valid"), ("123", "not a valid"), ("en--US", "not a valid"),
    ("a" * 65, "at most 64"), (" de", "not a valid"), ("de-", "not a valid"),
])
def test_malformed_locales_get_2004(wire, tag, why):
    err = wire.expect_error(codec.CreateSessionRequest(request_id=3, locale=tag),
                            ErrorCode.InvalidLocale)
    assert why in err.message and "locale" in err.message
    sid = wire.create_session(locale="de")          # the failed one created nothing
    assert sid
    err = wire.expect_error(codec.SetSessionLocaleRequest(request_id=4, locale=tag),
                            ErrorCode.InvalidLocale)
    assert err.request_id == 4


def test_set_session_locale_changes_and_clears(server, session):
    s = next(x for x in server.connections if x.id == max(server.sessions))
    session.request(codec.SetSessionLocaleRequest(request_id=1, locale="fr"))
    assert s.locale == "fr"
    session.request(codec.SetSessionLocaleRequest(request_id=2, locale=""))
    assert s.locale == ""


@pytest.mark.parametrize("config,field", [
    (codec.ModelConfig(engines=[codec.EngineHint(role=9, engine=0)]), "engines[0].role"),
    (codec.ModelConfig(engines=[codec.EngineHint(role=0, engine=0),
                                codec.EngineHint(role=3, engine=200)]), "engines[1].engine"),
    (codec.ModelConfig(placement_hints=[codec.PlacementHint(model_name="m", placement=7)]),
     "placement_hints[0].placement"),
])
def test_out_of_range_engine_enums_get_2005(wire, config, field):
    err = wire.expect_error(codec.CreateSessionRequest(request_id=6, model_config=config),
                            ErrorCode.InvalidEngineSet)
    assert field in err.message


def test_engine_and_placement_hints_are_stored(server, wire):
    config = codec.ModelConfig(
        engines=[codec.EngineHint(role=codec.ModelRole.Language,
                                  engine=codec.InferenceEngine.LlamaCpp),
                 codec.EngineHint(role=codec.ModelRole.Tts,
                                  engine=codec.InferenceEngine.SherpaOnnx)],
        placement_hints=[codec.PlacementHint(model_name="SmolLM2-135M-Instruct",
                                             placement=codec.MemoryPlacement.Ram)])
    sid = wire.create_session(model_config=config)
    s = server.sessions[sid]
    assert s.engine_hints == ((0, 1), (3, 6))
    assert s.placement_hints == {"SmolLM2-135M-Instruct": 1}
    # the hint's one effect: the llama.cpp backend is initialised now, not at the first load
    from tryll_fast.engines.llama import backend
    assert wait_for(lambda: backend._ready)


def test_undecodable_frame_gets_5001_and_the_connection_survives(session):
    good = codec.encode(codec.ListModelsRequest(request_id=4242))[4:]
    broken = bytearray(good)
    broken[-1] ^= 0xFF           # damage the tail: verification fails
    broken = bytes(broken[:-8])   # and cut it
    session.send_payload(broken)
    err = session.recv()
    assert isinstance(err, codec.ErrorResponse) and err.code == ErrorCode.MalformedMessage
    session.send_payload(b"\x00" * 12)
    err = session.recv()
    assert err.code == ErrorCode.MalformedMessage
    assert isinstance(session.request(codec.SetSessionLocaleRequest(request_id=8, locale="de")),
                      codec.Ack)


def test_malformed_body_echoes_the_readable_request_id(session):
    payload = bytearray(codec.encode(codec.SetSessionLocaleRequest(request_id=31337,
                                                                   locale="de"))[4:])
    # make the locale string's length run past the end: verification fails, request_id is
    # still readable by bounds-checked reads
    text_at = bytes(payload).rfind(b"de\x00")
    struct.pack_into("<I", payload, text_at - 4, 1000)
    session.send_payload(bytes(payload))
    err = session.recv()
    assert err.code == ErrorCode.MalformedMessage and err.request_id == 31337


def test_unknown_union_tag_gets_5002_and_the_connection_survives(session):
    payload = bytearray(codec.encode(codec.ListModelsRequest(request_id=55))[4:])
    payload[body_type_offset(payload)] = 200
    session.send_payload(bytes(payload))
    err = session.recv()
    assert err.code == ErrorCode.UnknownMessageType and "200" in err.message
    assert isinstance(session.request(codec.SetSessionLocaleRequest(request_id=9, locale="de")),
                      codec.Ack)


def body_type_offset(payload) -> int:
    """Where Message.body_type (field 0, vtable slot 4) sits in a payload."""
    root = struct.unpack_from("<I", payload, 0)[0]
    vtable = root - struct.unpack_from("<i", payload, root)[0]
    return root + struct.unpack_from("<H", payload, vtable + 4)[0]


def test_server_to_client_messages_are_refused_with_5002(session):
    err = session.expect_error(codec.Ack(request_id=12), ErrorCode.UnknownMessageType)
    assert "server-to-client" in err.message
    session.send(codec.AnswerText(agent_id=1, text="hi"))
    err = session.recv()
    assert err.code == ErrorCode.UnknownMessageType and err.request_id == 0


def test_message_without_body_is_5001(session):
    session.send(codec.Message())
    err = session.recv()
    assert err.code == ErrorCode.MalformedMessage and "no body" in err.message


def test_a_known_body_type_without_its_table_is_5001(session):
    payload = bytearray(codec.encode(codec.ListModelsRequest(request_id=56))[4:])
    root = struct.unpack_from("<I", payload, 0)[0]
    vtable = root - struct.unpack_from("<i", payload, root)[0]
    struct.pack_into("<H", payload, vtable + 6, 0)           # Message.body: absent
    session.send_payload(bytes(payload))
    err = session.recv()
    assert err.code == ErrorCode.MalformedMessage and "ListModelsRequest" in err.message
    assert isinstance(session.request(codec.ListModelsRequest(request_id=57)),
                      codec.ListModelsResponse)


def test_reply_over_one_mebibyte_is_5003_and_the_connection_survives(session):
    err = session.expect_error(codec.DebugCommandRequest(request_id=61, command="repeat",
                                                         args=["x", str(1 << 21)]),
                               ErrorCode.FrameTooLarge)
    assert err.request_id == 61 and "1048576" in err.message
    out = session.request(codec.DebugCommandRequest(request_id=62, command="repeat",
                                                    args=["ab", "1000"]))
    assert out.output == "ab" * 1000


def test_debug_commands(session):
    out = session.request(codec.DebugCommandRequest(request_id=1, command="echo",
                                                    args=["a", "b"]))
    assert isinstance(out, codec.DebugCommandResponse) and out.output == "a b"
    err = session.expect_error(codec.DebugCommandRequest(request_id=2, command="nope"),
                               ErrorCode.UnknownDebugCommand)
    assert "echo" in err.message
    err = session.expect_error(codec.DebugCommandRequest(request_id=3, command="repeat",
                                                         args=["x", "many"]),
                               ErrorCode.UnknownDebugCommand)
    assert "usage: repeat TEXT COUNT" in err.message


def test_a_failing_handler_gets_2006_and_the_session_lives_on(session):
    err = session.expect_error(codec.DebugCommandRequest(request_id=4, command="raise"),
                               ErrorCode.InternalError)
    assert "deliberate" in err.message
    assert session.request(codec.DebugCommandRequest(request_id=5, command="echo",
                                                     args=["ok"])).output == "ok"


def test_debug_commands_are_refused_without_dev(tmp_path):
    srv = start_server(tmp_path, dev=False)
    try:
        with Wire(srv.address) as w:
            w.create_session()
            err = w.expect_error(codec.DebugCommandRequest(request_id=9, command="echo"),
                                 ErrorCode.DebugCommandsDisabled)
            assert "--dev" in err.message
    finally:
        srv.shutdown(1)


def test_audio_buffer_never_gets_a_reply(session):
    session.send(codec.AudioBuffer(voice_input_id=3, pcm=list(range(100))))
    session.nothing(0.3)


def test_throttle_is_the_maximum_over_live_sessions(server):
    with Wire(server.address) as a, Wire(server.address) as b:
        a.create_session()
        b.create_session()
        a.send(codec.SetInferenceThrottle(throttle=0.3))
        b.send(codec.SetInferenceThrottle(throttle=0.7))
        assert wait_for(lambda: server.throttle.effective == pytest.approx(0.7))
        b.send(codec.SetInferenceThrottle(throttle=0.1))
        assert wait_for(lambda: server.throttle.effective == pytest.approx(0.3))
        for bad in (math.nan, math.inf, -math.inf):
            a.send(codec.SetInferenceThrottle(throttle=bad))      # ignored, never an error
        a.send(codec.SetInferenceThrottle(throttle=5.0))          # clamped to 1
        assert wait_for(lambda: server.throttle.effective == 1.0)
        a.nothing(0.2)
        a.close()
        # a's contribution leaves with it
        assert wait_for(lambda: server.throttle.effective == pytest.approx(0.1))
    assert wait_for(lambda: server.throttle.effective == 0.0)


def test_request_ids_are_echoed_on_every_reply(session):
    for rid in (1, 2**31, 2**32 - 1):
        reply = session.request(codec.SetSessionLocaleRequest(request_id=rid, locale="de"))
        assert reply.request_id == rid
    # request_id 0 (absent) is allowed and echoed as 0
    session.send(codec.SetSessionLocaleRequest(locale="de"))
    assert session.recv().request_id == 0
