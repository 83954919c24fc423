"""`python -m benchmarks.share` (the game's side of the throttle, docs/benchmarks.md
"Sharing the device with the game"): a game process and an NPC process on this build,
briefly. The figures belong to the benchmark; here its two workers start, talk and report,
and the throttle reaches the NPCs' engine: it pauses after its steps at 0.9 and never at 0,
and the NPCs get fewer tokens a second for it."""
import io
import sys

import pytest

from benchmarks import share

pytestmark = pytest.mark.model


def test_the_game_and_the_npcs_share_the_device_at_two_throttles():
    out = io.StringIO()
    report = share.run_build("cpu", sys.executable, {"TRYLL_LLAMA_PLACEMENT": "ram"},
                             seconds=3.0, throttles=[0.0, 0.9], npcs=2, npc_tokens=8,
                             out=out)
    alone, full, throttled = report["phases"]
    assert [p["throttle"] for p in report["phases"]] == [None, 0.0, 0.9]
    assert all(p["frames"] >= 3 for p in report["phases"]), out.getvalue()
    assert alone["npc_tokens_per_s"] is None
    assert full["npc_throttle_pauses"] == 0 and throttled["npc_throttle_pauses"] > 0
    # at 0.9 the engine sleeps nine times its step's length after each step
    assert 0 < throttled["npc_tokens_per_s"] < full["npc_tokens_per_s"] / 2, out.getvalue()
    assert "throttle 0.9" in out.getvalue()
