"""The 8-NPC workload (benchmarks/engine_workload.py: eight villagers sharing the lore,
64 greedy tokens each, Gemma 3 270M, 2 threads) on each llama.cpp build this machine has:
the CPU build in .venv, and the Vulkan build in .venv-vulkan (make test-gpu makes it) with
the model on the first GPU. Reported, not gated: on a machine with no GPU the Vulkan
device is lavapipe, llama.cpp on the CPU through a software Vulkan driver, so its figure
is the backend's overhead, not a speed-up. The same command runs unchanged on a machine
with a GPU (there GGML_VK_VISIBLE_DEVICES is not needed, and may be left unset).

    python -m benchmarks.backends [--rounds 3] [--max-tokens 64] [--json results.json]

lavapipe decodes Gemma about a hundred times slower than the CPU build, so a report made
on it takes fewer tokens per villager (--max-tokens 16) on both builds alike.

Each build runs in its own process (a venv holds one llama-cpp-python): a worker prints
one JSON line with its tokens/s per round and where the model was.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from benchmarks.engine_workload import MAX_TOKENS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N_AGENTS = 8
# (label, venv, extra environment): lavapipe is offered only when named
BUILDS = [
    ("cpu", ".venv", {"TRYLL_LLAMA_PLACEMENT": "ram"}),
    ("vulkan", ".venv-vulkan", {"TRYLL_LLAMA_PLACEMENT": "vram",
                                "GGML_VK_VISIBLE_DEVICES": os.environ.get(
                                    "GGML_VK_VISIBLE_DEVICES", "0")}),
]


def worker(rounds: int, max_tokens: int) -> dict:
    from benchmarks.engine_workload import FLASH_ATTN, N_THREADS, model_path, prompts
    from tryll_fast.engines.llama import LlamaEngine
    base, texts = prompts(N_AGENTS)
    rates = []
    with LlamaEngine(model_path(), n_ctx=4096, n_slots=N_AGENTS, n_prefix_slots=2,
                     n_batch=512, n_threads=N_THREADS, n_threads_batch=N_THREADS,
                     flash_attn_type=FLASH_ATTN) as eng:
        shared = len(eng.tokenize(base))
        for _ in range(rounds + 1):           # the first round warms up (shaders, pages)
            for i in range(N_AGENTS):
                eng.release(("agent", i))
            eng.clear_prefixes()
            t0 = time.perf_counter()
            handles = [eng.submit(p, key=("agent", i), shared_prefix_len=shared,
                                  max_tokens=max_tokens, ignore_eos=True)
                       for i, p in enumerate(texts)]
            for h in handles:
                h.result(1800)
            tokens = sum(h.stats.tokens_generated for h in handles)
            rates.append(tokens / (time.perf_counter() - t0))
            print(f"round {len(rates)}: {rates[-1]:.1f} tokens/s", file=sys.stderr, flush=True)
        place = eng.model.placement_info()
    return {"tokens_per_s": rates[1:], "placement": place["placement"],
            "device": place["device"]}


def venvs(wanted=None):
    """(label, python, environment) of each build whose venv exists (of `wanted`, if
    given); a missing one is reported and skipped."""
    for label, venv, env in BUILDS:
        if wanted is not None and label not in wanted:
            continue
        py = os.path.join(ROOT, venv, "bin", "python")
        if not os.path.exists(py):
            print(f"{label:7s} skipped: {venv} does not exist (make test-gpu builds it)")
            continue
        yield label, py, env


def write_json(path, results) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS,
                    help="tokens each villager generates (default: the engine benchmark's)")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.rounds, args.max_tokens)), flush=True)
        return 0
    results = {}
    for label, py, env in venvs():
        out = subprocess.run([py, "-m", "benchmarks.backends", "--worker",
                              "--rounds", str(args.rounds), "--max-tokens",
                              str(args.max_tokens)],
                             cwd=ROOT, text=True, stdout=subprocess.PIPE,
                             env={**os.environ, **env})
        if out.returncode != 0:
            print(f"{label:7s} failed (exit {out.returncode})", file=sys.stderr)
            return 1
        res = json.loads(out.stdout.strip().splitlines()[-1])
        results[label] = res
        rates = res["tokens_per_s"]
        print(f"{label:7s} {statistics.median(rates):8.1f} tokens/s (median of {len(rates)}: "
              f"{', '.join(f'{r:.1f}' for r in rates)}) on {res['placement']} "
              f"{res['device'] or 'host'}")
    if "cpu" in results and "vulkan" in results:
        ratio = (statistics.median(results["cpu"]["tokens_per_s"])
                 / statistics.median(results["vulkan"]["tokens_per_s"]))
        print(f"cpu / vulkan: {ratio:.2f}")
    write_json(args.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
