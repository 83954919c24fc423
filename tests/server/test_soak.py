"""The soak, bounded: 45 s of the mixed, careless workload against a server with the real
SmolLM2, and the server back to its warmed-up idle footprint after (benchmarks/soak.py)."""
import io

import pytest

from benchmarks import soak

pytestmark = pytest.mark.model


def test_a_short_soak_returns_to_baseline():
    out = io.StringIO()
    report = soak.run(45, clients=6, margin_mb=40, out=out)
    print(out.getvalue())
    assert not report["problems"], out.getvalue()
    assert set(report["actions"]) == {"turn", "cancel", "tool_pause", "export_import", "garbage",
                                      "slow_reader", "disconnect"}, report["actions"]
    assert report["after"]["kv_cells"] == 0 and report["after"]["models"] == 0
