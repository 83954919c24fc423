"""Engine: batched generation with a shared KV prefix vs what a user would
otherwise run, same model (Gemma 3 270M), same threads, same run.

Gates (python -m benchmarks.gates):
  engine_batched_vs_serialised    serialised / batched        >= 2.5
  engine_batched_vs_prompt_cache  prompt_cache / batched      >= 1.5
  engine_restore_vs_reprefill     re-prefill / restore        >= 50
  engine_kv_sharing_efficiency    ideal cells / used cells    >= 0.95
Reported, not gated: time to first token per agent, p50/p99 inter-token
latency with 8 and 32 agents, scheduler overhead per step, and how a long prompt
arriving while others stream stalls them (prefill_while_decoding 0 vs 128)."""
import statistics
import time

import pytest

from benchmarks.engine_workload import (
    HighLevelBaseline, MAX_TOKENS, N_THREADS, lore, model_path, prompts,
)
from tryll_fast.engines.llama import LlamaEngine

N_AGENTS = 8


@pytest.fixture(scope="module")
def gemma():
    return model_path()


@pytest.fixture(scope="module")
def engine(gemma):
    with LlamaEngine(gemma, n_ctx=4096, n_slots=32, n_prefix_slots=2, n_batch=512,
                     n_threads=N_THREADS, n_threads_batch=N_THREADS) as eng:
        yield eng


def _reset(engine, n):
    for i in range(n):
        engine.release(("agent", i))
    engine.clear_prefixes()


def _run_agents(engine, n):
    """n agents submitted together; returns per-agent handles and token times."""
    base, texts = prompts(n)
    shared = len(engine.tokenize(base))
    arrivals = [[] for _ in range(n)]
    t0 = time.perf_counter()
    handles = [engine.submit(p, key=("agent", i), shared_prefix_len=shared, max_tokens=MAX_TOKENS,
                             ignore_eos=True, on_text=lambda _c, a=arrivals[i]: a.append(time.perf_counter()))
               for i, p in enumerate(texts)]
    for h in handles:
        h.result(600)
    return t0, handles, arrivals


def _latency_report(t0, handles, arrivals):
    gaps = sorted(b - a for times in arrivals for a, b in zip(times, times[1:]))
    ttft = [times[0] - t0 for times in arrivals if times]
    q = statistics.quantiles(gaps, n=100)
    return {"ttft_s_mean": statistics.mean(ttft), "ttft_s_max": max(ttft),
            "token_gap_ms_p50": q[49] * 1e3, "token_gap_ms_p99": q[98] * 1e3,
            "tokens": sum(h.stats.tokens_generated for h in handles)}


def test_agents_batched_shared_prefix(benchmark, engine):
    benchmark.group = "engine 8 agents"
    benchmark.extra_info.update(suite="engine", case="batched", agents=N_AGENTS)
    runs = []
    benchmark.pedantic(lambda: runs.append(_run_agents(engine, N_AGENTS)),
                       setup=lambda: _reset(engine, N_AGENTS), rounds=3, iterations=1)
    t0, handles, arrivals = runs[-1]
    assert all(h.stats.tokens_generated == MAX_TOKENS for h in handles)
    mem = engine.memory()
    ideal = mem["prefix_cells"] + sum(s["private_cells"] for s in mem["sequences"].values())
    st = engine.status()
    benchmark.extra_info.update(_latency_report(t0, handles, arrivals),
                                sched_overhead_ms_per_step=st["overhead_per_step_s"] * 1e3,
                                decode_share=st["decode_s"] / st["step_s"],
                                kv_ideal_cells=ideal, kv_used_cells=mem["context"]["kv_cells_used"],
                                kv_cells_unshared=sum(s["tokens"] for s in mem["sequences"].values()))


@pytest.fixture(scope="module")
def baseline(gemma):
    b = HighLevelBaseline(gemma)
    yield b
    b.close()


