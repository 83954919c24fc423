"""Batching: eight sequences share each llama_decode instead of taking turns.

How much faster that is belongs to the benchmarks (engine_batched_vs_serialised in
benchmarks/test_engine_bench.py, docs/benchmarks.md); here the scheduler's own counts show
that the sequences were decoded together, not one after another.
"""
import pytest

from tryll_fast.engines.llama import LlamaEngine

pytestmark = pytest.mark.model

N_AGENTS = 8
N_TOKENS = 32


def run(eng, n):
    """n short prompts arriving together, each generating exactly N_TOKENS tokens;
    returns the handles and the steps and step tokens this run took."""
    before = eng.status()
    prompts = [f"{i}, {i + 1}, {i + 2}," for i in range(n)]
    with eng.hold():
        hs = [eng.submit(p, max_tokens=N_TOKENS, ignore_eos=True) for p in prompts]
    for h in hs:
        h.result(120)
    after = eng.status()
    return hs, after["steps"] - before["steps"], after["step_tokens"] - before["step_tokens"]


def test_batched_sequences_share_every_step(smollm2_model):
    with LlamaEngine(smollm2_model, n_ctx=2048, n_slots=N_AGENTS, n_batch=256) as eng:
        single, single_steps, _ = run(eng, 1)
        batch, batch_steps, batch_tokens = run(eng, N_AGENTS)
    assert [h.stats.tokens_generated for h in single + batch] == [N_TOKENS] * (1 + N_AGENTS)
    # one step prefills a prompt and samples its first token, then one step per token:
    # eight sequences take as many steps as one does, not eight times as many
    assert single_steps == batch_steps == N_TOKENS
    prefilled = sum(h.stats.prefilled_tokens for h in batch)
    assert prefilled == sum(h.stats.prompt_tokens for h in batch)
    assert batch_tokens == prefilled + N_AGENTS * (N_TOKENS - 1)
