"""A smoke run of the NPC quality suite (benchmarks/npc/) on the catalog's default language
model: about thirty cases through a live server over TCP, with floors that a broken prompt
path fails. A dropped system prompt loses the persona's facts; a template that loses the
history loses the recall and the follow-up questions; a Retrieve result that never reaches
the prompt loses the knowledge. The floors sit below what the model scores in `make eval`
(docs/npc-quality.md), so a working path passes whatever the batch order; they say nothing
about speed."""
import pytest

from benchmarks.npc.cases import load_suite
from benchmarks.npc.run import MODELS_DIR, run_model
from benchmarks.npc.score import category_scores
from tryll_fast.models import ensure_model, load_catalog
from tryll_fast.server.server import default_llm

pytestmark = pytest.mark.model

# cases per category, taken in turn from each setting's file
PICK = {"facts": 8, "knowledge": 4, "character": 4, "tools": 4, "classify": 2, "guardrail": 2}
# the recall conversation whose first checkpoint is asked: six facts, five turns later
RECALL = "kes-pilot"
# at least this many passed, per category. make eval's run of these cases on
# Qwen2.5-Coder-0.5B-Instruct passed facts 7/8, knowledge 4/4, recall 4/6, character 3/4,
# tools 4/4, guardrail 2/2; SmolLM2-135M (a model that drops what its prompt holds) passed
# facts 2, recall 0, tools 0.
FLOORS = {"facts": 5, "knowledge": 3, "recall": 3, "character": 1, "tools": 2, "guardrail": 2}


def picked(suite) -> set[str]:
    """PICK's cases, taken in turn from each setting's file (file order within one)."""
    out = set()
    for category, n in PICK.items():
        queues: dict[str, list[str]] = {}
        for case in suite.cases:
            if case.category == category:
                queues.setdefault(case.setting, []).append(case.id)
        taken = 0
        while taken < n and any(queues.values()):
            for q in queues.values():
                if q and taken < n:
                    out.add(q.pop(0))
                    taken += 1
    return out


@pytest.fixture(scope="module")
def run():
    suite = load_suite()
    model = default_llm(load_catalog(), "")
    for name in (model, "all-MiniLM-L6-v2"):
        ensure_model(name, MODELS_DIR)        # where the suite's server looks
    chosen = picked(suite)
    first = min(r.checkpoints[0] for r in suite.recalls if r.id == RECALL)
    result = run_model(
        suite, model, categories=[*PICK, "recall"], parallel=4, progress=lambda s: None,
        select=lambda c: c.id in chosen or c.recall == RECALL, checkpoints=[first])
    return model, result


def test_the_default_model_clears_the_floors(run):
    model, result = run
    outcomes = result["outcomes"]
    scores = category_scores(outcomes, list(FLOORS) + ["classify"])
    failed = [f"{o.case_id}: {'; '.join(o.failures)} :: {o.text[:120]!r}"
              for o in outcomes if not o.passed]
    for category, floor in FLOORS.items():
        got = scores[category]["passed"]
        assert got >= floor, (f"{model}: {category} {got}/{scores[category]['n']} passed, "
                              f"floor {floor}", failed)
    assert not [o for o in outcomes if o.error], failed       # no turn may fail outright
