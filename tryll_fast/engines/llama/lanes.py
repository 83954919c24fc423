"""Lanes: one llama_context (and its scheduler) per distinct (LoRA adapter set, context
overrides) over one model, so differently adapted characters share the base weights.

llama.cpp applies LoRA adapters per context, to every sequence in it, and re-plans its
compute graph whenever the set changes; so a set is applied once, to a context of its own,
and never switched. Each lane has its own KV cache, prefix cache and conversations, which
keys cached KV by the adapter set it was computed under for free. The engine's one
scheduler thread steps the lanes with work in turn (docs/architecture.md, "Lanes").
"""
from __future__ import annotations

import hashlib
import os

from tryll_fast.engines.errors import InvalidRequest
from tryll_fast.engines.llama.context import LlamaContext
from tryll_fast.engines.llama.scheduler import Scheduler
from tryll_fast.engines.llama.spill import SpillDir
from tryll_fast.engines.roles import BASE_CONTEXT, ContextSpec

# A lane is keyed by the role-level ContextSpec: the adapters and overrides it was made with.
LaneKey = ContextSpec
BASE = BASE_CONTEXT


class Lane:
    """A context and its scheduler for one LaneKey; `refs` counts the users that opened it
    (the base lane is never closed before the engine)."""

    def __init__(self, engine_opts: dict, model, key: LaneKey, n_slots: int,
                 n_prefix_slots: int, prefix_cell_budget: int | None, spill_root,
                 evict_to: str) -> None:
        self.key = key
        self.model = model
        self.refs = 0
        self.adapters = []
        n_batch = key.n_batch or engine_opts["n_batch"]
        if n_batch < n_slots:
            raise InvalidRequest(f"n_batch={n_batch} must be >= n_slots={n_slots} (every "
                                 "generating sequence needs its token in each step)")
        try:
            for path, scale in key.adapters:
                self.adapters.append((model.acquire_adapter(path), scale))
            self.ctx = LlamaContext(
                model, n_ctx=engine_opts["n_ctx"], n_seq_max=n_slots + n_prefix_slots,
                n_batch=n_batch, n_ubatch=key.n_ubatch or None,
                n_threads=key.n_threads or engine_opts["n_threads"],
                n_threads_batch=key.n_threads or engine_opts["n_threads_batch"],
                kv_unified=True,
                flash_attn_type=engine_opts["flash_attn_type"] if key.flash_attn is None
                else key.flash_attn,
                kv_type=key.kv_type or "f16")
        except BaseException:
            self._release_adapters()
            raise
        try:
            if self.adapters:
                self.ctx.set_adapters(self.adapters)
            budget = self.ctx.n_ctx // 2 if prefix_cell_budget is None else prefix_cell_budget
            label = os.path.splitext(os.path.basename(model.path))[0]
            if not key.is_base:
                label += "-" + hashlib.blake2s(repr(key).encode(), digest_size=4).hexdigest()
            self.sched = Scheduler(self.ctx, n_slots, budget, SpillDir(spill_root, label=label),
                                   evict_to)
        except BaseException:
            self.ctx.close()
            self._release_adapters()
            raise

    def _release_adapters(self) -> None:
        for adapter, _ in self.adapters:
            self.model.release_adapter(adapter)
        self.adapters = []

    def describe(self) -> dict:
        ctx = self.ctx
        return {"lane": self.key.describe(),
                "adapters": [{"path": a.path, "scale": s} for a, s in self.adapters],
                "kv_type": ctx.kv_type, "n_batch": ctx.n_batch, "n_ubatch": ctx.n_ubatch,
                "n_threads": ctx.n_threads, "flash_attn": ctx.flash_attn_type,
                "users": self.refs}

    def close(self) -> None:
        """Cancel what is left, free the KV, the context and the adapter references."""
        self.sched.shutdown()
        self.sched.slots.close()
        self.ctx.close()
        self._release_adapters()
