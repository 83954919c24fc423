"""LoRA adapters and context overrides on language-model nodes, over TCP with the real
SmolLM2 and adapters written for it under the storage root (engines/llama/lora_gguf.py)."""
import json
import os
import time

import pytest

from tryll_fast import codec
from tryll_fast.engines.llama.lora_gguf import write_lora
from tryll_fast.errors import ErrorCode

from flows import SMOL, create, create_error, gen, graph, node, texts, turn
from wire import MODELS_DIR

pytestmark = pytest.mark.model

G = ErrorCode.GraphCompilationFailed
QUESTION = "What do you sell?"


@pytest.fixture(scope="module")
def loras(server):
    """Adapter files under the server's storage root: two for SmolLM2, one for gpt2."""
    root = server.config.storage_root
    os.makedirs(root / "lora", exist_ok=True)
    model = os.path.join(MODELS_DIR, SMOL, "SmolLM2-135M-Instruct.Q4_1.gguf")
    write_lora(model, root / "lora" / "a.gguf", seed=1, magnitude=0.1)
    write_lora(model, root / "lora" / "b.gguf", seed=2, magnitude=0.1)
    write_lora(model, root / "lora" / "gpt2.gguf", seed=3, architecture="gpt2")
    (root / "lora" / "notes.txt").write_text("not an adapter")
    return root


def adapted(*loras, **kw):
    return gen(adaptation=codec.ModelAdaptation(
        loras=[codec.LoraAdapter(path=p, scale=s) for p, s in loras]), **kw)


def answer(w, params, text=QUESTION, diagnostics=False):
    agent = create(w, graph(node("answer", params)), enable_diagnostics=diagnostics)
    frames = turn(w, agent, text)
    done = frames[-1]
    assert done.status == codec.TurnStatus.Success, done
    return agent, texts(frames), done


def test_an_adapter_changes_the_reply_and_scale_zero_does_not(w, loras):
    _, base, _ = answer(w, gen())
    _, with_a, _ = answer(w, adapted(("lora/a.gguf", 1.0)))
    _, off, _ = answer(w, adapted(("lora/a.gguf", 0.0)))
    assert with_a != base
    assert off == base


def test_agents_with_different_adapters_in_one_batch_answer_as_alone(w, loras):
    """Same system prompt on all three: the shared prefix must not cross adapter sets."""
    alone = {}
    for name, params in (("base", gen()), ("a", adapted(("lora/a.gguf", 1.0))),
                         ("b", adapted(("lora/b.gguf", 1.0)))):
        _, alone[name], _ = answer(w, params)
    agents = {name: create(w, graph(node("answer", params))) for name, params in
              (("base", gen()), ("a", adapted(("lora/a.gguf", 1.0))),
               ("b", adapted(("lora/b.gguf", 1.0))))}
    rids = {}
    for name, agent in agents.items():
        rids[name] = w.rid()
        w.send(codec.SendMessageRequest(request_id=rids[name], agent_id=agent, text=QUESTION))
    got = {name: "" for name in agents}
    pending = set(agents)
    by_agent = {agent: name for name, agent in agents.items()}
    while pending:
        frame = w.recv()
        if isinstance(frame, codec.AnswerText):
            got[by_agent[frame.agent_id]] += frame.text
        elif isinstance(frame, codec.TurnComplete):
            assert frame.status == codec.TurnStatus.Success, frame
            pending.discard(by_agent[frame.agent_id])
    assert got == alone
    assert len(set(alone.values())) == 3


def test_diagnostics_name_the_context_and_the_adapters(w, loras):
    _, _, done = answer(w, adapted(("lora/a.gguf", 0.5), ("lora/b.gguf", 0.0),
                                   context=codec.ContextOverrides(
                                       kv_cache_type=codec.KvCacheType.Q8_0)),
                        diagnostics=True)
    info = json.loads(done.debug_info)["nodes"][0]
    assert info["context"] == "a.gguf@0.5 kv_type=q8_0"
    assert info["adapters"] == [{"path": "lora/a.gguf", "scale": 0.5},
                                {"path": "lora/b.gguf", "scale": 0.0}]
    _, _, done = answer(w, gen(), diagnostics=True)
    info = json.loads(done.debug_info)["nodes"][0]
    assert info["context"] == "base" and info["adapters"] == []


@pytest.mark.parametrize("kv", [codec.KvCacheType.Q8_0, codec.KvCacheType.Q4_0])
def test_quantized_kv_contexts_run_a_turn(w, kv):
    _, text, _ = answer(w, gen(context=codec.ContextOverrides(kv_cache_type=kv)))
    assert text.strip()


def test_overrides_and_gpu_layers(w, server):
    over = codec.ContextOverrides(n_batch=64, n_ubatch=32, n_threads=1, n_gpu_layers=99,
                                  flash_attention=codec.FlashAttention.Disabled)
    _, text, _ = answer(w, gen(context=over))
    assert text.strip()
    # n_gpu_layers is the model's split, asked for when the agent loads it: it makes no
    # context of its own, and the agent carries the largest any of its nodes asks for
    agent_id = create(w, graph(node("a", gen(context=codec.ContextOverrides(n_gpu_layers=7))),
                               node("b", gen(context=codec.ContextOverrides(n_gpu_layers=3)))))
    [agent] = [s.agents[agent_id] for s in server.connections if agent_id in s.agents]
    assert agent.gpu_layers(SMOL) == 7 and agent.gpu_layers("other") is None
    assert agent.graph.nodes["a"].spec.lane is None


