"""The agent KV-cache lifecycle (docs/workflow.md).

Eligible nodes are the language-model nodes (Generate, ToolCall); each keeps one engine
conversation, ("agent", id, node). Their *cacheable prefix* is what every next prompt of
the node starts with whatever the player says: the system part, the tools and the
history window (Projection.cacheable_prefix).

- Prefill decodes each eligible node's cacheable prefix into its conversation, reusing
  what the conversation (or the shared prefix cache) already holds.
- Evict frees each conversation's KV cells: eviction is for giving memory back, and on
  this CPU build the KV cache *is* host memory. By default (`workflow.kv_evict_tier` =
  file) the engine writes each conversation's state (llama_state_seq_get_data) to a file
  first and reads it back on the conversation's next request: milliseconds instead of a
  re-prefill, and no RAM held meanwhile. Tier host keeps that state as a copy in RAM
  instead (no disk; the copy holds the memory); tier free keeps nothing, and the next turn
  re-prefills. The dialog, variables, graph and projections stay; the next SendMessage (or
  Prefill) restores every eligible node before the turn's first node runs: a node whose
  saved state still holds its cacheable prefix decodes nothing there (its turn reads the
  state back and decodes only the new input), any other prefills its prefix again (a
  shared system prefix still cached costs nothing).
- Status reads the aggregate: residency Resident unless evicted (or never allocated, with
  DeferAllocation); prefix_status Current when every eligible conversation holds its
  node's cacheable prefix now (a turn leaves it NotCurrent: its reply was generated, not
  yet re-rendered as history; any dialog edit does too).

All three are blocking (a worker) and run while the agent is in the KV state, so no turn,
edit or other cache operation can overlap them (those get 3004). debug_info, with
diagnostics, has per-node counts and never prompt or token content.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from tryll_fast import codec
from tryll_fast.workflow.projection import ProjectionError

log = logging.getLogger("tryll_fast.workflow")

Residency = codec.KvResidency
PrefixStatus = codec.KvPrefixStatus


@dataclass
class KvReport:
    applicable: bool
    residency: int
    prefix_status: int
    eligible_node_count: int
    nodes: list[dict] = field(default_factory=list)
    contexts_created: int = 0
    tokens_decoded: int = 0
    tokens_reused: int = 0
    contexts_evicted: int = 0

    def debug_info(self, agent) -> str:
        if not agent.diagnostics:
            return ""
        return json.dumps({"nodes": self.nodes}, separators=(",", ":"))


def eligible(agent) -> list:
    return [n for n in agent.graph.nodes.values() if n.type.uses_model]


def _prefix(agent, node) -> tuple[object, list[int], int]:
    """(engine, cacheable prefix tokens, shared prefix length) of one node."""
    engine = agent.leases[node.spec.model].obj
    formatter = agent.runtime.formatter(engine)
    projection = agent.projection(node.name, engine, formatter)
    args = node.type.prefix_args(agent, node, formatter)
    tokens, shared = projection.cacheable_prefix(agent.dialog, n_ctx=node.spec.n_ctx,
                                                 reserve=node.spec.max_tokens, **args)
    return engine, tokens, shared


def prefill(agent, timeout: float = 300.0) -> KvReport:
    """Allocate (lease models) and sync every eligible node to its cacheable prefix."""
    nodes = eligible(agent)
    report = KvReport(applicable=bool(nodes), residency=Residency.Resident,
                      prefix_status=PrefixStatus.Current, eligible_node_count=len(nodes))
    if not nodes:
        report.residency, report.prefix_status = Residency.Evicted, PrefixStatus.NotCurrent
        return report
    agent.lease_all()
    pending = []
    for node in nodes:
        entry = {"node": node.name}
        report.nodes.append(entry)
        try:
            engine, tokens, shared = _prefix(agent, node)
        except ProjectionError as exc:
            # the node's fixed part alone overflows its context: nothing can be cached,
            # and its next turn will fail with this same message
            entry["error"] = str(exc)
            report.prefix_status = PrefixStatus.NotCurrent
            continue
        key = agent.conv_key(node.name)
        held = engine.conversation(key, tokens)
        if held is None or not held["tokens"]:
            report.contexts_created += 1
        entry["prefix_tokens"] = len(tokens)
        if not tokens:
            continue
        if held is not None and held["holds_prefix"]:
            entry.update(decoded=0, reused=len(tokens))
            report.tokens_reused += len(tokens)
            continue
        pending.append((entry, engine.prefill(key, tokens, shared_prefix_len=shared,
                                              priority=agent.priority,
                                              lane=agent.open_lane(node))))
    for entry, handle in pending:
        handle.wait(timeout)
        if handle.error is not None:
            entry["error"] = handle.error
            report.prefix_status = PrefixStatus.NotCurrent
            continue
        st = handle.stats
        reused = st.cached_tokens + st.prefix_tokens
        entry.update(decoded=st.prefilled_tokens, reused=reused)
        report.tokens_decoded += st.prefilled_tokens
        report.tokens_reused += reused
    agent.kv_evicted = False
    if report.prefix_status == PrefixStatus.Current:
        agent.kv_synced()
    return report


def evict(agent) -> KvReport:
    """Free every eligible conversation's KV cells, their state kept in a file or a host
    copy (workflow.kv_evict_tier file / host) or dropped (free); the agent keeps everything
    else."""
    nodes = eligible(agent)
    tier = agent.runtime.limits.kv_evict_tier
    keep = tier != "free"
    report = KvReport(applicable=bool(nodes), residency=Residency.Evicted,
                      prefix_status=PrefixStatus.NotCurrent, eligible_node_count=len(nodes))
    for node in nodes:
        entry = {"node": node.name, "evicted": False}
        report.nodes.append(entry)
        lease = agent.leases.get(node.spec.model)
        if lease is None:
            continue
        engine = lease.obj
        key = agent.conv_key(node.name)
        held = engine.conversation(key)
        if held is None:
            continue
        if held["tokens"] and (held["resident"] or not keep):
            entry.update(evicted=True, tokens=held["tokens"])
            report.contexts_evicted += 1
        if keep:
            engine.evict(key, tier=tier)
        else:
            engine.release(key)
    agent.kv_evicted = bool(nodes)
    return report


def status(agent) -> KvReport:
    nodes = eligible(agent)
    report = KvReport(applicable=bool(nodes), residency=Residency.Evicted,
                      prefix_status=PrefixStatus.NotCurrent, eligible_node_count=len(nodes))
    if not nodes or agent.kv_evicted:
        return report
    report.residency = Residency.Resident
    current = True
    for node in nodes:
        entry = {"node": node.name}
        report.nodes.append(entry)
        if node.spec.model not in agent.leases:
            current = False
            continue
        try:
            engine, tokens, _ = _prefix(agent, node)
        except ProjectionError as exc:
            entry["error"] = str(exc)
            current = False
            continue
        held = agent.leases[node.spec.model].obj.conversation(agent.conv_key(node.name),
                                                              tokens)
        entry.update(prefix_tokens=len(tokens), held_tokens=held["tokens"] if held else 0,
                     current=bool(held and held["holds_prefix"]))
        current = current and entry["current"]
    # a dialog edited from outside (Append / RemoveInteractions) invalidates the prefix
    # until a prefill or a turn syncs it again, whatever cells happen to match
    if current and not agent.kv_prefix_stale:
        report.prefix_status = PrefixStatus.Current
    return report


def restore(agent) -> KvReport | None:
    """Before a turn of an evicted agent: prefill again (the turn then decodes only its
    new input)."""
    if not agent.kv_evicted:
        return None
    return prefill(agent)
