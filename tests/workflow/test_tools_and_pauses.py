"""Seeds 003 and 004 over TCP with the real SmolLM2 (greedy, grammar-constrained):
every disposition with and without a call, parallel calls, pauses, resumes, results,
timeouts, call ids unique per interaction."""
import json

import pytest

from tryll_fast import codec
from tryll_fast.errors import ErrorCode

from flows import canned, create, gen, graph, node, texts, turn
from wire import Wire, start_server, MODELS_DIR

pytestmark = pytest.mark.model
Status = codec.TurnStatus
Disp = codec.ToolCallDisposition
Mode = codec.ToolCallMode

TOOLS = [
    codec.ToolDefinition(name="open_door", description="Open a door of the house.",
                         parameters=[codec.ToolParamDefinition(
                             name="door", type="string", description="which door",
                             enum_values=["front", "back"])]),
    codec.ToolDefinition(name="give_item", description="Give the player an item.",
                         parameters=[codec.ToolParamDefinition(name="item",
                                                               type="string")]),
]
CALL = "Please open the front door."          # RequireCall: always a call
NO_CALL = "Hello! How are you today?"         # CallOrAnswer: SmolLM2 answers in prose
SYSTEM = "You are Brenna, a baker. You can act in the world with tools."


def tool(mode=Mode.RequireCall, disposition=Disp.Acknowledge, **kw):
    kw.setdefault("tool_called_exit", "answer")
    kw.setdefault("no_tool_called_exit", "answer")
    kw.setdefault("tools", TOOLS)
    kw.setdefault("sampling", codec.SamplingOverrides(temperature=0, max_tokens=48))
    return codec.ToolCallParams(system_prompt=SYSTEM, mode=mode, disposition=disposition, **kw)


def tool_graph(**kw):
    return graph(node("detect", tool(**kw)), node("answer", gen(max_tokens=8)))


def events(frames, kind):
    return [{p.key: p.value for p in f.kv_pairs} | {"node": f.node_name}
            for f in frames if isinstance(f, codec.NodeEvent) and f.event_type == kind]


def debug(frames):
    return json.loads(frames[-1].debug_info)


def until_paused(w):
    """Frames up to and including the NodeEvent "paused"."""
    out = []
    while True:
        f = w.recv(timeout=120)
        out.append(f)
        if isinstance(f, codec.NodeEvent) and f.event_type == "paused":
            return out
        assert not isinstance(f, codec.TurnComplete), out


def resume(w, aid, resume_node="", results=(), code=None):
    body = codec.ResumeAgentRequest(request_id=w.rid(), agent_id=aid, resume_node=resume_node,
                                    tool_results=[codec.ToolResult(call_id=c, result=r)
                                                  for c, r in results])
    if code is not None:
        return w.expect_error(body, code)
    reply = w.request(body)
    assert isinstance(reply, codec.Ack), reply
    return reply


NOTIFY = {Disp.Notify, Disp.NotifyAndAcknowledge, Disp.Pause, Disp.PauseAndAcknowledge,
          Disp.AwaitResult}
ACK = {Disp.Acknowledge, Disp.NotifyAndAcknowledge, Disp.PauseAndAcknowledge}
PAUSE = {Disp.Pause, Disp.PauseAndAcknowledge, Disp.AwaitResult}
NAMES = {Disp.RouteOnly: "route_only", Disp.Acknowledge: "acknowledge", Disp.Notify: "notify",
         Disp.NotifyAndAcknowledge: "notify_and_acknowledge", Disp.Pause: "pause",
         Disp.PauseAndAcknowledge: "pause_and_acknowledge", Disp.AwaitResult: "await_result"}


