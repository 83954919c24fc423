"""The client's agent surface (blocking and asyncio) and `tryll-fast chat`, against the real
server and model."""
import asyncio
import json
import subprocess
import sys
import threading

import pytest

from tryll_fast import codec
from tryll_fast.client import (
    AddToSet, AsyncTryllClient, GraphDescription, ReaderThreadError, Reset, ToolResult,
    TryllClient, TryllError,
)
from tryll_fast.errors import ErrorCode

from flows import SMOL, SYSTEM, canned


def baker(max_tokens=16, **kw):
    return (GraphDescription()
            .add_node("answer", codec.GenerateParams(
                system_prompt=SYSTEM, sampling=codec.SamplingOverrides(
                    temperature=0, max_tokens=max_tokens), **kw))
            .set_default_model_name(SMOL))


@pytest.fixture
def client(server):
    with TryllClient(*server.address, timeout=120) as c:
        c.create_session(locale="en")
        yield c


def test_graph_builder():
    g = (GraphDescription().add_node("a", codec.CannedResponseParams())
         .add_node("b", codec.GenerateParams()).set_start_node("b").set_default_model_name("m"))
    wire = g.to_wire()
    assert [n.name for n in wire.nodes] == ["a", "b"] and wire.start_node == "b"
    assert GraphDescription().add_node("x", codec.InstructionParams()).to_wire().start_node == "x"
    with pytest.raises(TypeError):
        GraphDescription().add_node("x", codec.AnswerText())


@pytest.mark.model
def test_the_tool_call_reference_example_runs_as_written(client):
    """The ToolCall reference's Python example, as written, with our module names and the
    model swapped for the one this machine has."""
    from tryll_fast.client.graph import (
        GraphDescription, ToolCallParams, GenerateParams,
        ToolDefinition, ToolParamDefinition,
    )
    from tryll_fast.client.graph import ToolCallDisposition

    tools = [
        ToolDefinition(
            name="get_weather",
            description="Get the current weather for a city.",
            parameters=[
                ToolParamDefinition(name="city", type="string",
                                    description="City name"),
            ],
        ),
    ]

    graph = (
        GraphDescription()
        .add_node("detect", ToolCallParams(
            tools=tools,
            disposition=ToolCallDisposition.NotifyAndAcknowledge,
            tool_called_exit="",    # empty = END (client handles the tool)
            no_tool_called_exit="answer",
        ))
        .add_node("answer", GenerateParams(
            default_exit="",   # empty = END
        ))
        .set_start_node("detect")
        .set_default_model_name(SMOL)
    )

    agent = client.create_agent(graph)
    wire_tool = graph.to_wire().nodes[0].params.tools[0]
    assert (wire_tool.parameters[0].name, wire_tool.parameters[0].type) == ("city", "string")
    calls = []
    agent.set_on_tool_call(lambda name, args: calls.append((name, json.loads(args))))
    result = agent.send("What is the weather in Paris?").result()
    assert result.ok
    # either the model called the tool (an event, no text) or it answered in text
    assert calls == [] or calls[0][0] == "get_weather"
    assert bool(calls) != bool(result.texts.get("answer"))


@pytest.mark.model
def test_send_streams_then_results(client):
    agent = client.create_agent(baker(), variables={"mood": "calm", "gold": 3, "open": True,
                                                    "tags": {"a"}, "trust": 0.5})
    turn = agent.send("Hello!")
    chunks = list(turn)
    result = turn.result()
    assert result.ok and result.tokens_generated > 0 and chunks
    assert result.text == "".join(c.text for c in chunks)
    assert result.texts == {"answer": result.text}
    assert agent.get_variables() == {"mood": "calm", "gold": 3, "open": True, "tags": {"a"},
                                     "trust": 0.5}
    agent.update_variables({"mood": "happy", "gold": 4})
    agent.update_variables([AddToSet("tags", "b"), Reset("trust")])
    assert agent.get_variables()["tags"] == {"a", "b"}
    with pytest.raises(TryllError) as info:
        agent.update_variables({"gold": "lots"})
    assert info.value.code == ErrorCode.VariableTypeMismatch
    agent.destroy()
    with pytest.raises(TryllError) as info:
        agent.get_variables()
    assert info.value.code == ErrorCode.AgentAlreadyDestroyed


