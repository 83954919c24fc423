"""What every language-model node shares: its model, its context size, its sampling.

Sampling = the catalog entry's `default_sampling`, then the node's SamplingOverrides where
they are set (an absent field, None, means unset). Stop strings: the node's
list replaces the model's; empty = the chat template's end-of-turn markers plus the
catalog's `stop`. max_tokens must be > 0 and < the node's context size. ignore_eos (ours)
generates exactly max_tokens: end-of-generation tokens are banned, stop strings dropped.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from tryll_fast import codec
from tryll_fast.engines.errors import InvalidRequest
from tryll_fast.engines.roles import ContextSpec
from tryll_fast.knowledge import paths
from tryll_fast.workflow.graph import CompileContext

DEFAULT_MAX_TOKENS = 256
# SamplingOverrides field -> its highest value (None = unbounded); none may be negative.
_HIGHEST = {
    "temperature": None,
    "top_k": None,
    "top_p": 1.0,
    "min_p": 1.0,
    "repeat_penalty": None,
    "presence_penalty": 2.0,
    "frequency_penalty": 2.0,
    "seed": None,
}
_RANDOM_SEED = 0             # SamplingOverrides.seed 0: a random seed per request
_UNSET_SEED = 4294967295     # the catalog's default_sampling.seed for the same


@dataclass(frozen=True)
class LlmSpec:
    model: str
    n_ctx: int                         # the node's token window
    sampling: dict[str, Any]           # SamplingParams fields except stop
    stop: tuple[str, ...] | None       # None = the template's and catalog's own
    extra: dict[str, Any] = field(default_factory=dict)
    # the context it runs on: adapters and overrides (None = the engine's own)
    lane: ContextSpec | None = None
    adapters: tuple[tuple[str, float], ...] = ()   # (path, scale) as the graph wrote them
    # context.n_gpu_layers: layers offloaded if this node's agent loads the model (-1 = the
    # server's llama.n_gpu_layers); a loaded model keeps its split (one copy of the weights)
    n_gpu_layers: int = -1

    @property
    def max_tokens(self) -> int:
        return self.sampling["max_tokens"]


def compile_llm(name: str, model_name: str, context_size: int, overrides, ctx: CompileContext,
                *, default_context: int = 0,
                default_max_tokens: int = DEFAULT_MAX_TOKENS,
                fixed_max_tokens: tuple[str, int] | None = None,
                node_params=None, speech: bool = False) -> LlmSpec:
    """fixed_max_tokens: (field, value) for a node whose own param sets the output length
    (Summarize's max_summary_tokens) instead of the catalog's and the overrides'; it is
    checked against the context size under that field's name. node_params: the node's
    params, whose `context` and `adaptation` choose the context it runs on (compile_lane).
    speech: the node speaks as the character (Generate, GenerateAndSpeak) and keeps the
    catalog's DRY settings; every other node copies on purpose (a tool's arguments from
    the player's words, a summary's names from the dialog) and runs without DRY."""
    where = f"node {name!r}"
    model = model_name or ctx.default_model
    if not model:
        raise ctx.fail(where, "model_name is empty and the agent has no default_model_name")
    entry, cap = ctx.resolve_model(model, where)
    if context_size < 0:
        raise ctx.fail(where, f"context_size {context_size} is negative (0 = the model's)")
    n_ctx = context_size or default_context or cap
    if n_ctx > cap:
        raise ctx.fail(where, f"context_size {n_ctx} exceeds the {cap} tokens model "
                              f"{model!r} is loaded with (llama.max_n_ctx and its catalog "
                              "context_size)")
    base = dict(entry.default_sampling)
    if not speech:
        base = {k: v for k, v in base.items() if not k.startswith("dry_")}
    sampling = resolve_sampling(where, base, overrides, n_ctx, ctx,
                                default_max_tokens, fixed_max_tokens)
    stop = None
    if sampling.get("ignore_eos"):
        stop = ()             # exactly max_tokens: no stop string ends it either
    elif overrides is not None and overrides.stop:
        stop = tuple(overrides.stop)
        for i, s in enumerate(stop):
            if not s:
                raise ctx.fail(where, f"sampling.stop[{i}] is empty")
    spec = LlmSpec(model=model, n_ctx=n_ctx, sampling=sampling, stop=stop,
                   extra={"catalog_stop": tuple(entry.default_sampling.get("stop", ()))})
    return spec if node_params is None else compile_lane(name, node_params, spec, ctx)


_KV_TYPES = {codec.KvCacheType.F16: "f16", codec.KvCacheType.Q8_0: "q8_0",
             codec.KvCacheType.Q4_0: "q4_0", codec.KvCacheType.BF16: "bf16",
             codec.KvCacheType.F32: "f32"}
_FLASH = {codec.FlashAttention.Auto: -1, codec.FlashAttention.Enabled: 1,
          codec.FlashAttention.Disabled: 0}
# a node asking for more threads than this is a mistake, not a setting
MAX_THREADS = 256


def compile_lane(name: str, params, spec: LlmSpec, ctx: CompileContext) -> LlmSpec:
    """The node's `context` overrides and `adaptation` adapters (docs/workflow.md, "LoRA
    adapters and context overrides") -> spec.lane, None when both are unset. Adapter paths
    follow the storage-root rules (3009 / 3010 / 3011); the rest fail with ctx.code."""
    where = f"node {name!r}"
    over = getattr(params, "context", None)
    adaptation = getattr(params, "adaptation", None)
    loras = list(adaptation.loras) if adaptation is not None and adaptation.loras else []
    adapters, written = [], []
    for i, lora in enumerate(loras):
        field_name = f"adaptation.loras[{i}]"
        if lora.scale is None or not math.isfinite(lora.scale):
            raise ctx.fail(where, f"{field_name}.scale is not a finite number")
        if ctx.storage_root is None:
            raise ctx.fail(where, f"{field_name}: no storage root to find adapters under")
        real = paths.resolve(ctx.storage_root, lora.path or "", suffixes=(".gguf",),
                             what=f"{where}: {field_name}.path")
        adapters.append((str(real), float(lora.scale)))
        written.append((lora.path, float(lora.scale)))
    kw: dict[str, Any] = {}
    if over is not None:
        kv = int(over.kv_cache_type)
        if kv != codec.KvCacheType.Inherit:
            if kv not in _KV_TYPES:
                raise ctx.fail(where, f"context.kv_cache_type {kv} is not a KvCacheType (0..5)")
            kw["kv_type"] = _KV_TYPES[kv]
        flash = int(over.flash_attention)
        if flash != codec.FlashAttention.Inherit:
            if flash not in _FLASH:
                raise ctx.fail(where, f"context.flash_attention {flash} is not a "
                                      "FlashAttention (0..3)")
            kw["flash_attn"] = _FLASH[flash]
        for field_name in ("n_batch", "n_ubatch", "n_threads"):
            value = getattr(over, field_name)
            if value < 0:
                raise ctx.fail(where, f"context.{field_name} {value} is negative "
                                      "(0 = inherit)")
            if value:
                kw[field_name] = value
        if kw.get("n_threads", 0) > MAX_THREADS:
            raise ctx.fail(where, f"context.n_threads {over.n_threads} is above {MAX_THREADS}")
        if kw.get("n_ubatch", 0) and kw.get("n_batch", 0) and kw["n_ubatch"] > kw["n_batch"]:
            raise ctx.fail(where, f"context.n_ubatch {over.n_ubatch} exceeds context.n_batch "
                                  f"{over.n_batch}")
        if over.n_gpu_layers < -1:
            raise ctx.fail(where, f"context.n_gpu_layers {over.n_gpu_layers} is below -1 "
                                  "(-1 = inherit)")
        if over.n_gpu_layers >= 0:
            spec = dataclasses.replace(spec, n_gpu_layers=over.n_gpu_layers)
        if kw.get("kv_type", "f16") in ("q8_0", "q4_0") and kw.get("flash_attn") == 0:
            raise ctx.fail(where, f"context.kv_cache_type {kw['kv_type']} needs flash "
                                  "attention; flash_attention is Disabled")
    try:
        lane = ContextSpec.make(adapters, **kw)
    except InvalidRequest as exc:
        raise ctx.fail(where, str(exc)) from None
    if lane.is_base:
        return spec
    return dataclasses.replace(spec, lane=lane, adapters=tuple(written))


def resolve_sampling(where: str, base: dict[str, Any], overrides, n_ctx: int,
                     ctx: CompileContext, default_max_tokens: int = DEFAULT_MAX_TOKENS,
                     fixed_max_tokens: tuple[str, int] | None = None) -> dict[str, Any]:
    out = {k: v for k, v in base.items() if k != "stop"}
    out.setdefault("max_tokens", default_max_tokens)
    field = "sampling.max_tokens"
    if overrides is not None:
        for name, high in _HIGHEST.items():
            value = getattr(overrides, name)
            if value is None:
                continue          # unset: keep the model's default
            if isinstance(value, float) and not math.isfinite(value):
                raise ctx.fail(where, f"sampling.{name} is not a finite number")
            if value < 0:
                raise ctx.fail(where, f"sampling.{name} = {value:g} is negative")
            if name == "seed" and value == _RANDOM_SEED:
                value = _UNSET_SEED
            if high is not None and value > high:
                raise ctx.fail(where, f"sampling.{name} = {value:g} is above {high:g}")
            if name == "top_p" and value == 0:
                raise ctx.fail(where, "sampling.top_p = 0 keeps no token; 1 disables top-p")
            if name == "repeat_penalty" and value == 0:
                raise ctx.fail(where, "sampling.repeat_penalty must be > 0 (1 = off)")
            out[name] = value
        if overrides.max_tokens is not None:
            if overrides.max_tokens <= 0:
                raise ctx.fail(where, "sampling.max_tokens must be > 0")
            out["max_tokens"] = overrides.max_tokens
        if overrides.ignore_eos:
            out["ignore_eos"] = True
    if fixed_max_tokens is not None:
        field, out["max_tokens"] = fixed_max_tokens
        if out["max_tokens"] <= 0:
            raise ctx.fail(where, f"{field} {out['max_tokens']} must be > 0")
    if out["max_tokens"] >= n_ctx:
        raise ctx.fail(where, f"{field} {out['max_tokens']} must be smaller than "
                              f"the node's context size {n_ctx}")
    seed = out.pop("seed", None)
    out["seed"] = None if seed is None or seed == _UNSET_SEED else int(seed)
    return out
