"""HumanMessageGuardrail: pure routing on the player's message (docs/workflow.md).

Exits triggered when any pattern matches anywhere in the message (case-insensitive
search), else not_triggered. Patterns are compiled with the `regex` module at creation (a
bad one is 3003 naming its index; 3007 at ChangeAgentParam) and searched with a time limit
(`workflow.regex_timeout_ms`), so a pathological pattern fails its turn (4001) instead of
stalling every other agent. A List `string_storage` adds its lines as patterns after the
inline ones (docs/knowledge.md).
"""
from __future__ import annotations

import regex

from tryll_fast import codec
from tryll_fast.knowledge import Kind
from tryll_fast.workflow.graph import CompileContext, Node, NodeType

MAX_PATTERNS = 1024


class GuardrailNode(NodeType):
    kind = "HumanMessageGuardrail"
    params_cls = codec.HumanMessageGuardrailParams
    exits = ("triggered", "not_triggered")

    def compile(self, name: str, p, ctx: CompileContext):
        patterns = [(f"inline_strings[{i}]", s) for i, s in enumerate(p.inline_strings)]
        if p.string_storage:
            stored = ctx.strings(p.string_storage, (Kind.List,), f"node {name!r}").values
            patterns += [(f"string_storage {p.string_storage!r} line {i + 1}", s)
                         for i, s in enumerate(stored)]
        if len(patterns) > MAX_PATTERNS:
            raise ctx.fail(f"node {name!r}", f"{len(patterns)} patterns (inline_strings and "
                                             f"string_storage); at most {MAX_PATTERNS}")
        compiled = []
        for where, pattern in patterns:
            try:
                compiled.append((where, regex.compile(pattern, regex.IGNORECASE | regex.V0)))
            except regex.error as exc:
                raise ctx.fail(f"node {name!r}", f"{where} {pattern!r} is not a valid regex: "
                                                 f"{exc}") from None
        return tuple(compiled)

    async def run(self, turn, node: Node) -> str:
        text = turn.user_text
        timeout = turn.regex_timeout_s
        for i, (where, pattern) in enumerate(node.spec):
            try:
                match = pattern.search(text, timeout=timeout)
            except TimeoutError:
                turn.fail(f"node {node.name!r}: {where} took longer than "
                          f"{timeout * 1000:g} ms on the message")
            if match:
                turn.note(node, pattern=i, matched=match.group(0))
                return "triggered"
        turn.note(node, pattern=None)
        return "not_triggered"