@pytest.mark.parametrize("disposition", list(NAMES), ids=list(NAMES.values()))
def test_every_disposition_with_a_call(w, disposition):
    aid = create(w, tool_graph(disposition=disposition), enable_diagnostics=True)
    w.send(codec.SendMessageRequest(request_id=1, agent_id=aid, text=CALL))
    if disposition in PAUSE:
        frames = until_paused(w)
        [paused] = events(frames, "paused")
        assert paused == {"node": "detect", "exit_route": "answer", "cause": "tool_call",
                          "timeout_ms": "0"}
        calls = events(frames, "tool_call")
        results = [(c["call_id"], "the door is open") for c in calls] \
            if disposition == Disp.AwaitResult else ()
        resume(w, aid, results=results)
        frames += w.recv_until(codec.TurnComplete)
    else:
        frames = w.recv_until(codec.TurnComplete)
    assert frames[-1].status == Status.Success
    calls = events(frames, "tool_call")
    if disposition in NOTIFY:
        [call] = calls
        assert call["tool_name"] == "open_door" and call["call_id"] == "c00000000"
        assert json.loads(call["arguments_json"]) == {"door": "front"}
        assert call["disposition"] == NAMES[disposition] and call["node"] == "detect"
        # the event comes before the turn completes (and before a pause)
        assert frames.index(next(f for f in frames if isinstance(f, codec.NodeEvent))) < \
            len(frames) - 1
    else:
        assert calls == []
    nodes = debug(frames)["nodes"]
    assert [n["exit"] for n in nodes] == ["tool_called", "default"]
    d = nodes[0]
    assert d["output"]["tool_calls"][0]["name"] == "open_door"
    assert d["output"]["parse_fallback"] is False
    assert d["parameters"]["disposition"] == NAMES[disposition]
    assert d["parameters"]["mode"] == "require_call" and d["parameters"]["tool_count"] == 2
    assert d["parameters"]["tools"][0].startswith("open_door(door: string)")
    assert d["grammar"]["lazy"] is False
    assert d["engine"]["chat_turn"] == {"has_grammar": True, "grammar_lazy": False}
    assert d["engine"]["class"] == "buffered"           # nobody watches a call stream
    # input.prompt[]: the messages the model was given, the player's line last
    roles = [m["role"] for m in d["input"]["prompt"]]
    assert roles[0] == "system" and roles[-1] == "user", roles
    assert d["input"]["prompt"][-1]["content"] == CALL
    assert d["engine"]["scheduler"]["generated_tokens"] > 0
    # the turn's own summary of the calls it emitted
    assert debug(frames)["tool_calls"] == [{"name": "open_door", "params": {"door": "front"},
                                            "call_id": "c00000000"}]
    assert "interaction" not in debug(frames)          # off by default
    # the answer node sees the exchange iff the disposition keeps it in history
    answer_prompt = nodes[1]["prompt"]
    if disposition in ACK:
        assert '"open_door"' in answer_prompt and "ok" in answer_prompt
    elif disposition == Disp.AwaitResult:
        assert "the door is open" in answer_prompt
    else:
        assert '"open_door"' not in answer_prompt


@pytest.mark.parametrize("disposition", list(NAMES), ids=list(NAMES.values()))
def test_every_disposition_without_a_call(w, disposition):
    aid = create(w, tool_graph(mode=Mode.CallOrAnswer, disposition=disposition),
                 enable_diagnostics=True)
    frames = turn(w, aid, NO_CALL)
    assert frames[-1].status == Status.Success
    assert events(frames, "tool_call") == [] and events(frames, "paused") == []
    nodes = debug(frames)["nodes"]
    assert nodes[0]["exit"] == "no_tool_called"
    out = nodes[0]["output"]
    assert out["parse_fallback"] is True and out["parse_failure"] == "no_call"
    assert "parse_error" in out and out["text"]
    # CallOrAnswer: the prose is the answer, as one Whole chunk from the ToolCall node
    [chunk] = [f for f in frames if isinstance(f, codec.AnswerText) and f.node_name == "detect"]
    assert not chunk.is_delta and chunk.is_final and chunk.text == out["text"]
    assert nodes[1]["prompt"].count(out["text"][:30]) == 1    # and it is in the dialog


def test_detect_only_drops_the_prose(w):
    aid = create(w, graph(node("detect", tool(mode=Mode.DetectOnly, no_tool_called_exit="",
                                                  tool_called_exit=""))),
                 enable_diagnostics=True)
    frames = turn(w, aid, NO_CALL)
    chunks = [f for f in frames if isinstance(f, codec.AnswerText)]
    assert [c.text for c in chunks] == [""]           # only the turn's empty final chunk
    assert debug(frames)["nodes"][0]["grammar"]["lazy"] is True
    assert debug(frames)["nodes"][0]["engine"]["chat_turn"]["grammar_lazy"] is True
    assert debug(frames)["tool_calls"] == []


