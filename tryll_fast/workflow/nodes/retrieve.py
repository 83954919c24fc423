"""Retrieve and ClassifyIntent: searches of an embedded string storage (docs/knowledge.md).

Retrieve embeds the player's message, searches the storage (vector, lexical BM25, or both
fused by reciprocal rank: score = sum of 1 / (rrf_k + rank)), with the metadata filter
applied during the search, and attaches the best `top_k` records as the turn's knowledge
under its source label: `{{#knowledge}}` / `{{#knowledge_<source>}}` render it, and the
dialog keeps it (PersistedKnowledge). `threshold` is the largest cosine distance a vector
hit may have (0: none); in hybrid mode it applies to the vector list, and a record the
lexical list brings in is kept whatever its distance (that is what lexical search is for:
a rare name the embedding does not place well). Lexical mode reports
`1 - score / best score` as a chunk's distance. found when a record was attached.

ClassifyIntent takes the nearest record (filter applied) and, when it is within
`threshold` and its `metadata_field` (default "intent") holds a non-empty string, makes that
the turn's intent (IntentToInstruction reads it); nothing is rendered into the prompt.

Both run the embedding and the search on the runtime's worker threads, never on the
orchestrator's loop. Both read a session's mutable KB the same way when the storage name
names one (knowledge/mutable.py): the store is looked up by name on every search, so what
the game wrote before the turn is found, and its filter is compiled against the fields its
records carry by then.
"""
from __future__ import annotations

import asyncio
import math
import re

from tryll_fast import codec
from tryll_fast.knowledge.filters import FilterError, compile_filter
from tryll_fast.knowledge.mutable import KbRef
from tryll_fast.workflow.graph import CompileContext, Node, NodeType

Mode = codec.RetrievalMode
Notify = codec.NotifyClient
MAX_TOP_K = 1000
MAX_DIAGNOSTIC_TOPK = 64
HYBRID_DEPTH = 4            # each list is this many times top_k long (at least 50) for fusion
SOURCE_RE = re.compile(r"[A-Za-z0-9_\-]{1,128}")


def _filter(name: str, storage, text: str, ctx: CompileContext):
    """The compiled filter; for a mutable KB, checked against the fields known now and
    compiled again at each search (its records' fields can change)."""
    try:
        if isinstance(storage, KbRef):
            kb = storage.current()
            if kb is not None:
                compile_filter(text, kb.filter_schema(text), ctx.variables.kind)
            return None
        return compile_filter(text, storage.schema, ctx.variables.kind)
    except FilterError as exc:
        raise ctx.fail(f"node {name!r}", f"filter {exc}") from None


def _searchable(storage, flt, text: str, variables):
    """(what to search, its filter): an embedded storage as compiled, or a view of the
    mutable KB as it is now (None when the session no longer has it)."""
    if not isinstance(storage, KbRef):
        return storage, flt
    kb = storage.current()
    if kb is None:
        return None, None
    view = kb.view()
    return view, kb.compile_filter(text, variables.kind, view)


def _threshold(name: str, value: float, ctx: CompileContext) -> float:
    if not (math.isfinite(value) and 0.0 <= value <= 2.0):
        raise ctx.fail(f"node {name!r}", f"threshold {value!r} must be a cosine distance "
                                         "between 0 and 2 (0: no threshold)")
    return value


async def _off_loop(turn, fn):
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(turn.agent.runtime.workers, fn)


class RetrieveNode(NodeType):
    kind = "Retrieve"
    params_cls = codec.RetrieveParams
    exits = ("found", "not_found")

    def compile(self, name: str, p, ctx: CompileContext):
        where = f"node {name!r}"
        storage = ctx.embedded(p.embedded_string_storage, where)
        if not 1 <= p.top_k <= MAX_TOP_K:
            raise ctx.fail(where, f"top_k {p.top_k} must be between 1 and {MAX_TOP_K}")
        _threshold(name, p.threshold, ctx)
        if p.retrieval_mode not in {int(m) for m in Mode}:
            raise ctx.fail(where, f"retrieval_mode {int(p.retrieval_mode)} is not a "
                                  "RetrievalMode (0 Vector, 1 Lexical, 2 Hybrid)")
        if p.rrf_k < 1:
            raise ctx.fail(where, f"rrf_k {p.rrf_k} must be at least 1")
        source = p.source or name
        if not SOURCE_RE.fullmatch(source):
            raise ctx.fail(where, f"source {source!r}: the Mustache section is "
                                  "knowledge_<source>, so letters, digits, _ and - only")
        return storage, _filter(name, storage, p.filter, ctx), source

    async def run(self, turn, node: Node) -> str:
        p = node.params
        ref, flt, source = node.spec
        query = turn.user_text
        if not query.strip():
            turn.note(node, source=source, query="", result_count=0)
            return "not_found"
        variables = turn.agent.variables

        def search():
            storage, compiled = _searchable(ref, flt, p.filter, variables)
            if storage is None:
                return None, [], 0
            return (storage, *_retrieve(storage, compiled, p, query, variables))

        storage, kept, raw_count = await _off_loop(turn, search)
        if storage is None:
            turn.note(node, source=source, query=query, result_count=0,
                      missing_store=ref.name)
            return "not_found"
        chunks = [{"id": storage.ids[row], "text": storage.texts[row],
                   "distance": round(float(d), 4), "rank": i + 1,
                   "metadata": storage.columns.record(row)}
                  for i, (row, d) in enumerate(kept)]
        turn.add_knowledge(node, source, query, chunks)
        turn.note(node, source=source, query=query, top_k=p.top_k,
                  threshold=p.threshold if p.threshold > 0 else "inf",
                  mode=Mode(p.retrieval_mode).name, raw_result_count=raw_count,
                  result_count=len(chunks), filter=p.filter or "",
                  results=[{"id": c["id"], "distance": c["distance"]} for c in chunks])
        return "found" if chunks else "not_found"


