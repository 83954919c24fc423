"""llama.cpp engine: one context per model, continuous batching across agents.

Owns: the low-level llama.cpp model/context wrappers (with Python guards in
front of every call that could abort the process), the scheduler thread that
packs all agents into one llama_decode per step, per-request sampler chains,
the compiled UTF-8/stop-string detokenizer, conversation KV reuse, the shared
prefix cache, eviction to a file (spill.py) or host memory and restore, memory
accounting, pooled embeddings (embeddings.py), the one thread every decode in the process
runs on (compute.py: one OpenMP team), how many threads a decode gets beside a busy machine
and the low-priority C thread it then runs on (cpu_share.py, _lowthread.pyx), and where a model's layers go on a GPU
build (devices.py: placement ram / vram / auto), all behind the backend initialised once per
process (backend.py). It implements the LanguageModel and
Embeddings roles (engines/roles.py); chat templates and tool-call prompting are engine-neutral
(tryll_fast/prompting).

    from tryll_fast.engines.llama import LlamaEngine, Priority
    with LlamaEngine("SmolLM2-135M-Instruct.Q4_1.gguf", n_ctx=2048, n_slots=8) as eng:
        h = eng.submit(prompt, key=("agent-7", "dialog"), max_tokens=64, stop=["\\n\\n"])
        for chunk in h.stream():
            ...
        h.stats.tokens_generated, h.finish_reason
"""
from tryll_fast.engines.llama import _nvidia_libs

_nvidia_libs.preload()      # before the first import of llama_cpp: a CUDA build needs them
# ruff: noqa: E402

from tryll_fast.engines.llama.context import LlamaContext
from tryll_fast.engines.llama.engine import LlamaEngine
from tryll_fast.engines.errors import (
    DecodeError, EngineClosed, EngineError, InvalidRequest, ModelLoadError,
)
from tryll_fast.engines.llama.model import LlamaModel
from tryll_fast.engines.llama.request import RequestHandle, RequestStats
from tryll_fast.engines.llama.sampling import SamplerChain
from tryll_fast.engines.roles import FinishReason, Priority, SamplingParams

__all__ = [
    "DecodeError", "EngineClosed", "EngineError", "FinishReason", "InvalidRequest",
    "LlamaContext", "LlamaEngine", "LlamaModel", "ModelLoadError", "Priority",
    "RequestHandle", "RequestStats", "SamplerChain", "SamplingParams",
]
