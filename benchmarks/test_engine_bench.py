"""Engine: batched generation with a shared KV prefix vs what a user would otherwise run,
same model (Gemma 3 270M), same threads, batch, flash attention and greedy sampling, same
number of rounds, same run.

Gates (python -m benchmarks.gates):
  engine_batched_vs_serialised      serialised / batched                            >= 2.0
  engine_batched_vs_prompt_cache    prompt_cache / batched                          >= 1.2
  engine_agents_per_kv_vs_unshared  agents that fit one 4 096-cell KV cache before
                                    llama_decode finds no cell, sharing the lore /
                                    each holding a copy                             >= 4
Reported, not gated: time to first token per agent, p50/p99 inter-token latency with 8
and 32 agents, scheduler overhead per step, how a long prompt arriving while others stream
stalls them (prefill_while_decoding 0 vs 128), and a restore from the host-memory tier
next to a re-prefill (the gated eviction path is in test_evict_bench.py)."""
import statistics
import time

import pytest

from benchmarks.engine_workload import (
    FLASH_ATTN, HighLevelBaseline, MAX_TOKENS, N_THREADS, lore, model_path, prompts,
)
from tryll_fast.engines.errors import EngineError
from tryll_fast.engines.llama import LlamaEngine, compute

N_AGENTS = 8


@pytest.fixture(scope="module")
def gemma():
    return model_path()


@pytest.fixture(scope="module")
def engine(gemma):
    with LlamaEngine(gemma, n_ctx=4096, n_slots=32, n_prefix_slots=2, n_batch=512,
                     n_threads=N_THREADS, n_threads_batch=N_THREADS,
                     flash_attn_type=FLASH_ATTN) as eng:
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
    handles = [engine.submit(p, key=("agent", i), shared_prefix_len=shared,
                             max_tokens=MAX_TOKENS, ignore_eos=True,
                             on_text=lambda _c, a=arrivals[i]: a.append(time.perf_counter()))
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
    st = engine.status()
    benchmark.extra_info.update(_latency_report(t0, handles, arrivals),
                                sched_overhead_ms_per_step=st["overhead_per_step_s"] * 1e3,
                                decode_share=st["decode_s"] / st["step_s"])


# One KV cache of a fixed size (4 096 cells, what a game might give its NPCs): how many
# agents, each holding the lore, its question and an answer of about MAX_TOKENS tokens (a
# conversation after its first turn), fit before llama.cpp's llama_decode finds no free
# cell for the next one, the lore shared against each agent holding its own copy. Both
# sides are counted by llama.cpp's cache: the engine evicts idle conversations only after
# llama_decode has failed, so "fits" = the agent's prefill finished and every earlier agent
# is still resident. Prefill, not generation: the cells held are the same, and one decode
# per agent keeps the run short.
KV_CELLS = 4096
KV_MAX_AGENTS = 96
ANSWER = (" Ah, traveller, you have come to the right person. Walk past the temple of the "
          "Lantern, mind the ferryman's prices, and ask for the widow Marla at the Prancing "
          "Pony; tell her Brenna sent you and she will find you a warm bed and a bowl of "
          "stew.")  # about MAX_TOKENS tokens on Gemma's tokenizer


def _agents_that_fit(engine, shared: bool) -> dict:
    base, _ = prompts(1)
    texts = [t + ANSWER for t in prompts(KV_MAX_AGENTS)[1]]
    prefix = len(engine.tokenize(base))
    with LlamaEngine(engine.model, n_ctx=KV_CELLS, n_slots=KV_MAX_AGENTS,
                     n_prefix_slots=1 if shared else 0, n_batch=512,
                     n_threads=N_THREADS, n_threads_batch=N_THREADS,
                     flash_attn_type=FLASH_ATTN) as eng:
        fitted = 0
        for i, text in enumerate(texts):
            h = eng.prefill(("agent", i), text, shared_prefix_len=prefix if shared else 0)
            try:
                h.result(600)
            except EngineError:  # KV full with nothing idle left to evict
                break
            if any(not eng.conversation(("agent", j))["resident"] for j in range(i)):
                break
            fitted += 1
        return {"n_ctx": eng.ctx.n_ctx, "prefix_tokens": prefix,
                "tokens_per_agent": sum(len(eng.tokenize(t)) for t in texts[:8]) / 8,
                "agents_fit": fitted,
                "stopped_by": "max_agents" if fitted == KV_MAX_AGENTS else "kv_full"}


@pytest.mark.parametrize("sharing", ["shared", "unshared"])
def test_agents_per_kv(benchmark, engine, sharing):
    """Agents sharing the lore prefix vs the same agents each holding their own copy."""
    benchmark.group = "engine agents per KV cache"
    out = benchmark.pedantic(_agents_that_fit, args=(engine, sharing == "shared"),
                             rounds=1, iterations=1)
    assert out["stopped_by"] == "kv_full", out
    benchmark.extra_info.update(suite="engine", case=f"kv_fit_{sharing}", **out)


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
    # On the compute thread our engine decodes on: llama.cpp called from a second thread
    # would start a second OpenMP team, and libgomp then throttles both sides' barriers
    # (docs/architecture.md, "One compute thread"). A program of its own has one team.
    tokens = benchmark.pedantic(lambda: compute.run(run, texts), rounds=3, iterations=1)
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
    """Evicted to host memory (tier "host"), then brought back for the same prompt."""
    benchmark.group = "engine restore"
    benchmark.extra_info.update(suite="engine", case="restore")
    prompt = _one_prompt()
    engine.release(("solo", 0))
    engine.clear_prefixes()
    engine.prefill(("solo", 0), prompt).result(600)
    handles = []
    benchmark.pedantic(lambda: handles.append(engine.prefill(("solo", 0), prompt).result(600)),
                       setup=lambda: engine.evict(("solo", 0), tier="host"), rounds=5,
                       iterations=1)