def test_call_ids_are_unique_across_two_passes_through_one_node(w):
    g = graph(node("detect", tool(disposition=Disp.Pause)), node("answer", canned("done")))
    aid = create(w, g)
    w.send(codec.SendMessageRequest(request_id=1, agent_id=aid, text=CALL))
    first = until_paused(w)
    resume(w, aid, resume_node="detect")              # run the same node again
    second = until_paused(w)
    resume(w, aid)
    rest = w.recv_until(codec.TurnComplete)
    ids = [c["call_id"] for c in events(first + second, "tool_call")]
    assert ids == ["c00000000", "c00000001"]
    assert texts(rest) == "done" and rest[-1].status == Status.Success
    # the next interaction starts its own count
    w.send(codec.SendMessageRequest(request_id=2, agent_id=aid, text=CALL))
    assert events(until_paused(w), "tool_call")[0]["call_id"] == "c00000000"
    w.send(codec.CancelRequest(request_id=3, agent_id=aid))
    assert w.recv_until(codec.TurnComplete)[-1].status == Status.Cancelled


def test_parallel_calls(w):
    aid = create(w, graph(node("detect", tool(parallel_tool_calls=True,
                                              disposition=Disp.Notify,
                                              tool_called_exit="", no_tool_called_exit=""))),
                 enable_diagnostics=True)
    frames = turn(w, aid, "Open the front door, then give me a loaf of bread.")
    calls = events(frames, "tool_call")
    assert calls and len({c["call_id"] for c in calls}) == len(calls)
    assert [c["call_id"] for c in calls] == [f"c{i:08x}" for i in range(len(calls))]
    d = debug(frames)["nodes"][0]
    assert d["parameters"]["parallel_tool_calls"] is True
    assert len(d["output"]["tool_calls"]) == len(calls)


def test_await_result_batches(w):
    aid = create(w, tool_graph(disposition=Disp.AwaitResult), enable_diagnostics=True)
    w.send(codec.SendMessageRequest(request_id=1, agent_id=aid, text=CALL))
    frames = until_paused(w)
    [call] = events(frames, "tool_call")
    cid = call["call_id"]
    for results, words in [
        ((), "pending: send one result per call"),
        ((("c99999999", "x"),), "not a pending call"),
        (((cid, "a"), (cid, "b")), "appears twice"),
        (((cid, "x" * 70000),), "at most 65536"),
    ]:
        err = resume(w, aid, results=results, code=ErrorCode.InvalidToolResults)
        assert words in err.message and "stays paused" in err.message
    # still paused: SendMessage is busy, a retry with a valid batch works
    w.expect_error(codec.SendMessageRequest(request_id=2, agent_id=aid, text="x"),
                   ErrorCode.AgentBusy)
    resume(w, aid, results=[(cid, "It is open now.")])
    rest = w.recv_until(codec.TurnComplete)
    assert rest[-1].status == Status.Success
    assert "It is open now." in debug(rest)["nodes"][1]["prompt"]


def test_results_on_a_pause_without_await_are_refused(w):
    aid = create(w, tool_graph(disposition=Disp.Pause))
    w.send(codec.SendMessageRequest(request_id=1, agent_id=aid, text=CALL))
    cid = events(until_paused(w), "tool_call")[0]["call_id"]
    err = resume(w, aid, results=[(cid, "x")], code=ErrorCode.InvalidToolResults)
    assert "no AwaitResult call" in err.message
    resume(w, aid)
    assert w.recv_until(codec.TurnComplete)[-1].status == Status.Success


def test_resume_rules(w):
    g = graph(node("check", codec.PauseParams(default_exit="yes")),
              node("yes", canned("continued")), node("no", canned("jumped")))
    aid = create(w, g)
    resume(w, aid, code=ErrorCode.AgentNotPaused)                 # idle
    w.send(codec.SendMessageRequest(request_id=1, agent_id=aid, text="go"))
    [paused] = events(until_paused(w), "paused")
    assert paused == {"node": "check", "exit_route": "yes", "cause": "pause_node",
                      "timeout_ms": "0"}
    err = resume(w, aid, resume_node="nowhere", code=ErrorCode.UnknownNode)
    assert "stays paused" in err.message
    # while paused: params and variables may change, the dialog may not grow
    assert isinstance(w.request(codec.ChangeAgentParamRequest(
        request_id=5, agent_id=aid, node_name="no", params=canned("jumped, changed"))),
        codec.Ack)
    assert isinstance(w.request(codec.UpdateAgentVariablesRequest(request_id=6, agent_id=aid)),
                      codec.Ack)
    w.expect_error(codec.SendMessageRequest(request_id=7, agent_id=aid, text="x"),
                   ErrorCode.AgentBusy)
    resume(w, aid, resume_node="no")
    frames = w.recv_until(codec.TurnComplete)
    assert texts(frames) == "jumped, changed" and frames[-1].status == Status.Success
    resume(w, aid, code=ErrorCode.AgentNotPaused)
    # a running (not paused) turn is not resumable either
    slow = create(w, graph(node("answer", gen(max_tokens=64))))
    w.send(codec.SendMessageRequest(request_id=8, agent_id=slow, text="Tell a story."))
    err = resume(w, slow, code=ErrorCode.AgentNotPaused)
    assert "running" in err.message
    w.recv_until(codec.TurnComplete)


