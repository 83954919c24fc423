"""Batching pays: eight sequences in one context beat one at a time (numbers printed with -s).

SmolLM2-135M is so small that one token is already compute-bound on 2 cores,
so the gain is modest (~1.3-1.5x measured; Gemma 3 270M: ~2x); the bound
below only guards against the scheduler serialising sequences.
"""
import time

import pytest

from tryll_fast.engines.llama import LlamaEngine

pytestmark = pytest.mark.model

N_AGENTS = 8
N_TOKENS = 32


def run(eng, n):
    prompts = [f"{i}, {i + 1}, {i + 2}," for i in range(n)]
    t0 = time.perf_counter()
    with eng.hold():
        hs = [eng.submit(p, max_tokens=N_TOKENS) for p in prompts]
    for h in hs:
        h.result(120)
    dt = time.perf_counter() - t0
    return sum(h.stats.tokens_generated for h in hs), dt, hs


def test_batched_generation_outruns_single(smollm2_model):
    with LlamaEngine(smollm2_model, n_ctx=2048, n_slots=N_AGENTS, n_batch=256) as eng:
        run(eng, 1)  # warm up
        single_tok, single_s, _ = run(eng, 1)
        batch_tok, batch_s, hs = run(eng, N_AGENTS)
        st = eng.status()
    single = single_tok / single_s
    batched = batch_tok / batch_s
    ttft = max(h.stats.first_token_s for h in hs)
    print(f"\nsingle {single:.0f} tok/s; {N_AGENTS} batched {batched:.0f} tok/s aggregate "
          f"({batched / single:.2f}x); worst first token {ttft * 1000:.0f} ms; "
          f"{st['steps']} steps, {st['decode_s']:.2f} s in llama_decode of {st['step_s']:.2f} s, "
          f"overhead {st['overhead_per_step_s'] * 1e3:.2f} ms/step")
    assert batched > 1.1 * single
