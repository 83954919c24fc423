"""The pipeline transport's rules over real sockets, with agents whose turns need no model
(CannedResponse): connection parameters, the ready command, action triggers, transcripts
and commits, malformed input, Socket.IO, protocol version 1, shutdown."""
from __future__ import annotations

import msgpack
import pytest
from websockets.exceptions import ConnectionClosed

from tryll_fast.gateway import elements as el
from tryll_fast.gateway.elements import Element

from pipeclients import (
    CANNED, Pipe, SocketIOPipe, agent_of, is_command, start_gateway, tokens_text, wait_for,
    write_config,
)
from wire import start_server


def user_texts(server, gateway, session_id) -> list[str]:
    agent = agent_of(server, gateway, session_id)
    return [i.user_text for i in agent.dialog.interactions]


def test_ready_on_connect_then_a_typed_message_and_its_turn(light):
    server, gateway = light
    with Pipe(gateway, "agent=clerk&outputFormat=JSON") as p:
        ready = p.ready()
        assert ready.fields["turnId"] is None and ready.fields["parameters"] == {"agent": "clerk"}
        assert ready.fields["sessionId"] and isinstance(ready.fields["time"], int)
        p.send("What is")
        p.send(" this place?")
        p.send("#commit")
        turn = p.turn()
        assert tokens_text(turn) == "Welcome to the guild hall."
        ids = {e.fields["turnId"] for e in turn}
        assert len(ids) == 1 and None not in ids
        assert turn[-1].fields["parameters"]["status"] == "Success"
        assert user_texts(server, gateway, ready.fields["sessionId"]) == ["What is this place?"]


def test_input_before_ready_is_served_once_the_agent_exists(light):
    server, gateway = light
    with Pipe(gateway, "agent=porter&outputFormat=JSON") as p:
        p.send("#intro")                        # sent before the agent exists
        got = p.turn()
        assert is_command(got[0], "ready")
        assert tokens_text(got) == "Mind the step."


def test_an_agent_that_cannot_be_created_gets_its_error_and_a_close(light):
    server, gateway = light
    with Pipe(gateway, "agent=ghost&outputFormat=JSON") as p:
        error = p.recv(30)
        assert error.type == "error" and error.fields["isRecoverable"] is False
        assert error.fields["source"] == "Agent"
        assert error.fields["type"] == "GraphCompilationFailed"
        assert "not downloaded" in error.fields["message"]
        with pytest.raises(ConnectionClosed) as info:
            p.ws.recv(timeout=10)
        assert info.value.rcvd.code == 1011


def test_no_agent_parameter_gets_the_first_agent(light):
    _, gateway = light
    with Pipe(gateway) as p:                                # TEXT both ways
        assert p.ready() == Element("command", {"name": "ready",
                                                "parameters": {"agent": "clerk"}})


def test_action_triggers_resolve_against_the_agent_then_the_project(light):
    server, gateway = light
    with Pipe(gateway, "agent=clerk&outputFormat=JSON") as clerk, \
            Pipe(gateway, "agent=porter&outputFormat=JSON") as porter:
        clerk_id = clerk.ready().fields["sessionId"]
        porter_id = porter.ready().fields["sessionId"]
        for pipe in (clerk, porter):
            pipe.send("#intro")                 # a trigger is a turn of its own, no commit
            pipe.turn()
        porter.send("#greet:name=Ann%26Bo")
        porter.turn()
        assert user_texts(server, gateway, clerk_id) == ["AGENT INTRO"]
        assert user_texts(server, gateway, porter_id) == ["PROJECT INTRO", "Say hello to Ann&Bo."]
        porter.send("#dance")
        error = porter.recv()
        assert error.type == "error" and error.fields["type"] == "UnknownAction"
        assert "#dance" in error.fields["message"] and "#greet" in error.fields["message"]
        assert error.fields["isRecoverable"] is True
        # an action element with no text resolves like its trigger
        porter.send(Element("action", {"name": "greet", "parameters": {"name": "Cy"}}))
        porter.turn()
        assert user_texts(server, gateway, porter_id)[-1] == "Say hello to Cy."


def test_an_end_action_asks_the_session_to_end(light):
    _, gateway = light
    with Pipe(gateway, "agent=porter") as p:
        p.ready()
        p.send("#end")
        got = p.until(lambda e: is_command(e, "sessionShouldEnd"))
        assert [e.fields.get("name") for e in got if e.type == "command"] == [
            "turnComplete", "sessionShouldEnd"]