@pytest.mark.parametrize("case", ["serialised", "prompt_cache"])
def test_agents_baseline(benchmark, baseline, case):
    benchmark.group = "engine 8 agents"
    benchmark.extra_info.update(suite="engine", case=case, agents=N_AGENTS)
    _, texts = prompts(N_AGENTS)
    run = getattr(baseline, case)
    tokens = benchmark.pedantic(lambda: run(texts), rounds=2, iterations=1)
    assert tokens == N_AGENTS * MAX_TOKENS


def test_latency_32_agents(benchmark, engine):
    """Not gated: how latency holds up with 32 characters talking at once."""
    benchmark.group = "engine 32 agents"
    benchmark.extra_info.update(suite="engine", case="batched_32", agents=32)
    runs = []
    benchmark.pedantic(lambda: runs.append(_run_agents(engine, 32)),
                       setup=lambda: _reset(engine, 32), rounds=1, iterations=1)
    benchmark.extra_info.update(_latency_report(*runs[-1]))
    _reset(engine, 32)


@pytest.mark.parametrize("cap", [0, 128])
def test_long_prompt_while_streaming(benchmark, engine, cap):
    """Not gated: four agents stream; a fifth arrives with an ~830-token prompt. With
    prefill_while_decoding the prompt goes in 128-token chunks, one per step, so the
    streams keep getting tokens (the server's default is 128; 0 = whole n_batch steps)."""
    benchmark.group = "engine long prompt while streaming"
    benchmark.extra_info.update(suite="engine", case=f"newcomer_cap_{cap}", cap=cap)
    base, texts = prompts(4)
    shared = len(engine.tokenize(base))
    newcomer = (lore() + " ") * 2 + "Tell me a story."
    results = []

    def run():
        arrivals = [[] for _ in texts]
        streams = [engine.submit(p, key=("agent", i), shared_prefix_len=shared, max_tokens=48,
                                 ignore_eos=True,
                                 on_text=lambda _c, a=arrivals[i]: a.append(time.perf_counter()))
                   for i, p in enumerate(texts)]
        while not all(len(a) >= 4 for a in arrivals):
            time.sleep(0.002)
        first = []
        t0 = time.perf_counter()
        h = engine.submit(newcomer, key=("newcomer",), max_tokens=4, ignore_eos=True,
                          on_text=lambda _c: first.append(time.perf_counter()))
        h.result(600)
        for s in streams:
            s.result(600)
        gaps = [b - a for times in arrivals for a, b in zip(times, times[1:]) if b > t0]
        results.append((first[0] - t0, max(gaps), h.stats.prompt_tokens))

    def setup():
        _reset(engine, 4)
        engine.release(("newcomer",))
    engine.prefill_while_decoding = cap
    try:
        benchmark.pedantic(run, setup=setup, rounds=3, iterations=1)
    finally:
        engine.prefill_while_decoding = 0
        setup()
    benchmark.extra_info.update(
        newcomer_prompt_tokens=results[-1][2],
        newcomer_ttft_s=statistics.median(r[0] for r in results),
        streams_max_gap_ms=statistics.median(r[1] for r in results) * 1e3)


def _one_prompt():
    return prompts(1)[1][0]


def test_reprefill(benchmark, engine):
    """Baseline for restore: decode the whole conversation again (~460 tokens)."""
    benchmark.group = "engine restore"
    benchmark.extra_info.update(suite="engine", case="reprefill")
    prompt = _one_prompt()

    def setup():
        engine.release(("solo", 0))
        engine.clear_prefixes()
    benchmark.pedantic(lambda: engine.prefill(("solo", 0), prompt).result(600),
                       setup=setup, rounds=3, iterations=1)


def test_restore(benchmark, engine):
    """Evicted to host memory, then brought back for the same prompt."""
    benchmark.group = "engine restore"
    benchmark.extra_info.update(suite="engine", case="restore")
    prompt = _one_prompt()
    engine.release(("solo", 0))
    engine.clear_prefixes()
    engine.prefill(("solo", 0), prompt).result(600)
    handles = []
    benchmark.pedantic(lambda: handles.append(engine.prefill(("solo", 0), prompt).result(600)),
                       setup=lambda: engine.evict(("solo", 0)), rounds=5, iterations=1)
