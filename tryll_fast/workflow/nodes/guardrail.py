"""HumanMessageGuardrail: pure routing on the player's message (docs/workflow.md).

Exits triggered when any pattern matches anywhere in the message (case-insensitive
search), else not_triggered. Patterns are compiled with the `regex` module at creation (a
bad one is 3003 naming its index; 3007 at ChangeAgentParam) and searched with a time limit
(`workflow.regex_timeout_ms`), so a pathological pattern fails its turn (4001) instead of
stalling every other agent. Storage patterns arrive with the knowledge feature.
"""
from __future__ import annotations

import regex

from tryll_fast import codec
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.workflow.graph import CompileContext, Node, NodeType

MAX_PATTERNS = 1024


class GuardrailNode(NodeType):
    kind = "HumanMessageGuardrail"
    params_cls = codec.HumanMessageGuardrailParams
    exits = ("triggered", "not_triggered")

    def compile(self, name: str, p, ctx: CompileContext):
        if p.string_storage:
            raise TryllError(ErrorCode.FeatureNotAvailable,
                             f"node {name!r}: string_storage {p.string_storage!r} needs "
                             "string storages (the knowledge feature), not in this server "
                             "build yet; use inline_strings")
        if len(p.inline_strings) > MAX_PATTERNS:
            raise ctx.fail(f"node {name!r}", f"{len(p.inline_strings)} inline_strings "
                                             f"(patterns); at most {MAX_PATTERNS}")
        compiled = []
        for i, pattern in enumerate(p.inline_strings):
            try:
                compiled.append(regex.compile(pattern, regex.IGNORECASE | regex.V0))
            except regex.error as exc:
                raise ctx.fail(f"node {name!r}", f"inline_strings[{i}] {pattern!r} is not a "
                                                 f"valid regex: {exc}") from None
        return tuple(compiled)

    async def run(self, turn, node: Node) -> str:
        text = turn.user_text
        timeout = turn.regex_timeout_s
        for i, pattern in enumerate(node.spec):
            try:
                match = pattern.search(text, timeout=timeout)
            except TimeoutError:
                turn.fail(f"node {node.name!r}: inline_strings[{i}] took longer than "
                          f"{timeout * 1000:g} ms on the message")
            if match:
                turn.note(node, pattern=i, matched=match.group(0))
                return "triggered"
        turn.note(node, pattern=None)
        return "not_triggered"
