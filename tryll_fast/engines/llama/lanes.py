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
import math
import os
from dataclasses import dataclass

from tryll_fast.engines.errors import InvalidRequest
from tryll_fast.engines.llama.context import KV_TYPES, LlamaContext
from tryll_fast.engines.llama.scheduler import Scheduler
from tryll_fast.engines.llama.spill import SpillDir

# LaneKey.flash_attn values: llama.cpp's llama_flash_attn_type
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}


@dataclass(frozen=True)
class LaneKey:
    """What a context is made with besides the model. The default key is the engine's own
    context. adapters: (real path, scale) pairs, scale != 0, sorted by path; kv_type None,
    n_batch / n_ubatch / n_threads 0 and flash_attn None mean the engine's settings."""
    adapters: tuple[tuple[str, float], ...] = ()
    kv_type: str | None = None
    n_batch: int = 0
    n_ubatch: int = 0
    flash_attn: int | None = None
    n_threads: int = 0

    @classmethod
    def make(cls, adapters=(), *, kv_type: str | None = None, n_batch: int = 0,
             n_ubatch: int = 0, flash_attn: int | None = None,
             n_threads: int = 0) -> "LaneKey":
        """A validated key; adapters: (path, scale) pairs. A scale of 0 turns an adapter off
        (it is left out of the key), so a set whose scales are all 0 is the base lane."""
        merged: dict[str, float] = {}
        for i, (path, scale) in enumerate(adapters):
            if not isinstance(scale, (int, float)) or not math.isfinite(scale):
                raise InvalidRequest(f"adapters[{i}].scale {scale!r} is not a finite number")
            real = os.path.realpath(os.fspath(path))
            if real in merged:
                raise InvalidRequest(f"adapters[{i}]: {os.path.basename(real)!r} is listed "
                                     "twice")
            merged[real] = float(scale)
        if kv_type is not None and kv_type not in KV_TYPES:
            raise InvalidRequest(f"kv_type={kv_type!r} is not one of {', '.join(KV_TYPES)}")
        for name, value in (("n_batch", n_batch), ("n_ubatch", n_ubatch),
                            ("n_threads", n_threads)):
            if not isinstance(value, int) or value < 0:
                raise InvalidRequest(f"{name}={value!r} must be an int >= 0 (0 = the engine's)")
        if flash_attn is not None and flash_attn not in FLASH_ATTN.values():
            raise InvalidRequest(f"flash_attn={flash_attn!r} is not one of -1 (auto), 0, 1")
        return cls(tuple(sorted((p, s) for p, s in merged.items() if s != 0.0)),
                   kv_type, n_batch, n_ubatch, flash_attn, n_threads)

    @property
    def is_base(self) -> bool:
        return self == _BASE

    def describe(self) -> str:
        """A short human name: 'base', or the adapters and overrides it differs by."""
        parts = [f"{os.path.basename(p)}@{s:g}" for p, s in self.adapters]
        for name in ("kv_type", "n_batch", "n_ubatch", "flash_attn", "n_threads"):
            value = getattr(self, name)
            if value not in (None, 0) or (name == "flash_attn" and value == 0):
                parts.append(f"{name}={value}")
        return " ".join(parts) or "base"


_BASE = LaneKey()


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
        if key.n_ubatch > n_batch:
            raise InvalidRequest(f"n_ubatch={key.n_ubatch} exceeds n_batch={n_batch}")
        try:
            for path, scale in key.adapters:
                self.adapters.append((model.acquire_adapter(path), scale))
            threads = key.n_threads or engine_opts["n_threads"]
            self.ctx = LlamaContext(
                model, n_ctx=engine_opts["n_ctx"], n_seq_max=n_slots + n_prefix_slots,
                n_batch=n_batch, n_ubatch=key.n_ubatch or None,
                n_threads=threads, n_threads_batch=key.n_threads or engine_opts["n_threads_batch"],
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
