"""Pause: a no-op checkpoint; the turn always pauses right after it (docs/workflow.md).

While paused the game may ChangeAgentParam and UpdateAgentVariables, then
ResumeAgentRequest continues via default_exit (or jumps to a named node). pause_timeout_ms
0 = wait forever; on expiry the turn takes timeout_exit, or, when that is empty, ends with
TurnComplete(PauseTimedOut).
"""
from __future__ import annotations

from tryll_fast import codec
from tryll_fast.workflow.graph import CompileContext, Node, NodeType


class PauseNode(NodeType):
    kind = "Pause"
    params_cls = codec.PauseParams
    exits = ("default", "timeout")

    def compile(self, name: str, p, ctx: CompileContext):
        if p.pause_timeout_ms < 0:
            raise ctx.fail(f"node {name!r}", f"pause_timeout_ms {p.pause_timeout_ms} is "
                                             "negative (0 = wait forever)")
        return None

    async def run(self, turn, node: Node) -> str:
        turn.request_pause("pause_node", node.params.pause_timeout_ms,
                           timeout_exit=node.exits["timeout"] or None)
        return "default"
