"""The pipeline transport's rules over real sockets, with agents whose turns need no model
(CannedResponse): connection parameters, the ready command, action triggers, transcripts
and commits, malformed input, Socket.IO, protocol version 1, shutdown, a stalled reader,
browser origins."""
from __future__ import annotations

import json
import socket
import time

import msgpack
import pytest
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect
from websockets.uri import parse_uri

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
        # an action element with text is a turn with exactly that text, whatever its name
        porter.send(Element("action", {"name": "greet", "text": "Where is the smithy?",
                                       "parameters": {"name": "Di"}}))
        porter.turn()
        assert user_texts(server, gateway, porter_id)[-1] == "Where is the smithy?"


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
        audio = [e for e in p.seen if e.type == "error" and "listen" in e.fields["message"]]
        assert "clerk does not listen" in audio[0].fields["message"]
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


STALLING = """
[agents.orator]
[agents.orator.nodes.line]
type = "CannedResponse"
lines = [{ text = "%s" }]
""" % ("Hear ye. " * 9000)


def _silent_websocket(host: str, port: int, query: str) -> tuple[socket.socket, ClientProtocol]:
    """A WebSocket client that reads nothing after the handshake: the `websockets`
    library's sans-I/O protocol over a plain socket with a small receive buffer (its
    threaded client would keep reading into memory in the background)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect((host, port))
    protocol = ClientProtocol(parse_uri(f"ws://{host}:{port}/pipeline?{query}"))
    protocol.send_request(protocol.connect())
    sock.sendall(b"".join(protocol.data_to_send()))
    while not protocol.events_received():
        protocol.receive_data(sock.recv(256))      # the 101 response, a byte at a time
    return sock, protocol


def test_a_client_that_stops_reading_is_closed_after_the_stall_limit(tmp_path):
    """A client that sends turns and never reads: its connection pauses at the high mark
    and is aborted after transport.stall_timeout_ms; its session goes, and another
    connection is served throughout."""
    server = start_server(tmp_path, overrides=[
        "transport.send_queue_high_bytes=65536", "transport.send_queue_low_bytes=16384",
        "transport.stall_timeout_ms=500"])
    try:
        gateway = start_gateway(server, write_config(tmp_path, "stall.toml", STALLING))
        sock, protocol = _silent_websocket(*gateway.address, "agent=orator&commitMode=token")
        assert wait_for(lambda: gateway.connection_count == 1)
        [conn] = list(gateway.connections)
        sid = conn.session.id
        sent = 0
        deadline = time.monotonic() + 30
        while gateway.connection_count and time.monotonic() < deadline:
            protocol.send_text(b"Speak!")               # a turn each (commitMode token)
            try:
                sock.sendall(b"".join(protocol.data_to_send()))
            except OSError:                             # the server dropped us
                break
            sent += 1
            time.sleep(0.005)
        assert wait_for(lambda: gateway.connection_count == 0, timeout=10), sent
        assert conn._close_reason.startswith("stalled"), (conn._close_reason, sent)
        assert conn.paused_at > 0
        assert wait_for(lambda: sid not in server.sessions, timeout=10)
        with Pipe(gateway, "agent=orator&outputFormat=JSON") as other:
            other.ready()
            other.say("and you?")
            assert other.turn()[-1].fields["parameters"]["status"] == "Success"
        sock.close()
    finally:
        server.shutdown(5)


def test_browser_pages_of_other_origins_are_refused(tmp_path):
    """A web site the player visits must not reach their characters: a page's Origin
    must be the pipeline's own or one pipeline.allowed_origins lists; clients with no
    Origin (games, scripts) are served."""
    server = start_server(tmp_path, overrides=[
        "pipeline.allowed_origins=http://game.local:8080"])
    try:
        gateway = start_gateway(server, write_config(tmp_path, "canned.toml", CANNED))
        host, port = gateway.address
        url = f"ws://{host}:{port}/pipeline?agent=porter"
        for origin in ("http://evil.example", f"http://evil.example:{port}",
                       "http://127.0.0.1.evil.example", "null"):
            with pytest.raises(InvalidStatus) as info:
                connect(url, origin=origin, open_timeout=10)
            assert info.value.response.status_code == 403, origin
            assert b"pipeline.allowed_origins" in info.value.response.body
        for origin in (None, f"http://127.0.0.1:{port}", f"http://localhost:{port}",
                       "http://game.local:8080"):
            with connect(url, origin=origin, open_timeout=10) as ws:
                assert ws.recv(timeout=10).startswith("#ready"), origin
        # Socket.IO's endpoint (its websocket transport, as a browser opens it)
        sio_url = f"ws://{host}:{port}/socket.io/?EIO=4&transport=websocket&agent=porter"
        with pytest.raises(InvalidStatus) as info:
            connect(sio_url, origin="http://evil.example", open_timeout=10)
        assert info.value.response.status_code == 400
        with connect(sio_url, origin="http://game.local:8080", open_timeout=10) as ws:
            assert ws.recv(timeout=10).startswith("0{")          # Engine.IO's open packet
    finally:
        server.shutdown(5)


def test_queued_tokens_coalesce_and_every_character_arrives_in_order(light):
    """The dev-mode debug stream sends 5 000 text frames as fast as it can: the pipeline
    sends what is queued behind each other as one token element, and the client gets
    all the text, in order."""
    _, gateway = light
    with Pipe(gateway, "agent=porter&inputFormat=JSON&outputFormat=MSGPACK") as p:
        p.ready()
        p.send(Element("action", {"name": "debug", "parameters": {
            "command": "stream", "args": [5000, "ab "]}}))
        got = p.until(lambda e: is_command(e, "debug"))
    tokens = [e.fields["text"] for e in got if e.type == "token"]
    assert "".join(tokens) == "ab " * 5000
    assert len(tokens) < 5000 and max(map(len, tokens)) <= 16384 + 3
    assert json.loads(got[-1].fields["parameters"]["output"])["frames"] == 5000


def test_the_debug_action_needs_dev_mode(tmp_path):
    server = start_server(tmp_path, dev=False)
    try:
        gateway = start_gateway(server, write_config(tmp_path, "canned.toml", CANNED))
        with Pipe(gateway, "agent=porter&inputFormat=JSON&outputFormat=JSON") as p:
            p.ready()
            p.send(Element("action", {"name": "debug", "parameters": {"command": "stats"}}))
            error = p.until(lambda e: e.type == "error")[-1]
            assert error.fields["type"] == "DebugCommandsDisabled"
            p.send(Element("action", {"name": "debug", "parameters": {"command": 3}}))
            error = p.until(lambda e: e.type == "error")[-1]
            assert "parameters.command" in error.fields["message"]
    finally:
        server.shutdown(5)
