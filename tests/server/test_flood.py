"""A million frames on one connection (benchmarks/flood.py): the lane's queue stays at its
cap, the peak stays within 200 MB of the idle size,
a healthy session's streamed turns complete during it and after it, and once everything closed the
process is back within 40 MB of idle with no KV cell, conversation or operation held. The
figures it prints are the ones in docs/benchmarks.md ("Floods").

It runs with `transport.refused_frame_cost=0`: most of the flood's frames are refused, and
at the default cost the server reads them ten times slower, so a million would take ten
minutes instead of a minute and a half. What is tested here (the caps, the memory bound, the
return to idle) does not depend on the rate; tests/server/test_session_caps.py tests the
cost itself, and `make flood` runs the default."""
import io

import pytest

from benchmarks import flood

pytestmark = pytest.mark.model


def test_a_million_frames_on_one_connection():
    out = io.StringIO()
    report = flood.run(1_000_000, peak_bound_mb=200, margin_mb=40, out=out,
                       settings=("transport.refused_frame_cost=0",))
    print(out.getvalue())
    assert not report["problems"], out.getvalue()
    assert report["flood"]["frames"] == 1_000_000 and not report["flood"]["closed"]
    assert report["lane_high_water"] <= flood.QUEUE_CAP
    assert report["first_token_flood_ms"]["n"] >= 1
    assert report["first_token_after_ms"]["n"] == 5       # the grown dialog, flood gone
    assert report["after"]["kv_cells"] == 0 and report["after"]["conversations"] == 0