@pytest.mark.parametrize("mode, inputs, expected", [
    # auto: a final transcript starts a turn (interim ones are not input); a JSON element
    # over TEXT follows the same rules; the separator is appended only when missing
    ("auto", ["#transcript:text=where is&isInterim=true",
              "#transcript:text=where is the door&isInterim=false",
              '#element:{"type": "transcript", "text": "Thanks!", "isInterim": false}'],
     ["where is the door.", "Thanks!"]),
    # manual (push to talk): final transcripts accumulate until the commit
    ("manual", ["#transcript:text=first part&isInterim=false",
                "#transcript:text=second part&isInterim=false", "#commit"],
     ["first part. second part."]),
    # token: every token is a message; the second arrives mid-turn and waits its turn
    ("token", ["Hello.", "Goodbye."], ["Hello.", "Goodbye."]),
])
def test_when_a_turn_starts(light, mode, inputs, expected):
    server, gateway = light
    with Pipe(gateway, f"agent=porter&commitMode={mode}&outputFormat=JSON") as p:
        sid = p.ready().fields["sessionId"]
        for data in inputs:
            p.send(data)
        for _ in expected:
            p.turn()
        assert user_texts(server, gateway, sid) == expected


def test_a_commit_with_no_input_is_an_error(light):
    _, gateway = light
    with Pipe(gateway, "agent=porter&outputFormat=JSON") as p:
        p.ready()
        p.send("#commit")
        error = p.recv()
        assert error.fields["type"] == "EmptyInput" and error.fields["source"] == "Pipeline"
        assert error.fields["turnId"] is None and error.fields["isRecoverable"] is True


def test_sensory_data_becomes_variables_templates_read(light):
    server, gateway = light
    with Pipe(gateway, "agent=porter&inputFormat=JSON&outputFormat=JSON") as p:
        sid = p.ready().fields["sessionId"]
        p.send(Element("sensory", {"temperature": 21.5, "isWhiteCaneDetected": True,
                                   "persons": [{"distance": 1.5}]}))
        agent = agent_of(server, gateway, sid)
        assert wait_for(lambda: agent.variables.get("sensory_temperature") == "21.5")
        assert agent.variables.get("sensory_white_cane") == "true"
        assert agent.variables.get("sensory_persons") == '[{"distance":1.5}]'
        assert agent.variables.get("sensory_illuminance") == ""


@pytest.mark.parametrize("query, fmt, words", [
    ("outputFormat=XML", "TEXT", "outputFormat='XML' is not a format"),
    ("agent=nobody&outputFormat=JSON", "JSON", "agent='nobody' names no pipeline agent"),
    ("protocolVersion=3&outputFormat=MSGPACK", "MSGPACK", "protocolVersion='3'"),
    ("inputFormat=yaml&outputFormat=json", "JSON", "inputFormat='yaml'"),
    ("commitMode=sometimes&outputFormat=JSON", "JSON", "commitMode='sometimes'"),
])
def test_a_bad_parameter_gets_an_error_element_and_a_close(light, query, fmt, words):
    _, gateway = light
    p = Pipe(gateway, query)
    data = p.ws.recv(timeout=10)
    assert isinstance(data, bytes if fmt == "MSGPACK" else str)
    if fmt == "TEXT":
        assert data.startswith("#error:message=")
    error = el.decode_output(data, fmt)
    assert error.type == "error" and error.fields["type"] == "InvalidConnectionParameter"
    assert words in error.fields["message"] and error.fields["isRecoverable"] is False
    with pytest.raises(ConnectionClosed) as info:
        p.ws.recv(timeout=10)
    assert info.value.rcvd.code == 1008


def test_malformed_elements_get_errors_and_disturb_nothing(light):
    server, gateway = light
    with Pipe(gateway, "agent=clerk&inputFormat=JSON&outputFormat=JSON") as p, \
            Pipe(gateway, "agent=porter&inputFormat=MSGPACK&outputFormat=MSGPACK") as q:
        p.ready()
        q.ready()
        cases = [("{oops", "MalformedElement"), ('{"type": "teleport"}', "UnknownElementType"),
                 ('{"type": "speech", "text": "x"}', "NotAnInputElement"),
                 ('{"type": "token", "text": 3}', "InvalidField"),
                 (b"\x01\x02\x03\x04", "UnsupportedInput"),          # a binary frame: raw audio
                 ('{"type": "url", "url": "https://x.org/cat.png"}', "UnsupportedInput"),
                 ('{"type": "binary", "bytes": "AAAA", "contentType": "image/png"}',
                  "UnsupportedInput")]
        for data, kind in cases:
            p.send(data)
            error = p.recv()
            assert error.type == "error" and error.fields["type"] == kind, error
            assert error.fields["isRecoverable"] is True and error.fields["message"]
        audio = [e for e in p.seen if e.type == "error" and "audio" in e.fields["message"]]
        assert "voice-input" in audio[0].fields["message"]
        q.send(b"\xc1garbage")                  # not MessagePack
        assert q.recv().fields["type"] == "MalformedElement"
        q.send("a text frame")
        assert "binary frames" in q.recv().fields["message"]
        # both connections still work
        p.send(Element("token", {"text": "Hello"}))
        p.send(Element("commit", {}))
        assert tokens_text(p.turn()) == "Welcome to the guild hall."
        q.send(msgpack.packb({"token": {"text": "Hi"}}))
        q.send(msgpack.packb({"commit": None}))
        assert tokens_text(q.turn()) == "Mind the step."


