"""CannedResponse: a scripted line, no model (docs/workflow.md).

Sends one AnswerText (is_delta = false, is_final = true) with the chosen line and appends
it as the reply. The line comes from the inline `lines` (v29), or else from
`string_storage` (a List: a session storage by name or a .txt under the storage root,
docs/knowledge.md); `selection_strategy`:
RoundRobin (in order, wrapping; the default), First (always the first line), Random
(uniform, repeats allowed), ShuffleNoRepeat (a random order without repeats, reshuffled
once used up). The choice state lives per agent, per node. Neither lines nor a storage:
one empty final chunk.
"""
from __future__ import annotations

import random

from tryll_fast import codec
from tryll_fast.knowledge import Kind
from tryll_fast.workflow.graph import CompileContext, Node, NodeType

Strategy = codec.CannedResponseSelectionStrategy


class CannedResponseNode(NodeType):
    kind = "CannedResponse"
    params_cls = codec.CannedResponseParams
    exits = ("default",)

    def compile(self, name: str, p, ctx: CompileContext):
        if p.selection_strategy not in {int(m) for m in Strategy}:
            raise ctx.fail(f"node {name!r}", f"selection_strategy {int(p.selection_strategy)} "
                                             "is not a CannedResponseSelectionStrategy (0..3)")
        lines = tuple(line.text for line in p.lines)
        if not lines and p.string_storage:
            lines = ctx.strings(p.string_storage, (Kind.List,), f"node {name!r}").values
        return lines

    async def run(self, turn, node: Node) -> str:
        lines = node.spec
        text = pick(lines, int(node.params.selection_strategy),
                    turn.agent.node_state(node.name)) if lines else ""
        turn.send_whole(node.name, text)
        turn.add_reply(node, text)
        return "default"


def pick(lines: tuple[str, ...], strategy: int, state: dict) -> str:
    if strategy == Strategy.Random:
        rng = state.setdefault("rng", random.Random())
        return rng.choice(lines)
    if strategy == Strategy.ShuffleNoRepeat:
        bag = state.get("bag")
        if not bag or state.get("lines") != lines:
            rng = state.setdefault("rng", random.Random())
            bag = list(range(len(lines)))
            rng.shuffle(bag)
            state["bag"] = bag
            state["lines"] = lines
        return lines[bag.pop()]
    if strategy == Strategy.First:
        return lines[0]
    i = state.get("next", 0) % len(lines)
    state["next"] = i + 1
    return lines[i]