def _retrieve(storage, flt, p, query: str, variables) -> tuple[list, int]:
    """[(row, distance)] best first, and how many hits the searches returned."""
    allow = storage.allowed(flt, variables)
    mode = p.retrieval_mode
    if mode == Mode.Lexical:
        lex = storage.lexical_search(query, p.top_k, allow)
        best = lex[0][1] if lex else 1.0
        return [(row, 1.0 - score / best) for row, score in lex], len(lex)
    vec = storage.embed_query(query)
    if mode == Mode.Vector:
        hits = storage.vector_search(vec, p.top_k, allow, 0.0)
        kept = [(h.row, h.distance) for h in hits
                if p.threshold <= 0 or h.distance <= p.threshold]
        return kept, len(hits)
    depth = max(p.top_k * HYBRID_DEPTH, 50)
    hits = storage.vector_search(vec, depth, allow, p.threshold)
    lex = storage.lexical_search(query, depth, allow)
    fused: dict[int, float] = {}
    for rank, h in enumerate(hits, 1):
        fused[h.row] = fused.get(h.row, 0.0) + 1.0 / (p.rrf_k + rank)
    for rank, (row, _) in enumerate(lex, 1):
        fused[row] = fused.get(row, 0.0) + 1.0 / (p.rrf_k + rank)
    order = sorted(fused, key=lambda r: (-fused[r], r))[:p.top_k]
    dist = {h.row: h.distance for h in hits}
    missing = [r for r in order if r not in dist]
    for r, d in zip(missing, storage.distances(vec, missing)):
        dist[r] = float(d)
    return [(r, dist[r]) for r in order], len(hits) + len(lex)


class ClassifyIntentNode(NodeType):
    kind = "ClassifyIntent"
    params_cls = codec.ClassifyIntentParams
    exits = ("found", "not_found")

    def compile(self, name: str, p, ctx: CompileContext):
        where = f"node {name!r}"
        storage = ctx.embedded(p.embedded_string_storage, where)
        field_name = p.metadata_field or "intent"
        field = None if isinstance(storage, KbRef) else storage.schema.by_name.get(field_name)
        if not isinstance(storage, KbRef) and (field is None or field.type != "string"):
            raise ctx.fail(where, f"metadata_field {field_name!r} is not a string field of "
                                  f"storage {storage.name!r} (its fields: "
                                  f"{', '.join(f.name for f in storage.schema.fields) or 'none'})")
        _threshold(name, p.threshold, ctx)
        if p.notify_client not in {int(m) for m in Notify}:
            raise ctx.fail(where, f"notify_client {int(p.notify_client)} is not a "
                                  "NotifyClient (0..2)")
        if not 1 <= p.diagnostic_topk <= MAX_DIAGNOSTIC_TOPK:
            raise ctx.fail(where, f"diagnostic_topk {p.diagnostic_topk} must be between 1 "
                                  f"and {MAX_DIAGNOSTIC_TOPK}")
        return storage, _filter(name, storage, p.filter, ctx), field_name

    async def run(self, turn, node: Node) -> str:
        p = node.params
        ref, flt, field_name = node.spec
        query = turn.user_text
        if not query.strip():
            return self._not_found(turn, node, "empty_message", None, [])
        variables = turn.agent.variables

        def search():
            storage, compiled = _searchable(ref, flt, p.filter, variables)
            if storage is None:
                return None, []
            allow = storage.allowed(compiled, variables)
            return storage, storage.vector_search(storage.embed_query(query),
                                                  p.diagnostic_topk, allow, 0.0)

        storage, hits = await _off_loop(turn, search)
        if storage is None:
            return self._not_found(turn, node, "no_store", None, [])
        col = storage.columns.by_name.get(field_name)
        if col is None or col.field.type != "string":
            return self._not_found(turn, node, "no_label_field", None, [])
        table = [{"id": storage.ids[h.row], "distance": round(h.distance, 4),
                  "intent": col.value(h.row)} for h in hits]
        if not hits:
            return self._not_found(turn, node, "no_records", None, table)
        top = hits[0]
        label = col.value(top.row)
        if p.threshold > 0 and top.distance > p.threshold:
            return self._not_found(turn, node, "above_threshold", top, table)
        if not label:
            return self._not_found(turn, node, "no_label", top, table)
        turn.intent = label
        turn.note(node, query=query, intent=label, distance=round(top.distance, 4),
                  id=storage.ids[top.row], text=storage.texts[top.row], hits=table)
        if p.notify_client in (Notify.OnFound, Notify.Always):
            _notify(turn, node, label, top.distance, storage.ids[top.row], True)
        return "found"

    def _not_found(self, turn, node: Node, reason: str, top, table) -> str:
        turn.intent = None
        turn.note(node, intent=None, not_found_reason=reason,
                  distance=round(top.distance, 4) if top else None, hits=table)
        if node.params.notify_client == Notify.Always:
            _notify(turn, node, "", top.distance if top else 2.0, "", False)
        return "not_found"


def _notify(turn, node: Node, intent: str, distance: float, record_id: str,
            found: bool) -> None:
    turn.send_event(node.name, "intent_classified", {
        "intent": intent, "distance": f"{distance:.4f}",
        "probability": f"{max(0.0, 1.0 - distance):.4f}", "id": record_id,
        "found": "true" if found else "false"})