def test_protocol_version_1_names_the_interaction_by_its_legacy_name(light):
    _, gateway = light
    for version, name in ((1, "MultimodalInteractionElement"), (2, "multimodal-interaction")):
        with Pipe(gateway, f"agent=clerk&outputFormat=JSON&protocolVersion={version}") as p:
            p.ready()
            p.send("#action:rating")
            raw = p.ws.recv(timeout=30)
            assert raw.startswith('{"type":"%s"' % name)
            shown = el.decode_output(raw, "JSON")
            assert shown.type == "multimodal-interaction"
            assert shown.fields["interaction"] == {"type": "rating", "max": 5}
            assert shown.fields["turnId"] is not None
            p.turn()
        with Pipe(gateway, f"agent=clerk&outputFormat=MSGPACK&protocolVersion={version}") as p:
            p.ready()
            p.send("#action:rating")
            assert list(msgpack.unpackb(p.ws.recv(timeout=30))) == [name]


@pytest.mark.parametrize("fmt_in, fmt_out", [("TEXT", "TEXT"), ("JSON", "MSGPACK"),
                                             ("MSGPACK", "JSON")])
def test_socketio_connections(light, fmt_in, fmt_out):
    server, gateway = light
    with SocketIOPipe(gateway, f"agent=clerk&inputFormat={fmt_in}&outputFormat={fmt_out}"
                      ) as s:
        ready = s.until(lambda e: is_command(e, "ready"))[-1]
        assert ready.fields.get("parameters") == {"agent": "clerk"}
        s.say("Hello")
        turn = s.until(lambda e: is_command(e, "turnComplete"))
        assert tokens_text(turn) == "Welcome to the guild hall."
        # the wrong event for the input format: an error element, the connection stays
        s.send("text" if fmt_in == "MSGPACK" else b"\x80",
               event="text" if fmt_in == "MSGPACK" else "msgpack")
        assert s.recv().fields["type"] == "MalformedElement"
        s.send("#intro" if fmt_in == "TEXT" else Element("token", {"text": "#intro"}))
        assert tokens_text(s.until(lambda e: is_command(e, "turnComplete"))) == \
            "Welcome to the guild hall."


def test_socketio_bad_parameter_gets_an_error_then_a_disconnect(light):
    _, gateway = light
    s = SocketIOPipe(gateway, "agent=nobody&outputFormat=JSON")
    try:
        error = s.recv(10)
        assert error.fields["type"] == "InvalidConnectionParameter"
        assert wait_for(lambda: not s.connected, 10)
    finally:
        s.close()


def test_a_closed_connection_frees_its_session_and_agent(light):
    server, gateway = light
    before = server.teardowns
    p = Pipe(gateway, "agent=porter&outputFormat=JSON")
    sid = int(p.ready().fields["sessionId"])
    agent = agent_of(server, gateway, sid)
    assert agent is not None and server.agents[agent.id] is agent
    p.close()
    assert wait_for(lambda: server.teardowns > before and sid not in server.sessions)
    assert wait_for(lambda: agent.id not in server.agents)
    assert wait_for(lambda: all(c.session.id != sid for c in list(gateway.connections)))


def test_shutdown_sends_exit_and_closes(tmp_path):
    server = start_server(tmp_path)
    gateway = start_gateway(server, write_config(tmp_path, "canned.toml", CANNED))
    p = Pipe(gateway, "agent=porter&outputFormat=JSON")
    p.ready()
    server.shutdown(5)
    exit_ = p.recv(5)
    assert is_command(exit_, "exit") and exit_.fields["turnId"] is None
    with pytest.raises(ConnectionClosed) as info:
        p.ws.recv(timeout=5)
    assert info.value.rcvd.code == 1001
    assert gateway.connection_count == 0