def test_nodes_with_the_same_adapters_share_one_context(w, server, loras):
    create(w, graph(node("answer", gen())))       # keeps the model loaded throughout
    a = create(w, graph(node("answer", adapted(("lora/a.gguf", 1.0)))))
    b = create(w, graph(node("answer", adapted(("./lora/a.gguf", 1.0)))))
    engine = server.models.memory()[SMOL]
    lanes = [m["lane"] for m in engine["engine_memory"]["lanes"]]
    assert [l["lane"] for l in lanes].count("a.gguf@1") == 1
    assert [l["users"] for l in lanes if l["lane"] == "a.gguf@1"] == [2]
    reply = w.request(codec.GetMemoryConsumptionRequest(request_id=w.rid()))
    owners = [e.owner_name for e in reply.entries]
    assert any(o.startswith("free cells") and o.endswith("[a.gguf@1]") for o in owners), owners
    [lora] = [e for e in reply.entries if e.owner_kind == codec.MemoryOwnerKind.LoraAdapter]
    assert lora.owner_name == "LoRA adapter a.gguf (1 contexts)" and lora.size_bytes > 0
    for agent in (a, b):
        w.request(codec.DestroyAgentRequest(request_id=w.rid(), agent_id=agent))
    deadline = time.monotonic() + 30          # the agents' release runs on a worker
    while time.monotonic() < deadline:
        lanes = [m["lane"]["lane"]
                 for m in server.models.memory()[SMOL]["engine_memory"]["lanes"]]
        if "a.gguf@1" not in lanes:
            break
        time.sleep(0.05)
    assert "a.gguf@1" not in lanes


@pytest.mark.parametrize("path, code, words", [
    ("/etc/a.gguf", ErrorCode.StorageOutsideRoot, "is absolute"),
    ("../a.gguf", ErrorCode.StorageOutsideRoot, "climbs out"),
    ("lora/none.gguf", ErrorCode.StorageFileNotFound, "is not a file"),
    ("lora/notes.txt", ErrorCode.StorageKindMismatch, "is not a .gguf file"),
    ("", ErrorCode.StorageFileNotFound, "empty path"),
])
def test_adapter_paths_follow_the_storage_root_rules(w, loras, path, code, words):
    err = create_error(w, graph(node("answer", adapted((path, 1.0)))), code)
    assert "node 'answer': adaptation.loras[0].path" in err.message and words in err.message, \
        err.message


def test_a_symlink_out_of_the_root_is_refused(w, loras, tmp_path):
    outside = tmp_path / "elsewhere.gguf"
    outside.write_bytes(b"")
    link = loras / "lora" / "link.gguf"
    if not link.exists():
        link.symlink_to(outside)
    err = create_error(w, graph(node("answer", adapted(("lora/link.gguf", 1.0)))),
                       ErrorCode.StorageOutsideRoot)
    assert "symbolic link" in err.message


def test_an_adapter_for_another_model_fails_creation_naming_node_and_file(w, loras):
    err = create_error(w, graph(node("answer", adapted(("lora/gpt2.gguf", 1.0)))), G)
    assert "node 'answer'" in err.message and "'lora/gpt2.gguf'" in err.message
    assert "architecture 'gpt2', the model is 'llama'" in err.message, err.message


@pytest.mark.parametrize("params, words", [
    (adapted(("lora/a.gguf", float("nan"))), "adaptation.loras[0].scale is not a finite"),
    (adapted(("lora/a.gguf", 1.0), ("lora/./a.gguf", 0.5)), "listed twice"),
    (gen(context=codec.ContextOverrides(kv_cache_type=9)), "not a KvCacheType"),
    (gen(context=codec.ContextOverrides(flash_attention=7)), "not a FlashAttention"),
    (gen(context=codec.ContextOverrides(n_batch=-1)), "context.n_batch -1 is negative"),
    (gen(context=codec.ContextOverrides(n_batch=64, n_ubatch=128)), "exceeds context.n_batch"),
    (gen(context=codec.ContextOverrides(n_threads=1000)), "n_threads 1000 is above"),
    (gen(context=codec.ContextOverrides(n_gpu_layers=-2)), "n_gpu_layers -2 is below -1"),
    (gen(context=codec.ContextOverrides(kv_cache_type=codec.KvCacheType.Q4_0,
                                        flash_attention=codec.FlashAttention.Disabled)),
     "needs flash attention"),
    (gen(context=codec.ContextOverrides(n_batch=4)), "n_batch=4 must be >= n_slots"),
])
def test_bad_overrides_and_scales_are_3003(w, loras, params, words):
    err = create_error(w, graph(node("answer", params)), G)
    assert "node 'answer'" in err.message and words in err.message, err.message


def test_adaptation_is_structural_for_change_agent_param(w, loras):
    """The node reference marks adaptation and context structural: fixed at creation."""
    agent = create(w, graph(node("answer", adapted(("lora/a.gguf", 1.0)))))
    err = w.expect_error(codec.ChangeAgentParamRequest(
        request_id=w.rid(), agent_id=agent, node_name="answer",
        params=adapted(("lora/b.gguf", 1.0))), ErrorCode.ParamNotMutable)
    assert "adaptation" in err.message
    assert texts(turn(w, agent, QUESTION)).strip()       # still runs on its adapter


@pytest.mark.parametrize("params", [
    codec.SummarizeParams(adaptation=codec.ModelAdaptation(
        loras=[codec.LoraAdapter(path="lora/a.gguf")])),
    codec.ToolCallParams(
        tools=[codec.ToolDefinition(name="open_door", description="Open a door.")],
        context=codec.ContextOverrides(kv_cache_type=codec.KvCacheType.Q8_0)),
    codec.ClassifyIntentLLMParams(
        intents_ids="buy,sell", found_exit="", not_found_exit="",
        adaptation=codec.ModelAdaptation(loras=[codec.LoraAdapter(path="lora/b.gguf")])),
])
def test_every_language_model_node_takes_them(w, loras, params):
    create(w, graph(node("n", params)))
