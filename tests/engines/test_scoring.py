"""Scoring requests (SamplingParams.score_tokens): the next-token distribution over a few
candidate tokens, the letter-choice classifiers' primitive, through the batched engine."""
import math

import pytest

from engine_prompts import chatml
from tryll_fast.engines.llama import InvalidRequest, LlamaEngine

pytestmark = pytest.mark.model

QUESTION = ("Which animal barks? Reply with one letter.\nA. a cat\nB. a dog\nC. a fish\n"
            "D. a bird")


@pytest.fixture
def engine(smollm2_model):
    eng = LlamaEngine(smollm2_model, n_ctx=1024, n_slots=6, n_batch=128)
    yield eng
    eng.close()


def letters(model, n):
    ids = [model.tokenize(chr(ord("A") + i), add_special=False) for i in range(n)]
    assert all(len(t) == 1 for t in ids), ids           # one token a letter
    return [t[0] for t in ids]


def test_scores_are_a_distribution_whose_best_is_what_llama_cpp_picks(engine):
    cands = letters(engine.model, 4)
    h = engine.submit(chatml(QUESTION), max_tokens=1, score_tokens=cands)
    assert h.result(60) == ""                             # nothing sampled, nothing sent
    assert h.finish_reason == "stop" and h.tokens == []
    scores = h.scores
    assert len(scores) == 4 and math.isclose(sum(scores), 1.0, rel_tol=1e-9)
    assert all(0.0 <= s <= 1.0 for s in scores)
    # llama.cpp's own greedy sampler, restricted to the letters by a grammar, takes the
    # letter our scores rank first
    g = engine.submit(chatml(QUESTION), max_tokens=1,
                      grammar='root ::= "A" | "B" | "C" | "D"')
    assert g.result(60) == "ABCD"[max(range(4), key=scores.__getitem__)]


def test_the_order_of_candidates_is_the_order_of_scores(engine):
    cands = letters(engine.model, 4)
    # one after the other, alone in the batch: requests decoded in one batch together get
    # logits that differ in the third decimal (other matrix shapes, other kernels)
    a = engine.submit(chatml(QUESTION), max_tokens=1, score_tokens=cands)
    assert a.wait(60)
    b = engine.submit(chatml(QUESTION), max_tokens=1, score_tokens=cands[::-1])
    assert b.wait(60)
    assert a.scores == pytest.approx(b.scores[::-1], abs=1e-3)


def test_scoring_batches_with_generation_and_keeps_the_conversation(engine):
    cands = letters(engine.model, 2)
    gens = [engine.submit(chatml(f"Count to {n}."), max_tokens=24) for n in (5, 8)]
    key = ("agent", "classify")
    s = engine.submit(chatml("Is fire hot? A. yes B. no"), key=key, max_tokens=1,
                      score_tokens=cands)
    assert s.wait(60) and s.scores is not None and len(s.scores) == 2
    assert all(len(g.result(60)) > 0 for g in gens)
    # the prompt stays in the conversation's KV like any other request's
    conv = engine.conversation(key)
    assert conv is not None and conv["tokens"] > 0


@pytest.mark.parametrize("kw,words", [
    (dict(max_tokens=0, score_tokens=[1]), "max_tokens >= 1"),
    (dict(max_tokens=1, score_tokens=[10 ** 9]), "outside the vocabulary"),
    (dict(max_tokens=1, score_tokens=[5, 5]), "must not repeat"),
    (dict(max_tokens=1, score_tokens=[-1]), "ints >= 0"),
])
def test_bad_scoring_requests_are_refused(engine, kw, words):
    with pytest.raises(InvalidRequest) as err:
        engine.submit(chatml("hi"), **kw)
    assert words in str(err.value)
