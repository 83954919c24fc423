"""A window slide: the first token of the turn after a dialog's oldest quarter left the
window, with the context shift (the engine's default) against decoding the window again
(`context_shift` off), on SmolLM2 with 2 threads. Reported, not gated (docs/benchmarks.md,
"Window slides").

The dialog: a system prompt and 90 interactions (~3 400 tokens) in a 4 096-token context;
the next prompt drops the oldest 22 interactions, as the projection does at its high mark
(down to 75 % of the window), and asks a new question. Each side runs on its own engine
over the same loaded model, in alternating pairs; the clock is the engine's
(RequestStats.first_token_s: submit to the first sampled token), which both sides share.
"""
import os
import statistics

import pytest

from benchmarks.engine_workload import N_THREADS, ROOT
from benchmarks.pairs import alternated
from tryll_fast.engines.llama import LlamaEngine, LlamaModel

SMOL = "SmolLM2-135M-Instruct"
PAIRS = 3
SYSTEM = "<|im_start|>system\nYou are Brenna, the baker of Oakvale.<|im_end|>\n"
N_TURNS = 90


def _turn(i: int) -> str:
    return (f"<|im_start|>user\nWhat do you think about topic number {i}?<|im_end|>\n"
            f"<|im_start|>assistant\nTopic {i} is something everyone in Oakvale talks about "
            "these days.<|im_end|>\n")


@pytest.fixture(scope="module")
def model():
    from tryll_fast.models import ensure_model
    m = LlamaModel(str(ensure_model(SMOL, os.path.join(ROOT, "build", "models"))))
    yield m
    m.close()


def _slide(model, shift: bool) -> dict:
    with LlamaEngine(model, n_ctx=4096, n_slots=2, n_batch=512, n_threads=N_THREADS,
                     n_threads_batch=N_THREADS, context_shift=shift) as eng:
        turns = [_turn(i) for i in range(N_TURNS)]
        ask = "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
        first = eng.tokenize(SYSTEM + "".join(turns) + ask)
        h = eng.submit(first, key="npc", max_tokens=8)
        h.result(600)
        second = eng.tokenize(SYSTEM + "".join(turns[N_TURNS // 4:]) + ask + h.text
                              + "<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n"
                              "<|im_start|>assistant\n")
        h2 = eng.submit(second, key="npc", max_tokens=8)
        h2.result(600)
        st = h2.stats
        return {"first_token_ms": st.first_token_s * 1000, "prefilled": st.prefilled_tokens,
                "shifted": st.shifted_tokens, "tokens_before": len(first),
                "tokens_after": len(second)}


def test_window_slide(benchmark, model):
    benchmark.group = "engine window slide"
    benchmark.extra_info.update(suite="window", case="window_slide")
    runs: dict[str, list[dict]] = {"shift": [], "reprefill": []}

    def side(name: str):
        def run() -> float:
            runs[name].append(_slide(model, name == "shift"))
            return runs[name][-1]["first_token_ms"] / 1000
        return run

    benchmark.pedantic(lambda: alternated({"shift": side("shift"),
                                           "reprefill": side("reprefill")}, PAIRS),
                       rounds=1, iterations=1)
    for side, results in runs.items():
        ms = [r["first_token_ms"] for r in results]
        benchmark.extra_info[f"{side}_first_token_ms"] = ms
        benchmark.extra_info[f"{side}_first_token_ms_p50"] = statistics.median(ms)
        benchmark.extra_info[f"{side}_prefilled"] = results[0]["prefilled"]
    benchmark.extra_info.update(shifted=runs["shift"][0]["shifted"],
                                tokens_before=runs["shift"][0]["tokens_before"],
                                tokens_after=runs["shift"][0]["tokens_after"])
    assert runs["shift"][0]["shifted"] > 0 and runs["reprefill"][0]["shifted"] == 0