@pytest.mark.model
def test_turns_of_one_agent_are_serialised_client_side(client):
    agent = client.create_agent(baker(max_tokens=12))
    first = agent.send("One")
    second = agent.send("Two")        # waits for the first TurnComplete, never 3004
    assert first.result().ok and second.result().ok


@pytest.mark.model
def test_cancel_from_another_thread_and_failed_turns(client):
    agent = client.create_agent(baker(max_tokens=200))
    turn = agent.send("Tell me a long story about bread and butter.")
    it = iter(turn)
    next(it)
    agent.cancel(codec.CancelMode.StopAndKeep)
    result = turn.result()
    assert result.status == codec.TurnStatus.Cancelled
    small = client.create_agent(baker(max_tokens=16, context_size=48))
    result = small.send("talk " * 100).result()
    assert result.status == codec.TurnStatus.Error
    assert result.errors and result.errors[0].code == ErrorCode.InferenceFailed


@pytest.mark.model
def test_blocking_calls_inside_callbacks(client):
    agent = client.create_agent(baker(max_tokens=8))
    seen = {}

    def on_text(_frame):
        if "err" in seen:
            return
        try:
            agent.get_variables()
        except ReaderThreadError as exc:
            seen["err"] = exc
        seen["fut"] = agent.cancel_async()

    client.on(codec.AnswerText, on_text)
    agent.send("Hi").result()
    assert isinstance(seen["err"], ReaderThreadError)
    assert seen["fut"].result(10) is None


@pytest.mark.model
def test_refused_turn_raises(client):
    agent = client.create_agent(baker())
    agent.destroy()
    turn = agent.send("Hi")
    with pytest.raises(TryllError) as info:
        turn.result()
    assert info.value.code == ErrorCode.AgentAlreadyDestroyed


@pytest.mark.model
def test_async_agents(server):
    async def main():
        async with AsyncTryllClient(*server.address, timeout=120) as c:
            await c.create_session()
            agent = await c.create_agent(baker(), variables={"n": 1})
            turn = await agent.send("Hello!")
            chunks = [chunk async for chunk in turn]
            result = await turn.result()
            assert result.ok and result.text == "".join(ch.text for ch in chunks)
            await agent.update_variables({"n": 2})
            assert await agent.get_variables() == {"n": 2}
            others = [await c.create_agent(baker()), await c.create_agent(baker())]
            turns = [await x.send("Hi") for x in others]        # both run at once
            a, b = await asyncio.gather(*(t.result() for t in turns))
            assert a.ok and b.ok
            await agent.cancel()
            await agent.destroy()
    asyncio.run(main())


DOOR = codec.ToolDefinition(name="open_door", description="Open a door of the house.",
                            parameters=[codec.ToolParamDefinition(
                                name="door", type="string", enum_values=["front"])])


def door_keeper(disposition):
    """A ToolCall node that must call open_door, then a canned line."""
    return (GraphDescription()
            .add_node("detect", codec.ToolCallParams(
                system_prompt=SYSTEM, tools=[DOOR], mode=codec.ToolCallMode.RequireCall,
                disposition=disposition, tool_called_exit="after",
                sampling=codec.SamplingOverrides(temperature=0, max_tokens=40)))
            .add_node("after", canned("There you go."))
            .set_default_model_name(SMOL))


@pytest.mark.model
def test_tool_call_callbacks_resume_from_the_reader_thread(client):
    agent = client.create_agent(door_keeper(codec.ToolCallDisposition.AwaitResult))
    seen = {"calls": [], "plain": [], "paused": []}

    def on_call(name, args, call_id):
        seen["calls"].append((name, json.loads(args), call_id))

    def on_paused(node_name, exit_route):
        seen["paused"].append((node_name, exit_route))
        try:
            agent.resume()
        except ReaderThreadError as exc:
            seen["err"] = exc
        seen["ack"] = agent.resume_async(
            tool_results=[ToolResult(c[2], '{"opened": true}') for c in seen["calls"]])

    agent.set_on_tool_call_with_id(on_call)
    agent.set_on_tool_call(lambda name, args: seen["plain"].append(name))
    agent.set_on_paused(on_paused)
    result = agent.send("Please open the front door.").result()
    assert result.ok and result.texts["after"] == "There you go."
    assert [(n, a) for n, a, _ in seen["calls"]] == [("open_door", {"door": "front"})]
    assert seen["calls"][0][2] == "c00000000" and seen["plain"] == ["open_door"]
    assert seen["paused"] == [("detect", "after")]
    assert isinstance(seen["err"], ReaderThreadError)
    assert seen["ack"].result(10) is None
    assert [e.event_type for e in result.events] == ["tool_call", "paused"]


