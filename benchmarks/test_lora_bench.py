"""LoRA adapters: characters with different adapters still batched, on the engine
benchmark's model and workload (Gemma 3 270M, 2 threads, flash attention, greedy; the town
lore as each set's shared prefix, a private question per agent) with two seeded adapters
written for it (engines/llama/lora_gguf.py).

Gate (python -m benchmarks.gates):
  lora_mixed_batch_vs_serial   8 agents over 2 adapter sets (4 each, one lane per set),
                               64 tokens each (ignore_eos): the 8 turns one after another /
                               the 8 submitted together, same engine and lanes, median of
                               paired rounds                                        >= 2
Reported with it: the same 8 turns on one set (no adapters) batched, the ceiling two sets
approach (llama.cpp applies adapters per context, so two sets take two decodes a step).
Reported, not gated: resident memory of one model with 2 adapters (one lane each) next to
2 copies of the model (two loads without mmap, as two merged fine-tunes would be), each in
a fresh process after one short generation per context; and the KV bytes per token of the
same dialog under f16, q8_0 and q4_0 caches, as llama.cpp sizes the sequence's state.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import pytest

from benchmarks.engine_workload import FLASH_ATTN, MAX_TOKENS, N_THREADS, model_path, prompts
from tryll_fast.engines.llama import LlamaEngine
from tryll_fast.engines.llama.lanes import LaneKey
from tryll_fast.engines.llama.lora_gguf import write_lora
from tryll_fast.models import ensure_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(ROOT, "build", "models")
SMOL = "SmolLM2-135M-Instruct"
N_AGENTS = 8
PAIRS = 4


def _adapters(model, tmp):
    return [write_lora(model, os.path.join(tmp, f"{name}.gguf"), seed=seed)
            for seed, name in enumerate(("a", "b"), 1)]


@pytest.fixture(scope="module")
def files():
    model = str(ensure_model(SMOL, MODELS_DIR))
    with tempfile.TemporaryDirectory() as tmp:
        yield model, _adapters(model, tmp)


def test_lora_mixed_batch(benchmark):
    model = model_path()
    with tempfile.TemporaryDirectory() as tmp, \
            LlamaEngine(model, n_ctx=4096, n_slots=N_AGENTS, n_prefix_slots=2, n_batch=512,
                        n_threads=N_THREADS, n_threads_batch=N_THREADS,
                        flash_attn_type=FLASH_ATTN) as eng:
        lanes = [eng.open_lane(LaneKey.make([(path, 1.0)])) for path in _adapters(model, tmp)]
        base, texts = prompts(N_AGENTS)
        shared = len(eng.tokenize(base))
        tokens = [0]

        def submit(i, one_set=False):
            return eng.submit(texts[i], key=("agent", i), lane=None if one_set else lanes[i % 2],
                              shared_prefix_len=shared, max_tokens=MAX_TOKENS, ignore_eos=True)

        def reset():
            for i in range(N_AGENTS):
                eng.release(("agent", i))
            eng.clear_prefixes()

        def batched(one_set=False):
            reset()
            t0 = time.perf_counter()
            with eng.hold():
                handles = [submit(i, one_set) for i in range(N_AGENTS)]
            for h in handles:
                h.result(600)
            tokens[0] = sum(h.stats.tokens_generated for h in handles)
            return time.perf_counter() - t0

        def serial():
            reset()
            t0 = time.perf_counter()
            for i in range(N_AGENTS):
                submit(i).result(600)
            return time.perf_counter() - t0

        def pairs(n):
            b, s = [], []
            for i in range(n):
                if i % 2:
                    s.append(serial())
                    b.append(batched())
                else:
                    b.append(batched())
                    s.append(serial())
            return b, s

        pairs(1)                                        # warm: both lanes' graphs built
        batched_s, serial_s = benchmark.pedantic(pairs, args=(PAIRS,), rounds=1,
                                                 iterations=1)
        one_set_s = [batched(one_set=True) for _ in range(PAIRS)]
        status = eng.status()["lanes"]
    assert tokens[0] == N_AGENTS * MAX_TOKENS
    benchmark.group = "lora"
    benchmark.extra_info.update(
        suite="lora", case="mixed_batch", agents=N_AGENTS, adapter_sets=2,
        tokens_per_round=tokens[0], batched_rounds_s=batched_s, serial_rounds_s=serial_s,
        batched_tokens_per_s=tokens[0] / statistics.median(batched_s),
        serial_tokens_per_s=tokens[0] / statistics.median(serial_s),
        one_set_batched_rounds_s=one_set_s,
        one_set_vs_serial=statistics.median(serial_s) / statistics.median(one_set_s),
        lane_steps={name: st["steps"] for name, st in status.items()})


_RSS_PROBE = r"""
import json, sys
from tryll_fast.engines.llama import LlamaEngine, LlamaModel
from tryll_fast.engines.llama.lanes import LaneKey
mode, model_path, a, b = sys.argv[1:5]
def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
engines = []
if mode == "adapters":
    eng = LlamaEngine(model_path, n_ctx=512, n_slots=1, n_prefix_slots=0, n_batch=64)
    engines.append(eng)
    lanes = [eng.open_lane(LaneKey.make([(p, 1.0)])) for p in (a, b)]
    for lane in lanes:
        eng.generate("Hello there, traveller.", max_tokens=4, lane=lane)