def test_plain_resume_continues_via_the_exit(w):
    g = graph(node("check", codec.PauseParams(default_exit="yes")), node("yes", canned("on")))
    aid = create(w, g)
    w.send(codec.SendMessageRequest(request_id=1, agent_id=aid, text="go"))
    until_paused(w)
    resume(w, aid)
    assert texts(w.recv_until(codec.TurnComplete)) == "on"


def test_pause_timeouts(w):
    g = graph(node("wait", codec.PauseParams(pause_timeout_ms=200, default_exit="a",
                                             timeout_exit="late")),
              node("a", canned("resumed")), node("late", canned("too late")))
    aid = create(w, g, enable_diagnostics=True)
    # nobody resumes: the deadline fires and the turn leaves by the timeout exit
    frames = turn(w, aid, "go")
    assert texts(frames) == "too late" and frames[-1].status == Status.Success
    assert [e["timeout_ms"] for e in events(frames, "paused")] == ["200"]
    assert debug(frames)["nodes"][0]["pause"]["outcome"] == "timeout"
    bare = create(w, graph(node("wait", codec.PauseParams(pause_timeout_ms=150,
                                                          default_exit="a")),
                           node("a", canned("resumed"))))
    assert turn(w, bare, "go")[-1].status == Status.PauseTimedOut
    tc = create(w, tool_graph(disposition=Disp.Pause, pause_timeout_ms=150))
    frames = turn(w, tc, CALL)
    assert frames[-1].status == Status.PauseTimedOut and events(frames, "tool_call")
    # a resume in time wins over the deadline
    w.send(codec.SendMessageRequest(request_id=9, agent_id=aid, text="go"))
    until_paused(w)
    resume(w, aid)
    assert texts(w.recv_until(codec.TurnComplete)) == "resumed"


def test_server_default_tool_call_pause_timeout(tmp_path, model_file):
    model_file("SmolLM2-135M-Instruct")
    srv = start_server(tmp_path, models_dir=MODELS_DIR,
                       overrides=["workflow.tool_call_pause_timeout_ms=150"])
    try:
        with Wire(srv.address, timeout=120) as w:
            w.create_session()
            aid = create(w, tool_graph(disposition=Disp.AwaitResult))
            frames = turn(w, aid, CALL)
            [paused] = events(frames, "paused")
            assert paused["timeout_ms"] == "150"
            assert frames[-1].status == Status.PauseTimedOut
            # a Pause node's 0 still means forever
            p = create(w, graph(node("wait", codec.PauseParams())))
            w.send(codec.SendMessageRequest(request_id=1, agent_id=p, text="go"))
            assert events(until_paused(w), "paused")[0]["timeout_ms"] == "0"
            w.nothing(0.4)
            w.send(codec.CancelRequest(request_id=2, agent_id=p))
            assert w.recv_until(codec.TurnComplete)[-1].status == Status.Cancelled
    finally:
        srv.shutdown(2)


def test_diagnostics_settings_add_the_interaction_and_drop_the_engine_block(tmp_path,
                                                                           model_file):
    model_file("SmolLM2-135M-Instruct")
    srv = start_server(tmp_path, models_dir=MODELS_DIR, overrides=[
        "workflow.include_interaction_in_diagnostics=true",
        "workflow.include_engine_diagnostics=false"])
    try:
        with Wire(srv.address, timeout=120) as w:
            w.create_session()
            aid = create(w, tool_graph(disposition=Disp.Acknowledge), enable_diagnostics=True)
            d = debug(turn(w, aid, CALL))
            assert all("engine" not in n for n in d["nodes"])
            parts = d["interaction"]["components"]
            [call] = [c for c in parts if c["type"] == "ToolCallRecord"]
            [result] = [c for c in parts if c["type"] == "ToolResultComponent"]
            assert call["name"] == result["name"] == "open_door"
            assert call["call_id"] == result["call_id"] == d["tool_calls"][0]["call_id"]
            assert result["producer"] == "server_synthetic" and result["text"] == "ok"
            assert parts[0]["type"] == "user" and parts[0]["text"] == CALL
            assert parts.index(call) < parts.index(result)
    finally:
        srv.shutdown(2)


