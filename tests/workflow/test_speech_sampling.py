"""Which nodes sample with the catalog's DRY settings: the ones that speak as the character
(Generate, GenerateAndSpeak), so the character does not say the player's words back; the
ones that copy on purpose (a tool's arguments, a summary's names, a classifier's label)
run without it. Compiled against the packaged catalog; no model is loaded."""
from tryll_fast import codec
from tryll_fast.models import load_catalog
from tryll_fast.workflow.graph import CompileContext, compile_graph
from tryll_fast.workflow.nodes import TYPES
from tryll_fast.workflow.variables import Variables

from flows import gen, graph, node

QWEN = "Qwen2.5-Coder-0.5B-Instruct"
TOOL = codec.ToolDefinition(name="give_item", description="Give the player an item.")


def compiled(model: str):
    catalog = load_catalog()
    ctx = CompileContext(node_names=frozenset(), default_model=model,
                         variables=Variables(()),
                         resolve_model=lambda name, where: (catalog[name], 4096))
    return compile_graph(graph(
        node("talk", gen(max_tokens=32)),
        node("speak", codec.GenerateAndSpeakParams(system_prompt="You are Brenna.")),
        node("tool", codec.ToolCallParams(system_prompt="You are Brenna.", tools=[TOOL])),
        node("recap", codec.SummarizeParams())), ctx, TYPES)


def test_only_the_speaking_nodes_get_dry():
    nodes = compiled(QWEN).nodes
    entry = load_catalog()[QWEN].default_sampling
    for name in ("talk", "speak"):
        got = nodes[name].spec.sampling
        assert {k: got[k] for k in got if k.startswith("dry_")} == {
            k: v for k, v in entry.items() if k.startswith("dry_")}, name
    for name in ("tool", "recap"):
        assert not [k for k in nodes[name].spec.sampling if k.startswith("dry_")], name
    # everything else the catalog sets reaches every node alike
    assert all(nodes[n].spec.sampling["top_k"] == entry["top_k"]
               for n in ("talk", "speak", "tool", "recap"))


def test_a_model_without_dry_settings_samples_as_before():
    for n in compiled("SmolLM2-135M-Instruct").nodes.values():
        assert not [k for k in n.spec.sampling if k.startswith("dry_")]


def test_max_tokens_comes_from_the_node_else_the_model_else_the_node_type():
    import dataclasses
    catalog = load_catalog()
    plain = dataclasses.replace(catalog[QWEN], default_sampling={
        k: v for k, v in catalog[QWEN].default_sampling.items() if k != "max_tokens"})

    def max_tokens(entry, **tool_sampling):
        ctx = CompileContext(node_names=frozenset(), default_model=QWEN,
                             variables=Variables(()),
                             resolve_model=lambda name, where: (entry, 4096))
        nodes = compile_graph(graph(
            node("talk", codec.GenerateParams(system_prompt="You are Brenna.")),
            node("tool", codec.ToolCallParams(
                system_prompt="You are Brenna.", tools=[TOOL],
                sampling=codec.SamplingOverrides(**tool_sampling) if tool_sampling
                else None))), ctx, TYPES).nodes
        return nodes["talk"].spec.sampling["max_tokens"], nodes["tool"].spec.sampling[
            "max_tokens"]

    assert catalog[QWEN].default_sampling["max_tokens"] == 256
    assert max_tokens(catalog[QWEN]) == (256, 256)         # the model's default
    assert max_tokens(plain) == (256, 758)                 # none: each node type's own
    assert max_tokens(plain, max_tokens=40) == (256, 40)   # the node's own wins
