"""The live server under structure-aware fuzzing (fuzz/server.py), bounded: mutated frames
of every client request type on throwaway connections, beside a session taking real turns
with SmolLM2. `make fuzz-server` runs the same campaign for longer."""
import io
import random

import pytest

from fuzz import server as fuzz_server
from tryll_fast import codec
from tryll_fast.server.dispatch import CLIENT_MESSAGES

pytestmark = [pytest.mark.model, pytest.mark.fuzz]

FRAMES = 40000         # a count, not a duration: the same campaign on any machine


def test_every_request_type_is_fuzzed_and_the_server_stays_well():
    out = io.StringIO()
    report = fuzz_server.run(FRAMES, connections=3, seed=20261203, out=out)
    print(out.getvalue())
    assert not report["problems"], out.getvalue()
    assert report["frames"] == FRAMES and report["fatal"] > 0
    assert set(report["types"]) == set(CLIENT_MESSAGES)
    assert report["healthy_turns"] >= 2           # one before, one after the fuzzing
    # the values reached the handlers, not only the verifier: more than the codec's and
    # the session's errors came back
    assert report["replies"].get("error 5001", 0) > 0
    assert len([k for k in report["replies"] if k.startswith("error")]) > 10, report["replies"]
    assert any(not k.startswith("error") for k in report["replies"])


def test_the_examples_cover_every_request_type_and_all_encode():
    rng = random.Random(3)
    for name in CLIENT_MESSAGES:
        for _ in range(20):
            payload = fuzz_server.encode(fuzz_server.example(name, rng))
            assert payload is not None, name
            assert type(codec.decode(payload).body).__name__ == name