@pytest.mark.model
def test_resume_errors_and_pause_from_outside(client):
    agent = client.create_agent(door_keeper(codec.ToolCallDisposition.Pause))
    with pytest.raises(TryllError) as info:
        agent.resume()                                    # not paused
    assert info.value.code == ErrorCode.AgentNotPaused
    paused = threading.Event()
    agent.set_on_paused(lambda node_name, exit_route: paused.set())
    turn = agent.send("Please open the front door.")
    assert paused.wait(120)
    with pytest.raises(TryllError) as info:
        agent.resume("ghost")
    assert info.value.code == ErrorCode.UnknownNode
    with pytest.raises(TryllError) as info:
        agent.resume(tool_results=[("c00000000", "done")])   # a Pause awaits no result
    assert info.value.code == ErrorCode.InvalidToolResults
    agent.resume()                                         # still paused: the retry works
    assert turn.result().texts["after"] == "There you go."


@pytest.mark.model
def test_async_resume(server):
    async def main():
        async with AsyncTryllClient(*server.address, timeout=120) as c:
            await c.create_session()
            agent = await c.create_agent(door_keeper(codec.ToolCallDisposition.AwaitResult))
            ids = []
            agent.set_on_tool_call_with_id(lambda name, args, call_id: ids.append(call_id))
            agent.set_on_paused(lambda node_name, exit_route: agent.resume_async(
                tool_results=[{"call_id": i, "result": "ok"} for i in ids]))
            turn = await agent.send("Please open the front door.")
            result = await turn.result()
            assert result.ok and result.texts["after"] == "There you go." and ids
    asyncio.run(main())


@pytest.mark.model
def test_dialog_lifecycle_from_the_client(client):
    agent = client.create_agent(baker(max_tokens=8))
    assert agent.append_interactions([("Hi", "Hello!"), ("", ""),
                                      codec.DialogInteraction(assistant_message="Bread?")]) == 2
    data = agent.export_dialog()
    assert data[4:8] == b"TDLG"
    twin = client.create_agent(baker(max_tokens=8))
    assert twin.import_dialog(data).interaction_count == 2
    saved = twin.save_dialog("client-test")
    assert (saved.save_id, saved.interaction_count) == ("client-test", 2)
    assert agent.remove_interactions_from_end(5) == 2
    restored = agent.load_dialog("client-test")
    assert (restored.interaction_count, restored.warnings) == (2, [])
    status = agent.prefill_kv_cache()
    assert status.applicable and status.resident and status.prefix_current
    assert status.tokens_decoded > 0 and status.eligible_node_count == 1
    evicted = agent.evict_kv_cache()
    assert evicted.contexts_evicted == 1 and not evicted.resident
    assert not agent.get_kv_cache_status().resident
    assert agent.send("And you?").result().ok
    assert agent.get_kv_cache_status().resident
    with pytest.raises(TryllError) as info:
        agent.save_dialog("../up")
    assert info.value.code == ErrorCode.InvalidSaveId
    other = client.create_agent(GraphDescription().add_node("c", canned("hi"))
                                .set_default_model_name(SMOL))
    with pytest.raises(TryllError) as info:
        other.import_dialog(data)
    assert info.value.code == ErrorCode.DialogGraphMismatch
    assert other.import_dialog(data, allow_graph_mismatch=True).warnings
    assert agent.export_dialog_async().result(30)[4:8] == b"TDLG"


@pytest.mark.model
def test_async_dialog_lifecycle(server):
    async def main():
        async with AsyncTryllClient(*server.address, timeout=120) as c:
            await c.create_session()
            agent = await c.create_agent(baker())
            assert await agent.append_interactions([("Hi", "Hello!")]) == 1
            data = await agent.export_dialog()
            assert (await agent.import_dialog(data)).interaction_count == 1
            assert (await agent.prefill_kv_cache()).prefix_current
            assert (await agent.evict_kv_cache_async()).contexts_evicted == 1
            assert await agent.remove_interactions_from_end(1) == 1
    asyncio.run(main())


