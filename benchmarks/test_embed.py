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

Why rounds in pairs: with 2 OpenMP threads on 2 cores, a llama_decode slows down many
times over whenever anything else takes a core (the threads spin-wait on each other), so
any other process during the run moves both sides of a pair together instead of one.
"""
import os
import statistics
import time

import numpy as np
import pytest

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

    def alternated():
        times = {side: [] for side in SIDES}
        for r in range(PAIRS):
            for side in (SIDES if r % 2 == 0 else SIDES[::-1]):
                t0 = time.perf_counter()
                runs[side]()
                times[side].append(time.perf_counter() - t0)
        return times

    benchmark.group = "embed 1000 lore records"
    times = benchmark.pedantic(alternated, rounds=1, iterations=1)
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
