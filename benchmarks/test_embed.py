"""Embeddings: a knowledge base's records embedded in batches (several texts per
llama_decode: one Embedder.embed over all of them) against one Embedder.embed([text]) call
per record, which is what a caller that embeds records as they arrive would run. Same
model (all-MiniLM-L6-v2, the catalog's embedding model), same Embedder, same 2 threads,
same run.

Gate (python -m benchmarks.gates):
  embed_batch_vs_one_by_one  1 000 lore records (benchmarks/retrieval_set.py): the
                             median over rounds of one_by_one / batched, the two sides of
                             a round run back to back in alternating order            >= 3
Reported: ms per record both ways, every round's ratio, tokens per record.
Reported: SmolLM2's generation (ms a token) alone and beside a live thread that embedded
records (test_generation_beside_an_embedder).

Why rounds in pairs: with 2 OpenMP threads on 2 cores, a llama_decode slows down many
times over whenever anything else takes a core (the threads spin-wait on each other), so
any other process during the run moves both sides of a pair together instead of one.
"""
import os
import statistics
import threading
import time

import numpy as np
import pytest

from benchmarks.pairs import alternated, timed
from benchmarks.retrieval_set import lore_records
from tryll_fast.engines.llama.embeddings import Embedder
from tryll_fast.models import ensure_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(ROOT, "build", "models")
MINILM = "all-MiniLM-L6-v2"
N_RECORDS = 1000
N_THREADS = 2
PAIRS = 5
SIDES = ("batched", "one_by_one")


@pytest.fixture(scope="module")
def embedder():
    e = Embedder(ensure_model(MINILM, MODELS_DIR), n_threads=N_THREADS)
    yield e
    e.close()


def test_embed_batched_vs_one_by_one(benchmark, embedder):
    records = lore_records(N_RECORDS)
    runs = {
        "batched": lambda: embedder.embed(records),
        "one_by_one": lambda: np.concatenate([embedder.embed([t]) for t in records]),
    }
    out = {side: run() for side, run in runs.items()}  # warm-up, and the check below
    # The same vectors either way (llama.cpp is not bit-identical across batch shapes).
    assert float(np.min(np.sum(out["batched"] * out["one_by_one"], axis=1))) > 0.999

    benchmark.group = "embed 1000 lore records"
    times = benchmark.pedantic(alternated,
                               args=({side: timed(runs[side]) for side in SIDES}, PAIRS),
                               rounds=1, iterations=1)
    tokens = sum(len(embedder.tokenize(t)) for t in records)
    benchmark.extra_info.update(
        suite="embed", case="batch_vs_one_by_one", records=N_RECORDS, tokens=tokens,
        n_batch=embedder.n_batch, n_seq_max=embedder.n_seq_max, threads=N_THREADS,
        pairs=PAIRS)
    for side, values in times.items():
        benchmark.extra_info[f"{side}_rounds_s"] = values
        benchmark.extra_info[f"{side}_ms_per_record"] = (statistics.median(values) * 1e3
                                                         / N_RECORDS)
    benchmark.extra_info["round_ratios"] = [round(o / b, 3) for o, b in
                                            zip(times["one_by_one"], times["batched"])]


def test_generation_beside_an_embedder(benchmark, embedder):
    """Reported: SmolLM2's greedy generation alone, and while another thread that has
    embedded records is still alive (as a server's request thread is after building a
    storage), in alternating pairs. Both sides decode on the compute thread
    (engines/llama/compute.py); when each thread called llama.cpp itself, the second
    thread's OpenMP team made libgomp throttle every barrier's spin and generation ran
    2-4x slower beside an embedder (docs/benchmarks.md, "One compute thread")."""
    from tryll_fast.engines.llama import LlamaEngine

    records = lore_records(16)
    tokens = 48
    engine = LlamaEngine(ensure_model("SmolLM2-135M-Instruct", MODELS_DIR), n_ctx=512,
                         n_slots=1, n_threads=N_THREADS, n_threads_batch=N_THREADS)
    prompt = "The baker of Oakvale tells the traveller about the village:"

    def generate() -> float:
        t0 = time.perf_counter()
        h = engine.submit(prompt, max_tokens=tokens, ignore_eos=True, temperature=0.0)
        h.result(600)
        return time.perf_counter() - t0

    def beside() -> float:
        done, hold = threading.Event(), threading.Event()

        def worker():
            embedder.embed(records)
            done.set()
            hold.wait()

        t = threading.Thread(target=worker)
        t.start()
        done.wait()
        try:
            return generate()
        finally:
            hold.set()
            t.join()

    try:
        generate()                                   # warm-up
        times = benchmark.pedantic(alternated, args=({"alone": generate,
                                                      "beside_embedder": beside}, PAIRS),
                                   rounds=1, iterations=1)
    finally:
        engine.close()
    benchmark.group = "generation beside an embedder"
    benchmark.extra_info.update(suite="embed", case="generation_beside_embedder",
                                tokens=tokens, threads=N_THREADS, pairs=PAIRS)
    for side, values in times.items():
        benchmark.extra_info[f"{side}_rounds_s"] = values
        benchmark.extra_info[f"{side}_ms_per_token"] = statistics.median(values) * 1e3 / tokens
