"""The benchmark gates can fail, and the committed evidence adds up.

benchmarks/results/summary.json is written by `make bench` and committed with every change
to docs/benchmarks.md: the gates' values and the compacted results they came from. Here
the gates are recomputed from those results, and computed again with each gate's two
measured sides exchanged (ours in the baseline's place, the client clock in the engine's),
where every one of them must FAIL."""
import json
import math
import os
import subprocess
import sys

import pytest

from benchmarks import gates

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def summary():
    with open(gates.SUMMARY) as f:
        return json.load(f)


def test_summary_names_a_commit_of_this_repository(summary):
    assert len(summary["commit"]) == 40
    kind = subprocess.run(["git", "cat-file", "-t", summary["commit"]], cwd=ROOT,
                          capture_output=True, text=True)
    assert kind.stdout.strip() == "commit", summary["commit"]


def test_every_gate_is_in_the_summary_and_measured(summary):
    assert [g["name"] for g in summary["gates"]] == [g.name for g in gates.GATES]
    results = {g.name: (v, ok) for g, v, ok in gates.evaluate(summary["results"])}
    for entry in summary["gates"]:
        value, ok = results[entry["name"]]
        assert not math.isnan(value), f"{entry['name']}: a side is missing from the results"
        assert value == pytest.approx(entry["value"], rel=1e-3, abs=1e-3), entry
        assert ok == entry["pass"]


def test_each_gate_names_the_commit_its_figures_were_measured_on(summary):
    by_name = {g.name: g for g in gates.GATES}
    for entry in summary["gates"]:
        assert entry["commit"] == gates.provenance(summary, by_name[entry["name"]])["commit"]
        kind = subprocess.run(["git", "cat-file", "-t", entry["commit"]], cwd=ROOT,
                              capture_output=True, text=True)
        assert kind.stdout.strip() == "commit", entry


def test_the_docs_show_the_summary_s_figures():
    # docs/benchmarks.md's table is written from summary.json; an edit by hand, or a
    # summary committed without its table, shows here
    with open(gates.SUMMARY) as f:
        summary = json.load(f)
    with open(gates.DOCS) as f:
        docs = f.read()
    block = docs.split(gates.TABLE_BEGIN, 1)[1].split(gates.TABLE_END, 1)[0]
    assert block.strip() == gates.current_table(summary).strip()


@pytest.mark.parametrize("gate", gates.GATES, ids=lambda g: g.name)
def test_a_gate_fails_when_its_sides_are_swapped(summary, gate):
    """A gate passing both ways measures nothing; one failing on the honest run has shown
    it can fail already (and the run is red)."""
    honest = gate.measure(summary["results"])
    swapped = gate.measure(gates.swap_sides(summary["results"], gate))
    assert not math.isnan(swapped) and swapped != honest
    if isinstance(gate, (gates.PairedShare, gates.Share)):   # how much ours may lose
        assert honest < 1 < swapped, (gate.name, honest, swapped)
        return
    if isinstance(gate, gates.Inflation):      # the game's frames beside ours: never faster
        assert swapped < 1 <= honest, (gate.name, honest, swapped)
        return
    assert not (gate.passes(honest) and gate.passes(swapped)), (gate.name, honest, swapped)


def test_the_command_line_exits_non_zero_on_a_failure(summary, tmp_path):
    """The process `make bench` runs: the committed results reproduce the committed
    verdict; with a passing gate's sides swapped it prints FAIL for it and exits 1."""
    gate = next(g for g, _, ok in gates.evaluate(summary["results"]) if ok)
    honest = tmp_path / "honest.json"
    swapped = tmp_path / "swapped.json"
    honest.write_text(json.dumps(summary["results"]))
    swapped.write_text(json.dumps(gates.swap_sides(summary["results"], gate)))
    run = [sys.executable, "-m", "benchmarks.gates", "--no-summary"]
    ok = subprocess.run([*run, str(honest)], cwd=ROOT, capture_output=True, text=True)
    bad = subprocess.run([*run, str(swapped)], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == (0 if all(g["pass"] for g in summary["gates"]) else 1), ok.stdout
    assert bad.returncode == 1
    line = next(x for x in bad.stdout.splitlines() if x.startswith(f"GATE {gate.name} "))
    assert line.endswith(" FAIL"), line


def test_a_missing_side_is_a_failure_not_a_pass(summary):
    for gate in gates.GATES:
        kept = {"benchmarks": [b for b in summary["results"]["benchmarks"]
                               if b["extra_info"].get("suite")
                               != (gate.num if isinstance(gate, gates.Ratio)
                                   else gate.pick).where["suite"]]}
        value = gate.measure(kept)
        assert math.isnan(value), gate.name


def test_a_paired_ratio_is_the_median_of_the_pairs():
    gate = gates.PairedRatio("g", gates.Pick("a_s", suite="s", case="c"),
                             gates.Pick("b_s", suite="s", case="c"), 1.3)
    data = {"benchmarks": [{"name": "x", "stats": {"median": 1.0}, "extra_info": {
        "suite": "s", "case": "c", "a_s": [2.0, 3.0, 1.0, 10.0], "b_s": [1.0, 1.0, 1.0, 1.0]}}]}
    assert gate.measure(data) == 2.5                 # ratios 1, 2, 3, 10
    swapped = gates.swap_sides(data, gate)
    assert gate.measure(swapped) == pytest.approx((1 / 2 + 1 / 3) / 2)
    data["benchmarks"][0]["extra_info"]["b_s"] = [1.0, 1.0]
    assert math.isnan(gate.measure(data))           # unpaired rounds are no measurement


def test_rounds_alternate_their_order_from_pair_to_pair():
    from benchmarks.pairs import alternated
    order = []
    runs = {side: (lambda side=side: order.append(side) or 0.5) for side in ("a", "b")}
    assert alternated(runs, 3) == {"a": [0.5] * 3, "b": [0.5] * 3}
    assert order == ["a", "b", "b", "a", "a", "b"]
