"""GetMemoryConsumption: one server-wide snapshot, every session, every loaded model.

Rows (MemoryConsumptionEntry), one per owner and tier:
- Model: a model's weights, tier MappedFile (llama.cpp maps the GGUF file), shared;
- KvCache: per shared prefix (shared = true, counted once however many agents attach it),
  per conversation sequence (its private cells), and the context's free cells, so the KvCache
  rows of a model add up to the KV buffer it allocated;
- EvictedKvState: conversations moved to host memory by eviction;
- Other: frames queued for a connection that is not reading fast enough (per session).
A model on a GPU (docs/configuration.md, "GPU builds and placement") has a Vram Model row for
its offloaded weights, and each KV row is split between Vram and Ram by the share of layers
offloaded. Tiers sum the rows; Ram's total is the machine's physical memory, Vram's the
device's (0 when no model is on one).

Sequence keys are the engine's conversation keys; `describe_key` (set by the workflow
layer) maps one to (session_id, agent_id, node_name, consumer_class).
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

from tryll_fast import codec

Kind = codec.MemoryOwnerKind
Tier = codec.MemoryTier
Consumer = codec.InferenceConsumerClass

KeyInfo = tuple[int, int, str, int]


def _libc_malloc_trim():
    try:
        import ctypes
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):       # not glibc: nothing to give back this way
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_malloc_trim = _libc_malloc_trim()


def give_back_heap() -> bool:
    """Return the C heap's free pages to the system (glibc's malloc_trim). A closed session
    frees its agents' buffers, KV states and, with its last lease, a model's contexts, but
    glibc keeps the freed pages in its per-thread arenas, so the process stayed 150 MB above
    its idle size after a soak; a trim gives them back (docs/configuration.md, "The heap
    after teardown"). True when something was returned."""
    return bool(_malloc_trim(0)) if _malloc_trim is not None else False


def _default_describe(key: Any) -> KeyInfo:
    return 0, 0, "", int(Consumer.NotApplicable)


def physical_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def snapshot(server, request_id: int,
             describe_key: Callable[[Any], KeyInfo] = _default_describe):
    entries: list[codec.MemoryConsumptionEntry] = []
    device_total = 0
    for name, info in server.models.memory().items():
        mem = info.get("engine_memory") or {}
        place = mem.get("placement") or {}
        device_total = max(device_total, int(place.get("device_total_bytes", 0)))
        on_device = int(place.get("device_weights_bytes", 0))
        entries.append(codec.MemoryConsumptionEntry(
            owner_kind=Kind.Model, tier=Tier.MappedFile,
            size_bytes=info["weights_bytes"] - on_device,
            owner_name=name, model_name=name, shared=True))
        if on_device:
            entries.append(codec.MemoryConsumptionEntry(
                owner_kind=Kind.Model, tier=Tier.Vram, size_bytes=on_device,
                owner_name=f"{name} on {place['device']}", model_name=name, shared=True))
        if not mem:
            continue
        share = float(place.get("device_layer_share", 0.0))
        # the engine's own context, then one per lane (LoRA adapters, context overrides)
        for lane_mem in [mem, *mem.get("lanes", ())]:
            entries.extend(_on_device(_context_entries(name, lane_mem, describe_key), share))
        for adapter in mem.get("adapters", ()):
            entries.append(codec.MemoryConsumptionEntry(
                owner_kind=Kind.LoraAdapter, tier=Tier.Ram, size_bytes=adapter["bytes"],
                owner_name=f"LoRA adapter {os.path.basename(adapter['path'])} "
                           f"({adapter['refs']} contexts)", model_name=name, shared=True))
    for session in list(server.connections):
        queued = session.conn.queued_bytes
        if queued:
            entries.append(codec.MemoryConsumptionEntry(
                owner_kind=Kind.Other, tier=Tier.Ram, size_bytes=queued,
                owner_name="outbound frames queued", session_id=session.id))

    used = {tier: 0 for tier in Tier}
    for e in entries:
        used[Tier(e.tier)] += e.size_bytes
    tiers = [
        codec.MemoryTierUsage(tier=Tier.Ram, used_bytes=used[Tier.Ram],
                              total_bytes=physical_memory_bytes()),
        codec.MemoryTierUsage(tier=Tier.Vram, used_bytes=used[Tier.Vram],
                              total_bytes=device_total),
        codec.MemoryTierUsage(tier=Tier.MappedFile, used_bytes=used[Tier.MappedFile]),
    ]
    return codec.GetMemoryConsumptionResponse(
        request_id=request_id, captured_at_ms=int(time.time() * 1000), tiers=tiers,
        entries=entries)


def as_json(snap) -> dict:
    """A GetMemoryConsumptionResponse as the monitor's GET /api/memory returns it: the same
    fields, enum members by name."""
    return {
        "captured_at_ms": snap.captured_at_ms,
        "tiers": [{"tier": Tier(t.tier).name, "used_bytes": t.used_bytes,
                   "total_bytes": t.total_bytes} for t in snap.tiers],
        "entries": [{"owner_kind": Kind(e.owner_kind).name, "tier": Tier(e.tier).name,
                     "size_bytes": e.size_bytes,
                     "consumer_class": codec.InferenceConsumerClass(e.consumer_class).name,
                     "owner_name": e.owner_name, "model_name": e.model_name,
                     "session_id": e.session_id, "agent_id": e.agent_id,
                     "node_name": e.node_name, "shared": e.shared} for e in snap.entries],
    }


def _on_device(entries: list, share: float) -> list:
    """KV rows of a model with `share` of its layers on a GPU: that share of each row's
    cells is in device memory (llama.cpp keeps a layer's KV where the layer is)."""
    if share <= 0:
        return entries
    out = []
    for e in entries:
        if e.owner_kind != Kind.KvCache:
            out.append(e)
            continue
        dev = round(e.size_bytes * share)
        fields = {name: getattr(e, name) for name in e.FIELDS}
        if dev:
            out.append(codec.MemoryConsumptionEntry(**{**fields, "tier": Tier.Vram,
                                                       "size_bytes": dev}))
        if e.size_bytes - dev:
            out.append(codec.MemoryConsumptionEntry(**{**fields,
                                                       "size_bytes": e.size_bytes - dev}))
    return out


def _context_entries(name: str, mem: dict, describe_key) -> list:
    """A context's KV entries: shared prefixes, sequences, evicted states, free cells."""
    entries: list[codec.MemoryConsumptionEntry] = []
    lane = mem.get("lane", {}).get("lane", "base")
    where = "" if lane == "base" else f" [{lane}]"
    ctx = mem["context"]
    bpc = ctx["kv_bytes_per_cell"]
    for prefix in mem["prefixes"]:
        entries.append(codec.MemoryConsumptionEntry(
            owner_kind=Kind.KvCache, tier=Tier.Ram, size_bytes=prefix["kv_bytes"],
            owner_name=f"shared prefix {prefix['id']} ({prefix['tokens']} tokens, "
                       f"{prefix['refs']} attached){where}",
            model_name=name, shared=True))
    for label, seq in mem["sequences"].items():
        session_id, agent_id, node_name, consumer = describe_key(seq.get("key"))
        if seq["kv_bytes"]:
            entries.append(codec.MemoryConsumptionEntry(
                owner_kind=Kind.KvCache, tier=Tier.Ram, size_bytes=seq["kv_bytes"],
                consumer_class=consumer, owner_name=f"sequence {label}{where}", model_name=name,
                session_id=session_id, agent_id=agent_id, node_name=node_name))
        if seq["host_bytes"]:
            entries.append(codec.MemoryConsumptionEntry(
                owner_kind=Kind.EvictedKvState, tier=Tier.Ram, size_bytes=seq["host_bytes"],
                consumer_class=consumer, owner_name=f"sequence {label}{where}", model_name=name,
                session_id=session_id, agent_id=agent_id, node_name=node_name))
    free_cells = max(0, ctx["kv_cells_total"] - ctx["kv_cells_used"])
    entries.append(codec.MemoryConsumptionEntry(
        owner_kind=Kind.KvCache, tier=Tier.Ram, size_bytes=free_cells * bpc,
        owner_name=f"free cells ({free_cells} of {ctx['kv_cells_total']}){where}",
        model_name=name,
        shared=True))
    return entries
