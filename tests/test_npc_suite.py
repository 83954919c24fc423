"""The NPC quality suite's data and scoring (benchmarks/npc/): the case files load and hold
what the suite promises, and the judge is as strict as its docstring says (no server)."""
import math

import pytest

from benchmarks.npc.cases import CATEGORIES, Case, Call, SuiteError, load_suite
from benchmarks.npc.score import (
    CHECKS, Outcome, category_scores, contains, judge, overall, wilson,
)


@pytest.fixture(scope="module")
def suite():
    return load_suite()


def test_the_suite_covers_every_category(suite):
    cases = suite.all_cases()
    by = {c: sum(1 for x in cases if x.category == c) for c in CATEGORIES}
    assert len(cases) >= 200 and all(n > 0 for n in by.values()), by
    assert by["tools"] >= 50
    tools = [c for c in cases if c.category == "tools"]
    assert sum(1 for c in tools if c.calls == ()) >= 8                    # irrelevance
    assert sum(1 for c in tools if c.calls and len(c.calls) > 1) >= 6      # parallel
    checkpoints = {c.checkpoint for c in cases if c.category == "recall"}
    assert {5, 50, 300} <= checkpoints
    long = [r for r in suite.recalls if 300 in r.checkpoints]
    assert long and len(long[0].facts) == 10
    agent = suite.agent(long[0])
    assert any(type(n.params).__name__ == "SummarizeParams" for n in agent.graph.nodes)
    assert len(suite.settings) >= 4


def test_every_case_names_what_it_scores_and_an_agent_of_its_file(suite):
    for case in suite.all_cases():
        assert case.agent in suite.settings[case.setting].agents
        assert (case.expect or case.forbid or case.checks or case.calls is not None
                or case.intent is not None or case.attributes is not None
                or case.route is not None), case.id


def _case(**kw):
    base = dict(id="t", category="facts", setting="s", agent="a", say=("Hi",))
    base.update(kw)
    return Case(**base)


def test_expect_alternatives_word_boundaries_and_normalisation():
    c = _case(expect=(("3 copper", "three copper"), ("Tomas Reed",)))
    assert judge(c, Outcome("t", "facts", text="Rye is three  copper; ask Tomas\u00a0Reed.")).passed
    miss = judge(c, Outcome("t", "facts", text="Rye is 13 copper; ask Tomas Reed."))
    assert not miss.passed and miss.failures == ["missing 3 copper | three copper"]
    assert not contains("Tomas Reedman", "Tomas Reed")
    assert contains("It\u2019s the mill's wheel", "it's the mill's wheel")


def test_checks_catch_self_claims_and_stage_directions_not_echoes():
    c = _case(category="character", checks=("in_character", "no_stage_directions", "in_world"),
              say=("Can you look it up online?",))
    def verdict(text):
        return judge(c, Outcome("t", "character", text=text))
    assert verdict("Online? I don't follow you, friend.").passed          # an echo
    assert verdict("Language model? Never heard of such a thing.").passed
    for bad in ("As an AI, I cannot browse.", "I'm Qwen, created by Alibaba Cloud.",
                "*smiles warmly* Welcome!", "(laughs) Sure.", "Use the search bar on your phone.",
                "That costs $100.", "I don't have feelings, but thanks."):
        assert not verdict(bad).passed, bad


def test_calls_compare_as_parsed_json_in_any_order():
    c = _case(category="tools", calls=(Call("give_item", {"item": "rye", "count": 2}),
                                       Call("open_door", {"door": "front"})))
    got = [{"name": "open_door", "arguments": {"door": "Front "}},
           {"name": "give_item", "arguments": {"count": 2.0, "item": "RYE"}}]
    assert judge(c, Outcome("t", "tools", calls=got)).passed
    extra = got + [{"name": "open_door", "arguments": {"door": "back"}}]
    assert not judge(c, Outcome("t", "tools", calls=extra)).passed
    wrong = [dict(got[0]), {"name": "give_item", "arguments": {"item": "rye", "count": 3}}]
    assert not judge(c, Outcome("t", "tools", calls=wrong)).passed
    none = _case(category="tools", calls=(), checks=("no_raw_call",))
    assert judge(none, Outcome("t", "tools", text="Good day to you!")).passed
    raw = judge(none, Outcome("t", "tools", text='{"name": "give_item", "arguments": {}}'))
    assert not raw.passed and raw.failures == ["no_raw_call: '{\"name\":'"]


def test_an_error_fails_the_case_whatever_the_text():
    c = _case(expect=(("bread",),))
    assert not judge(c, Outcome("t", "facts", text="bread", error="4001 boom")).passed


def test_wilson_and_bootstrap_intervals():
    lo, hi = wilson(8, 10)
    assert 0.49 < lo < 0.5 and 0.94 < hi < 0.95              # the textbook 0.490-0.943
    assert wilson(0, 5)[0] == 0.0 and wilson(5, 5)[1] == 1.0
    outs = [Outcome(str(i), "facts", passed=i < 8) for i in range(10)] + \
           [Outcome(f"t{i}", "tools", passed=i < 2) for i in range(10)]
    o = overall(outs)
    assert math.isclose(o["score"], 0.5) and o["ci95"][0] < 0.5 < o["ci95"][1]
    assert o == overall(outs)                                  # seeded: reproducible
    cats = category_scores(outs, CATEGORIES)
    assert cats["facts"]["score"] == 0.8 and cats["tools"]["n"] == 10


def test_malformed_case_files_name_the_file_and_key(tmp_path):
    (tmp_path / "bad.toml").write_text(
        '[agents.a.nodes.reply]\ntype = "Generate"\n'
        '[[case]]\nid = "x"\ncategory = "facts"\nagent = "a"\nsay = "Hi"\nchecks = ["nope"]\n')
    with pytest.raises(SuiteError, match=r"bad.toml: case 'x'.checks: 'nope' is not one of"):
        load_suite(tmp_path)
    (tmp_path / "bad.toml").write_text(
        '[agents.a]\ndefault_model = "m"\n[agents.a.nodes.reply]\ntype = "Generate"\n')
    with pytest.raises(SuiteError, match="default_model: leave it out"):
        load_suite(tmp_path)
    assert set(CHECKS) == {"in_character", "no_stage_directions", "in_world", "no_raw_call"}
