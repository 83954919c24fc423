"""`python -m benchmarks.share` (the game's side of the throttle, docs/benchmarks.md
"Sharing the device with the game"): a game process and an NPC process on this build,
briefly. The figures belong to the benchmark; here its two workers start, talk and report,
and the throttle reaches the NPCs' engine: at 0.9 every decode step of the phase is
followed by a pause, at 0 none is. How fast either side ran is the benchmark's to say."""
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
    assert full["npc_steps"] > 0 and full["npc_throttle_pauses"] == 0, out.getvalue()
    # at 0.9 the engine sleeps nine times its step's length after each step
    assert 0 < throttled["npc_steps"] == throttled["npc_throttle_pauses"], out.getvalue()
    assert throttled["npc_tokens_per_s"] > 0
    assert "throttle 0.9" in out.getvalue()