def test_cancel_and_destroy_end_a_paused_turn(server, w):
    g = graph(node("wait", codec.PauseParams(default_exit="a")), node("a", canned("x")))
    aid = create(w, g)
    w.send(codec.SendMessageRequest(request_id=1, agent_id=aid, text="go"))
    until_paused(w)
    w.send(codec.CancelRequest(request_id=2, agent_id=aid,
                               mode=codec.CancelMode.StopAndDiscard))
    frames = w.recv_until(codec.TurnComplete)
    assert frames[-1].status == Status.Cancelled and texts(frames) == ""
    w.send(codec.SendMessageRequest(request_id=3, agent_id=aid, text="go"))
    until_paused(w)
    assert isinstance(w.request(codec.DestroyAgentRequest(request_id=4, agent_id=aid)),
                      codec.Ack)
    # A paused turn ends at once, so its TurnComplete may overtake the Ack.
    done = [f for f in w.other if isinstance(f, codec.TurnComplete)] \
        or w.recv_until(codec.TurnComplete)[-1:]
    assert done[0].status == Status.Cancelled and done[0].request_id == 3
    assert aid not in server.agents


def test_tool_call_params_are_checked(w):
    for params, words in [
        (codec.ToolCallParams(), "at least one tool definition"),
        (tool(mode=5), "mode 5 is not a ToolCallMode"),
        (tool(disposition=9), "disposition 9 is not a ToolCallDisposition"),
        (tool(pause_timeout_ms=-1), "pause_timeout_ms -1 is negative"),
        (tool(sampling=codec.SamplingOverrides(max_tokens=2048)),
         "smaller than the node's context size 2048"),
        (codec.ToolCallParams(tools=[codec.ToolDefinition(name="")]), "tools:"),
        (codec.ToolCallParams(tools=[TOOLS[0], TOOLS[0]]), "tools:"),
        (codec.ToolCallParams(tools=[codec.ToolDefinition(
            name="t", parameters=[codec.ToolParamDefinition(name="x", type="blob")])]),
         "tools:"),
    ]:
        err = w.expect_error(codec.CreateAgentRequest(
            request_id=w.rid(), default_model_name="SmolLM2-135M-Instruct",
            graph=graph(node("detect", params), node("answer", canned("x")))),
            ErrorCode.GraphCompilationFailed)
        assert "node 'detect'" in err.message and words in err.message, err.message
    err = w.expect_error(codec.CreateAgentRequest(
        request_id=w.rid(), default_model_name="SmolLM2-135M-Instruct",
        graph=graph(node("p", codec.PauseParams(timeout_exit="ghost")))),
        ErrorCode.GraphCompilationFailed)
    assert "timeout_exit names 'ghost'" in err.message


def test_change_tool_params_while_paused(w):
    aid = create(w, tool_graph(disposition=Disp.Pause), enable_diagnostics=True)
    w.send(codec.SendMessageRequest(request_id=1, agent_id=aid, text=CALL))
    until_paused(w)
    err = w.expect_error(codec.ChangeAgentParamRequest(
        request_id=2, agent_id=aid, node_name="detect", params=tool(
            disposition=Disp.Pause, tools=TOOLS[:1])), ErrorCode.ParamNotMutable)
    assert "ToolCallParams.tools is structural" in err.message
    ok = w.request(codec.ChangeAgentParamRequest(
        request_id=3, agent_id=aid, node_name="detect",
        params=tool(disposition=Disp.Notify, acknowledge_text="done!")))
    assert isinstance(ok, codec.Ack)
    resume(w, aid)
    w.recv_until(codec.TurnComplete)
    frames = turn(w, aid, CALL)                    # the next run uses the new disposition
    assert events(frames, "paused") == [] and events(frames, "tool_call")[0]["disposition"] == \
        "notify"
