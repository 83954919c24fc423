"""Dialog snapshots: an agent's dialog <-> a TDLG buffer (schema/dialog.fbs), for
ExportDialog / ImportDialog and SaveDialog / LoadDialog.

Full fidelity: every component kind, role, producer, slot, timestamp, tool-call state and
call id survives export -> import, so an imported dialog projects into exactly the prompts
the exported one would have (the conversation continues identically). Variables are not in
the snapshot (the schema has no place for them): the game reads and restores them with
GetAgentVariables / UpdateAgentVariables.

Import checks the whole buffer before anything changes (failures are atomic): the TDLG
identifier and FlatBuffers structure, format_version (1), increasing unique interaction ids,
a body on every component, known enum values, tool results answering a call of their
interaction, call ids unique per interaction. Any problem is 3019 InvalidDialogSnapshot,
naming where. A snapshot from a graph with another fingerprint is 3020 DialogGraphMismatch
under Strict; AllowGraphMismatch imports it and says what does not fit in warnings.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tryll_fast import codec
from tryll_fast.errors import ErrorCode, InvalidDialogSnapshot, TryllError
from tryll_fast.workflow.dialog import USER_SLOT, Component, Interaction, now_ms
from tryll_fast.workflow.graph import Graph, fingerprint

FORMAT_VERSION = 1
# A snapshot must fit in one frame (ExportDialogResponse carries it); files keep the cap
# so a saved dialog can always be exported again.
MAX_SNAPSHOT_BYTES = 1 << 20
# A node's template message kept for its later prompts travels as an instruction named
# template:before / :after / :instead with the role it had (dialog.py).
TEMPLATE_PREFIX = "template:"
TEMPLATE_WHERE = ("before", "after", "instead")

Role = codec.PersistedHistoryRole
Producer = codec.PersistedProducer
Outcome = codec.PersistedInteractionOutcome
CallState = codec.PersistedToolCallState
Body = codec.PersistedComponentBody

_ROLE = {"hidden": Role.Hidden, "system": Role.System, "user": Role.User,
         "assistant": Role.Assistant, "tool": Role.Tool}
_PRODUCER = {"player": Producer.Player, "node": Producer.Node,
             "client_injected": Producer.ClientInjected,
             "client_tool_result": Producer.ClientToolResult,
             "server_synthetic": Producer.ServerSynthetic}
_OUTCOME = {"completed": Outcome.Completed, "cancelled_kept": Outcome.CancelledKept,
            "failed": Outcome.Failed}
_STATE = {"detected": CallState.Detected, "notified": CallState.Notified,
          "resolved": CallState.Resolved}
_ROLE_NAME = {int(v): k for k, v in _ROLE.items()}
_PRODUCER_NAME = {int(v): k for k, v in _PRODUCER.items()}
_OUTCOME_NAME = {int(v): k for k, v in _OUTCOME.items()}
_STATE_NAME = {int(v): k for k, v in _STATE.items()}
_SLOT_KINDS = {int(m) for m in codec.PersistedSlotKind}


def _invalid(where: str, problem: str) -> InvalidDialogSnapshot:
    return InvalidDialogSnapshot(f"snapshot {where}: {problem}")


# ---- export ----

def _body(c: Component):
    x = c.extra
    if c.kind == "user":
        return codec.PersistedUserMessage(text=c.text)
    if c.kind == "assistant":
        return codec.PersistedAssistantMessage(text=c.text,
                                               reasoning_content=x.get("reasoning", ""),
                                               truncated=bool(x.get("truncated", False)))
    if c.kind == "tool_call":
        return codec.PersistedToolCall(call_id=x["call_id"], tool_name=c.name,
                                       arguments_json=c.text,
                                       disposition=x.get("disposition", ""),
                                       model_call_id=x.get("model_call_id", ""),
                                       state=_STATE[x.get("state", "detected")])
    if c.kind == "tool_result":
        return codec.PersistedToolResult(call_id=x["call_id"], tool_name=c.name, result=c.text)
    if c.kind == "instruction":
        return codec.PersistedInstruction(name=c.name, text=c.text)
    if c.kind == "template":        # an instruction the history shows (dialog.py)
        return codec.PersistedInstruction(name=f"{TEMPLATE_PREFIX}{x['where']}", text=c.text)
    if c.kind == "knowledge":
        return codec.PersistedKnowledge(
            source=c.name, query=c.text,
            entries=[codec.PersistedKnowledgeEntry(**e) for e in x.get("entries", ())])
    if c.kind == "summary":
        return codec.PersistedSummary(text=c.text,
                                      summarized_interaction_count=x.get("count", 0))
    raise ValueError(f"component kind {c.kind!r} has no snapshot form")


def _component(c: Component):
    return codec.PersistedComponent(
        node_name=c.node_name, slot_name=c.slot,
        slot_kind=codec.PersistedSlotKind.User if c.slot == USER_SLOT
        else codec.PersistedSlotKind.Output,
        history_role=_ROLE[c.role], producer=_PRODUCER[c.producer],
        created_at_ms=max(0, c.created_ms), body=_body(c))


def encode(interactions: list[Interaction], graph: Graph, locale: str) -> bytes:
    """The TDLG bytes of these (finished) interactions; 3021 when over 1 MiB."""
    snap = codec.PersistedDialogSnapshot(
        format_version=FORMAT_VERSION, graph_fingerprint=fingerprint(graph),
        node_names=list(graph.nodes), locale=locale or "", exported_at_ms=now_ms(),
        interactions=[codec.PersistedInteraction(
            interaction_id=i.id, started_at_ms=max(0, i.started_ms),
            completed_at_ms=max(0, i.completed_ms), outcome=_OUTCOME[i.outcome],
            components=[_component(c) for c in i.components])
            for i in interactions if i.outcome in _OUTCOME])
    try:
        data = codec.encode_root(snap)
    except codec.FrameTooLarge:
        data = None
    if data is None or len(data) > MAX_SNAPSHOT_BYTES:
        raise TryllError(ErrorCode.DialogSnapshotTooLarge,
                         f"the dialog's snapshot ({len(interactions)} interactions) would "
                         f"be over {MAX_SNAPSHOT_BYTES} bytes, the most one frame or file "
                         "holds: remove old interactions first (RemoveInteractionsFromEnd "
                         "removes from the end; a stateless agent keeps none)")
    return data


# ---- import ----

@dataclass
class Parsed:
    interactions: list[Interaction]
    fingerprint: str
    node_names: list[str]
    locale: str
    warnings: list[str] = field(default_factory=list)


def _enum(value, names: dict, where: str, what: str):
    name = names.get(int(value))
    if name is None:
        raise _invalid(where, f"{what} {int(value)} is not a {what} of format_version "
                              f"{FORMAT_VERSION}")
    return name


def _read_component(pc, where: str, calls: dict, results: set) -> Component:
    t = int(pc.body_type)
    b = pc.body
    if t == 0 or b is None:
        raise _invalid(where, "has no body")
    role = _enum(pc.history_role, _ROLE_NAME, where, "history_role")
    producer = _enum(pc.producer, _PRODUCER_NAME, where, "producer")
    if int(pc.slot_kind) not in _SLOT_KINDS:
        raise _invalid(where, f"slot_kind {int(pc.slot_kind)} is unknown")
    slot = pc.slot_name or (USER_SLOT if int(pc.slot_kind) == codec.PersistedSlotKind.User
                            else pc.node_name)
    common = dict(slot=slot, node_name=pc.node_name, role=role, producer=producer,
                  created_ms=int(pc.created_at_ms))
    if t == Body.PersistedUserMessage:
        return Component(kind="user", text=b.text, **common)
    if t == Body.PersistedAssistantMessage:
        extra = {}
        if b.reasoning_content:
            extra["reasoning"] = b.reasoning_content
        if b.truncated:
            extra["truncated"] = True
        return Component(kind="assistant", text=b.text, extra=extra, **common)
    if t == Body.PersistedToolCall:
        if not b.call_id:
            raise _invalid(where, "tool call without a call_id")
        if b.call_id in calls:
            raise _invalid(where, f"call_id {b.call_id!r} appears twice in the interaction")
        state = _enum(b.state, _STATE_NAME, where, "state")
        c = Component(kind="tool_call", text=b.arguments_json, name=b.tool_name,
                      extra={"call_id": b.call_id, "disposition": b.disposition,
                             "state": state, "projected": role != "hidden",
                             "model_call_id": b.model_call_id}, **common)
        calls[b.call_id] = c
        return c
    if t == Body.PersistedToolResult:
        if b.call_id not in calls:
            raise _invalid(where, f"tool result for call_id {b.call_id!r}, which no earlier "
                                  "tool call of the interaction has")
        if b.call_id in results:
            raise _invalid(where, f"second result for call_id {b.call_id!r}")
        results.add(b.call_id)
        return Component(kind="tool_result", text=b.result, name=b.tool_name,
                         extra={"call_id": b.call_id, "projected": role != "hidden"}, **common)
    if t == Body.PersistedInstruction:
        where = b.name[len(TEMPLATE_PREFIX):] if b.name.startswith(TEMPLATE_PREFIX) else ""
        if where in TEMPLATE_WHERE and role in ("user", "system") and pc.node_name:
            return Component(kind="template", text=b.text, extra={"where": where}, **common)
        return Component(kind="instruction", text=b.text, name=b.name, **common)
    if t == Body.PersistedKnowledge:
        entries = [{"id": e.id, "text": e.text, "metadata_json": e.metadata_json,
                    "distance": float(e.distance)} for e in b.entries]
        return Component(kind="knowledge", text=b.query, name=b.source,
                         extra={"entries": entries}, **common)
    if t == Body.PersistedSummary:
        return Component(kind="summary", text=b.text,
                         extra={"count": int(b.summarized_interaction_count)}, **common)
    raise _invalid(where, f"body type {t} is not a component of format_version "
                          f"{FORMAT_VERSION}")


def parse(data) -> Parsed:
    """Verify and read a TDLG buffer completely (3019 naming the first problem)."""
    if len(data) > MAX_SNAPSHOT_BYTES:
        raise TryllError(ErrorCode.DialogSnapshotTooLarge,
                         f"the snapshot has {len(data)} bytes; at most {MAX_SNAPSHOT_BYTES}")
    if not len(data):
        raise _invalid("bytes", "empty")
    try:
        snap = codec.decode_root(codec.PersistedDialogSnapshot, bytes(data))
        return _read(snap)
    except InvalidDialogSnapshot:
        raise
    except (codec.CodecError, UnicodeDecodeError) as exc:
        raise _invalid("bytes", f"not a valid TDLG buffer ({exc})") from None


def _read(snap) -> Parsed:
    version = int(snap.format_version)
    if version == 0:
        raise _invalid("format_version", "0 (absent): a writer always stores 1")
    if version != FORMAT_VERSION:
        raise _invalid("format_version", f"{version} is newer than this server reads "
                                         f"({FORMAT_VERSION})")
    out: list[Interaction] = []
    last_id = 0
    for i, pi in enumerate(snap.interactions):
        where = f"interactions[{i}]"
        iid = int(pi.interaction_id)
        if iid <= last_id:
            raise _invalid(where, f"interaction_id {iid} is not greater than the previous "
                                  f"one ({last_id}): ids start at 1 and increase")
        last_id = iid
        outcome = _enum(pi.outcome, _OUTCOME_NAME, where, "outcome")
        inter = Interaction(id=iid, started_ms=int(pi.started_at_ms),
                            completed_ms=int(pi.completed_at_ms), outcome=outcome)
        calls: dict[str, Component] = {}
        results: set[str] = set()
        for j, pc in enumerate(pi.components):
            inter.add(_read_component(pc, f"{where}.components[{j}]", calls, results))
        inter.calls_made = len(calls)
        out.append(inter)
    return Parsed(interactions=out, fingerprint=snap.graph_fingerprint,
                  node_names=list(snap.node_names), locale=snap.locale)


def check_graph(parsed: Parsed, graph: Graph, compatibility: int, locale: str) -> list[str]:
    """3020 under Strict when the graphs differ; else the warnings."""
    if compatibility not in (codec.DialogCompatibility.Strict,
                             codec.DialogCompatibility.AllowGraphMismatch):
        raise TryllError(ErrorCode.InvalidParamValue,
                         f"compatibility {int(compatibility)} is not a DialogCompatibility "
                         "(0 Strict, 1 AllowGraphMismatch)")
    ours = fingerprint(graph)
    warnings: list[str] = []
    if parsed.fingerprint != ours:
        if compatibility == codec.DialogCompatibility.Strict:
            raise TryllError(
                ErrorCode.DialogGraphMismatch,
                f"the snapshot's graph_fingerprint {parsed.fingerprint[:16] or '(none)'}… "
                f"differs from this agent's {ours[:16]}…: it was exported from another graph "
                "(import with compatibility AllowGraphMismatch to take it anyway)")
        warnings.append(f"graph_fingerprint {parsed.fingerprint[:16] or '(none)'}… differs "
                        f"from this agent's {ours[:16]}…: imported anyway "
                        "(AllowGraphMismatch)")
        gone = sorted({c.node_name for i in parsed.interactions for c in i.components
                       if c.node_name and c.node_name not in graph.nodes})
        if gone:
            n = sum(1 for i in parsed.interactions for c in i.components
                    if c.node_name in gone)
            warnings.append(f"{n} components come from nodes this graph does not have "
                            f"({', '.join(gone)}): kept, and their replies still project")
    if parsed.locale and locale and parsed.locale != locale:
        warnings.append(f"the snapshot was exported under locale {parsed.locale!r}; the "
                        f"session's is {locale!r}")
    return warnings
