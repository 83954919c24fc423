"""The NPC quality gates, from `make eval`'s results (benchmarks/npc/): what the characters
say with the default language model against SmolLM2's, on the same cases in the same
suite, and the 300-turn recall.

Gates (python -m benchmarks.gates):
  npc_quality_default_vs_smollm2  overall score (the mean of the category pass rates) of
                                  the catalog's default language model over SmolLM2-135M's
                                                                                       >= 2
  long_dialog_recall_turn300      the facts a player gave in the first ten turns of a chat
                                  with a Summarize node that the default model recalls at
                                  turn 300 (one question each, strict scoring)       >= 0.8
                                  (swapped: SmolLM2's recall in the same place)

The results file is read when it holds both models measured on the current case files;
otherwise the suite runs for them first (about half an hour on 2 cores).
"""
import os
import subprocess
import sys

import pytest

from benchmarks.npc import report
from benchmarks.npc.cases import load_suite
from tryll_fast.models import load_catalog
from tryll_fast.server.server import default_llm as server_default_llm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOL = "SmolLM2-135M-Instruct"


def default_llm() -> str:
    return server_default_llm(load_catalog(), "")


@pytest.fixture(scope="module")
def results():
    suite = load_suite()
    wanted = [default_llm(), SMOL]
    data = report.load(report.RESULTS, suite.digest)
    missing = [m for m in wanted if m not in data["models"] or data["models"][m]["partial"]]
    if missing:
        subprocess.run([sys.executable, "-m", "benchmarks.npc", "--models", ",".join(missing)],
                       cwd=ROOT, check=True)
        data = report.load(report.RESULTS, suite.digest)
    return data


def _recall_at(entry: dict, checkpoint: int) -> float | None:
    cases = [c for c in entry["cases"] if c["category"] == "recall"
             and c["id"].split("@")[1].split(":")[0] == str(checkpoint)]
    return sum(c["passed"] for c in cases) / len(cases) if cases else None


@pytest.mark.parametrize("role", ["default", "smollm2"])
def test_npc_quality(benchmark, results, role):
    model = default_llm() if role == "default" else SMOL
    entry = results["models"][model]
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    benchmark.group = "npc"
    benchmark.extra_info.update({
        "suite": "npc", "case": "quality", "impl": role, "model": model,
        "score": entry["overall"]["score"], "ci95": entry["overall"]["ci95"],
        "recall_t300": _recall_at(entry, 300), "recall_t50": _recall_at(entry, 50),
        "recall_t5": _recall_at(entry, 5),
        "categories": {c: v["score"] for c, v in entry["categories"].items()},
        "first_token_ms_p50": entry["latency"]["first_token_ms_p50"],
        "cases_digest": results["suite"]["digest"], "commit": results.get("commit")})
