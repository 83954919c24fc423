"""The dialog: interactions (one per turn or scripted exchange), each a list of components.

A component is one thing a turn produced or received: the player's message (slot
`user_message`), a node's reply (slot = the node's name, role assistant), an instruction
(hidden: it shapes this turn's prompts only), a tool call a ToolCall node detected and the
result that answers it (linked by call_id; `extra` holds call_id, disposition, state and
whether the pair is projected into later prompts). The kinds and roles map one to one onto
the TDLG snapshot (schema/dialog.fbs, workflow/snapshot.py), so export keeps full
fidelity. A "knowledge" component is what a Retrieve attached (templates only, hidden); a
"summary" component is a running summary a Summarize node wrote (or a snapshot brought):
`extra["count"]` says how many of the dialog's first interactions it stands for, and the
latest one replaces those interactions in every prompt (`running_summary()`).

A "template" component is the message a language-model node's template made of this turn
(placed before or after the player's words, or in their place; `extra["where"]`), so later
prompts of the same node show the turn as it saw it: each new prompt then extends the
previous one, and the KV cache keeps the earlier exchange instead of decoding it again
(docs/workflow.md, "Templates in the history").

Projection (projection.py) turns interactions into chat messages (`messages()`): the user
message, then assistant replies joined into one assistant message (templates that insist
on alternating roles stay happy), tool calls attached to the assistant message and their
results as tool messages. `version` changes on every edit that is not an append at the
end, so a projection knows when its token window must be rebuilt.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

USER_SLOT = "user_message"


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass
class Component:
    kind: str                 # "user" | "assistant" | "instruction" | "tool_call" | "tool_result"
    #                           | "knowledge" | "summary" | "template"
    slot: str                 # USER_SLOT, or the producing node's name
    text: str                 # a call's arguments_json, a result's text
    node_name: str = ""
    name: str = ""            # instruction name, tool name
    role: str = "assistant"   # "user" | "assistant" | "hidden" | "tool"
    producer: str = "node"    # "player" | "node" | "client_injected" | "client_tool_result"
    #                           | "server_synthetic"
    created_ms: int = field(default_factory=now_ms)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Interaction:
    id: int
    started_ms: int = field(default_factory=now_ms)
    completed_ms: int = 0
    outcome: str = "running"  # running | completed | cancelled_kept | failed
    components: list[Component] = field(default_factory=list)
    calls_made: int = 0       # tool-call ids handed out so far (c%08x, unique per interaction)

    @property
    def user_text(self) -> str | None:
        for c in self.components:
            if c.kind == "user":
                return c.text
        return None

    def assistant_text(self) -> str:
        return "\n".join(c.text for c in self.components if c.kind == "assistant" and c.text)

    def slot(self, name: str) -> str | None:
        """The text in a slot: the player's message, or the last output of a node."""
        for c in reversed(self.components):
            if c.slot == name and c.kind in ("user", "assistant"):
                return c.text
        return None

    def add(self, component: Component) -> Component:
        self.components.append(component)
        return component

    def template_of(self, node_name: str) -> Component | None:
        for c in reversed(self.components):
            if c.kind == "template" and c.node_name == node_name:
                return c
        return None

    def messages(self, *, user_content: str | None = None, skip_slot: str | None = None,
                 template_of: str | None = None) -> list[dict[str, Any]]:
        """This interaction as chat messages. user_content replaces the player's message
        (the current turn's rendered user turn); skip_slot leaves out that node's reply
        (it is the user turn already); template_of puts that node's template message
        where it stood. Messages the player did not write carry "_verbatim": True."""
        msgs: list[dict[str, Any]] = []
        cur: dict[str, Any] | None = None
        t = self.template_of(template_of) if template_of else None
        where = t.extra.get("where") if t is not None else None
        for c in self.components:
            if c.kind == "user":
                text = c.text if user_content is None else user_content
                if where == "before":
                    msgs.append({"role": t.role, "content": t.text, "_verbatim": True})
                if where == "instead":
                    msgs.append({"role": "user", "content": t.text, "_verbatim": True})
                else:
                    msgs.append({"role": "user", "content": text})
                if where == "after":
                    msgs.append({"role": t.role, "content": t.text, "_verbatim": True})
                cur = None
            elif c.kind == "assistant":
                if not c.text or c.slot == skip_slot:
                    continue
                if cur is None:
                    cur = {"role": "assistant", "content": c.text}
                    msgs.append(cur)
                else:
                    cur["content"] = f"{cur['content']}\n{c.text}" if cur["content"] else c.text
            elif c.kind == "tool_call" and c.extra.get("projected"):
                if cur is None:
                    cur = {"role": "assistant", "content": ""}
                    msgs.append(cur)
                cur.setdefault("tool_calls", []).append(
                    {"id": c.extra["call_id"], "name": c.name, "arguments": c.text})
            elif c.kind == "tool_result" and c.extra.get("projected"):
                msgs.append({"role": "tool", "content": c.text, "name": c.name,
                             "tool_call_id": c.extra["call_id"]})
                cur = None
        return msgs


class Dialog:
    def __init__(self) -> None:
        self.interactions: list[Interaction] = []
        self.next_id = 1          # interaction ids only grow, even across edits
        self.version = 0          # bumped by edits other than appending at the end

    def __len__(self) -> int:
        return len(self.interactions)

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def begin(self, user_text: str) -> Interaction:
        """A new interaction holding the player's message."""
        inter = Interaction(id=self._new_id())
        inter.add(Component(kind="user", slot=USER_SLOT, text=user_text, role="user",
                            producer="player"))
        self.interactions.append(inter)
        return inter

    def append_scripted(self, user: str, assistant: str) -> Interaction:
        inter = Interaction(id=self._new_id(), outcome="completed")
        if user:
            inter.add(Component(kind="user", slot=USER_SLOT, text=user, role="user",
                                producer="client_injected"))
        if assistant:
            inter.add(Component(kind="assistant", slot="assistant_message", text=assistant,
                                producer="client_injected"))
        inter.completed_ms = inter.started_ms
        self.interactions.append(inter)
        return inter

    def remove(self, inter: Interaction) -> None:
        """Take an interaction out (StopAndDiscard, a failed turn)."""
        if inter in self.interactions:
            self.interactions.remove(inter)
            self.version += 1

    def remove_from_end(self, count: int) -> int:
        n = min(count, len(self.interactions))
        if n:
            del self.interactions[-n:]
            self.version += 1
        return n

    def clear(self) -> None:
        if self.interactions:
            self.interactions.clear()
            self.version += 1

    def running_summary(self) -> tuple[Component | None, int]:
        """The latest summary component (the last one in dialog order) and how many of the
        dialog's first interactions it stands for: its count, never more than the
        interactions before the one holding it. (None, 0) when there is none."""
        for at in range(len(self.interactions) - 1, -1, -1):
            for c in reversed(self.interactions[at].components):
                if c.kind == "summary":
                    return c, max(0, min(int(c.extra.get("count", 0)), at))
        return None, 0

    def replace(self, interactions: list[Interaction]) -> None:
        """ImportDialog / LoadDialog: the whole dialog at once (validated already)."""
        self.interactions = list(interactions)
        self.next_id = max([self.next_id] + [i.id + 1 for i in interactions])
        self.version += 1