@pytest.mark.model
def test_chat_command(server):
    host, port = server.address
    proc = subprocess.run(
        [sys.executable, "-m", "tryll_fast.cli", "chat", "--host", host, "--port", str(port),
         "--max-tokens", "12"],
        input="Hello there!\n\nWhat do you bake?\n/quit\n", capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith(f"connected to {host}:{port}")
    replies = [line.split("npc> ", 1)[1] for line in lines if "npc> " in line]
    assert len(replies) == 2 and all(replies)       # the empty line was skipped


def test_chat_against_no_server():
    proc = subprocess.run([sys.executable, "-m", "tryll_fast.cli", "chat", "--port", "1"],
                          input="", capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "1001 ConnectionFailed" in proc.stderr


@pytest.mark.model
def test_intent_classified_reaches_the_callback(client):
    from tryll_fast.client.graph import (
        CannedResponseParams, ClassifyIntentLLMParams, LocalizableText, NotifyClient,
    )
    graph = (GraphDescription()
             .add_node("cls", ClassifyIntentLLMParams(
                 intents_ids="shop", notify_client=NotifyClient.OnFound,
                 found_exit="say", not_found_exit="say"))
             .add_node("say", CannedResponseParams(lines=[LocalizableText(text="ok")]))
             .set_start_node("cls")
             .set_default_model_name(SMOL))
    agent = client.create_agent(graph)
    seen = []
    agent.set_on_intent_classified(lambda *args: seen.append(args))
    assert agent.send("I want to buy a sword.").result().ok
    assert seen == [("cls", "shop", pytest.approx(1.0), True)]


@pytest.mark.model
def test_attributes_classified_reaches_the_callback(client):
    from tryll_fast.client.graph import (
        AttributeDefinition, CannedResponseParams, ClassifyAttributesLLMParams,
        LocalizableText, NotifyClient,
    )
    graph = (GraphDescription()
             .add_node("attrs", ClassifyAttributesLLMParams(
                 attributes=[AttributeDefinition(name="tone", question="How polite?",
                                                 options=["polite", "rude"])],
                 threshold=0.0, notify_client=NotifyClient.Always,
                 found_exit="say", not_found_exit="say"))
             .add_node("say", CannedResponseParams(lines=[LocalizableText(text="ok")]))
             .set_start_node("attrs")
             .set_default_model_name(SMOL))
    agent = client.create_agent(graph)
    seen = []
    agent.set_on_attributes_classified(lambda *args: seen.append(args))
    assert agent.send("Thank you kindly.").result().ok
    [(node_name, values, resolved)] = seen
    assert node_name == "attrs" and resolved and values["tone"] in ("polite", "rude")


@pytest.mark.model
def test_summary_started_reaches_the_callback(client):
    from tryll_fast.client.graph import CannedResponseParams, LocalizableText, SummarizeParams
    graph = (GraphDescription()
             .add_node("remember", SummarizeParams(keep_recent_turns=1, trigger_turns=2,
                                                   max_summary_tokens=16, default_exit="say"))
             .add_node("say", CannedResponseParams(lines=[LocalizableText(text="ok")]))
             .set_default_model_name(SMOL))
    agent = client.create_agent(graph)
    agent.append_interactions([("Hi, I am Kaelen.", "Hello, Kaelen."), ("Bread?", "Yes."),
                               ("Pies?", "Yes.")])
    seen = []
    agent.set_on_summary_started(lambda *args: seen.append(args))
    assert agent.send("Cakes?").result().ok
    assert seen == [("remember", 2, 2, "turns")]


@pytest.mark.model
def test_embedded_storages_through_the_client(client, model_file):
    model_file("all-MiniLM-L6-v2")
    count, dim = client.create_embedded_string_storage(
        "barks", strings=["The inn is warm.", "Wolves at night."],
        embedding_model="all-MiniLM-L6-v2", metadata=[{"mood": "calm"}, {}])
    assert (count, dim) == (2, 384)
    client.destroy_embedded_string_storage("barks")
    with pytest.raises(TryllError) as exc:
        client.destroy_embedded_string_storage("barks")
    assert exc.value.code == ErrorCode.InvalidEmbeddedStringStorageName