else:
    for _ in range(2):      # two fine-tunes merged into two GGUF files: two copies
        model = LlamaModel(model_path, use_mmap=False)
        eng = LlamaEngine(model, n_ctx=512, n_slots=1, n_prefix_slots=0, n_batch=64)
        engines.append((eng, model))
        eng.generate("Hello there, traveller.", max_tokens=4)
print(json.dumps({"rss_bytes": rss()}))
"""


def test_lora_memory_report(benchmark, files):
    model, (a, b) = files

    def probe(mode):
        out = subprocess.run([sys.executable, "-c", _RSS_PROBE, mode, model, a, b],
                             capture_output=True, text=True, check=True, cwd=ROOT)
        return json.loads(out.stdout.strip().splitlines()[-1])["rss_bytes"]

    adapters = benchmark.pedantic(lambda: probe("adapters"), rounds=1, iterations=1)
    copies = probe("copies")
    kv = {}
    with LlamaEngine(model, n_ctx=1024, n_slots=1, n_prefix_slots=0, n_batch=128,
                     n_threads=N_THREADS, n_threads_batch=N_THREADS) as eng:
        base, texts = prompts(1)
        for kv_type in ("f16", "q8_0", "q4_0"):
            lane = eng.open_lane(LaneKey.make(kv_type=kv_type))
            key = ("dialog", kv_type)
            h = eng.submit(texts[0], key=key, lane=lane, max_tokens=16, ignore_eos=True)
            h.result(120)
            n = eng.conversation(key)["tokens"]
            size = eng._call(lambda k=key, ln=lane: _state_size(eng, ln, k), 30)
            kv[kv_type] = {"tokens": n, "state_bytes": size,
                           "bytes_per_token": round(size / n, 1)}
            eng.release(key)
            eng.close_lane(lane)
    benchmark.group = "lora"
    benchmark.extra_info.update(
        suite="lora", case="memory", rss_one_model_two_adapters_mb=round(adapters / 2**20, 1),
        rss_two_model_copies_mb=round(copies / 2**20, 1),
        adapter_file_mb=round(os.path.getsize(a) / 2**20, 2), kv=kv)


def _state_size(eng, lane_key, key) -> int:
    """llama.cpp's own size of the conversation's sequence state (scheduler thread)."""
    import llama_cpp.llama_cpp as C
    lane = eng._lanes[lane_key]
    conv = lane.sched.slots.get(key)
    return C.llama_state_seq_get_size(lane.ctx._live(), conv.seq_id)
