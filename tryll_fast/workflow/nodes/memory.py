"""WriteToMemory: upserts one record built from this turn into a session mutable KB
(docs/knowledge.md, "WriteToMemory"), so a Retrieve over that KB finds it on the next turn.

The record's text is, by `content`: the player's message, the assistant reply this turn
has produced so far, both as "User: ...\\nAssistant: ...", or the node's Mustache
`template` (keys of every template plus `assistant_message`). `record_id` (Mustache) names
the record, so a template such as `player_name` overwrites one fact instead of piling up
versions; empty = a new id. `metadata_json` (Mustache) renders to a JSON object; the node
adds `turn` (the interaction id), `agent` (the agent id) and `speaker` (player, assistant,
exchange or template) unless the template set them or the store's schema declares keys
that leave them out.

The store is looked up by name when the node runs: a session that has no such store yet
writes nothing (the diagnostics say so) and the turn goes on. A metadata template that does
not render to an object, or a record the store rejects, fails the turn with 4001 naming the
node: a designer's error the first test run should show. The write (its embedding) runs
on a worker thread; the client gets a NodeEvent `memory_written` {store, id, status}.
"""
from __future__ import annotations

import json

from tryll_fast import codec
from tryll_fast.knowledge.mutable import Record, check_name
from tryll_fast.errors import TryllError
from tryll_fast.workflow.graph import CompileContext, Node, NodeType
from tryll_fast.workflow.nodes.generate import compile_template_field
from tryll_fast.workflow.nodes.retrieve import _off_loop

Content = codec.MemoryContent
_SPEAKER = {Content.UserMessage: "player", Content.AssistantReply: "assistant",
            Content.Exchange: "exchange", Content.Template: "template"}
_STATUS = {codec.MutableKbWriteStatus.Inserted: "inserted",
           codec.MutableKbWriteStatus.Updated: "updated",
           codec.MutableKbWriteStatus.Unchanged: "unchanged"}


class WriteToMemoryNode(NodeType):
    kind = "WriteToMemory"
    params_cls = codec.WriteToMemoryParams
    exits = ("default",)

    def compile(self, name: str, p, ctx: CompileContext):
        where = f"node {name!r}"
        try:
            check_name(p.mutable_kb, ctx.code)
        except TryllError as exc:
            raise ctx.fail(where, f"mutable_kb: {exc.message}") from None
        if p.content not in _SPEAKER:
            raise ctx.fail(where, f"content {int(p.content)} is not a MemoryContent (0..3)")
        if p.content == Content.Template and not p.template:
            raise ctx.fail(where, "content Template needs a template")
        return (compile_template_field(name, "template", p.template, ctx),
                compile_template_field(name, "record_id", p.record_id, ctx),
                compile_template_field(name, "metadata_json", p.metadata_json, ctx))

    async def run(self, turn, node: Node) -> str:
        p = node.params
        text_t, id_t, meta_t = node.spec
        kb = turn.session.memory.stores.get(p.mutable_kb)
        if kb is None:
            turn.note(node, store=p.mutable_kb, written=False,
                      reason="the session has no mutable KB of that name")
            return "default"
        user = turn.user_text
        reply = turn.interaction.assistant_text()
        ctx = turn.template_context()
        ctx["assistant_message"] = reply
        content = p.content
        if content == Content.UserMessage:
            text = user
        elif content == Content.AssistantReply:
            text = reply
        elif content == Content.Exchange:
            text = f"User: {user}\nAssistant: {reply}" if reply else f"User: {user}"
        else:
            text = text_t.render(ctx)
        if not text.strip():
            turn.note(node, store=kb.name, written=False, reason="the text is empty")
            return "default"
        record_id = id_t.render(ctx).strip() if id_t else ""
        meta: dict = {}
        if meta_t:
            rendered = meta_t.render(ctx)
            try:
                meta = json.loads(rendered) if rendered.strip() else {}
            except ValueError as exc:
                turn.fail(f"node {node.name!r}: metadata_json rendered to {rendered[:200]!r}, "
                          f"not JSON ({exc})")
            if not isinstance(meta, dict):
                turn.fail(f"node {node.name!r}: metadata_json rendered to "
                          f"{rendered[:200]!r}, not a JSON object")
        fields = kb.schema.metadata_fields
        for key, value in (("turn", turn.interaction.id), ("agent", turn.agent.id),
                           ("speaker", _SPEAKER[content])):
            if key not in meta and (not fields or key in fields):
                meta[key] = value
        record = Record(record_id, text, json.dumps(meta, ensure_ascii=False))
        result, = await _off_loop(turn, lambda: kb.write([record],
                                                         where=f"node {node.name!r}"))
        if result.status == codec.MutableKbWriteStatus.Rejected:
            turn.fail(f"node {node.name!r}: mutable KB {kb.name!r} rejected the record: "
                      f"{result.message}")
        status = _STATUS[result.status]
        turn.note(node, store=kb.name, written=True, id=result.id, status=status,
                  text=text[:500])
        turn.send_event(node.name, "memory_written",
                        {"store": kb.name, "id": result.id, "status": status})
        return "default"
