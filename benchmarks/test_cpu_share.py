"""Beside a busy game (benchmarks/cpu_share.py): the NPC's decode rate and the game's frames
when the server shares this machine's cores with it.

Gates (python -m benchmarks.gates):
  cpu_share_npc_rate_vs_fair     the NPC's decode rate beside the 2-thread uncapped game,
                                 over half its rate with no game (a fair share of the
                                 cores)                                             >= 0.6
  cpu_share_game_p99_inflation   the frame-capped 2-thread game's frame-time p99 beside the
                                 NPC streaming at throttle 0, over the same game's p99 alone
                                                                                    <= 1.3

Each runs the benchmark in a subprocess (about three minutes on 2 cores) with the server's
default settings; every load case is recorded in extra_info.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu_share") / "result.json"
    subprocess.run([sys.executable, "-m", "benchmarks.cpu_share", "--seconds", "10",
                    "--json", str(out)], cwd=ROOT, check=True)
    return json.loads(out.read_text())


def test_cpu_share(benchmark, shared):
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    benchmark.group = "cpu_share"
    idle = shared["idle"]
    benchmark.extra_info.update({
        "suite": "cpu_share", "case": "busy_game", "model": shared["model"],
        "idle_tokens_per_s": idle["tokens_per_s"],
        "fair_tokens_per_s": idle["tokens_per_s"] / 2,
        "busy2_tokens_per_s": shared["games"]["busy2"]["npc_beside_game"]["tokens_per_s"],
        "capped2_p99_alone_ms": shared["games"]["capped2"]["game_alone"]["p99_ms"],
        "capped2_p99_beside_ms": shared["games"]["capped2"]["game_beside_npc"]["p99_ms"],
        "idle": idle, "games": shared["games"]})
