"""The benchmark baseline (asyncio + uvloop, benchmarks/uvloop_server.py) must be the same
server as ours with another transport, or comparing them means nothing: the same scenario
runs on both (the uvloop test-suite idea)."""
import json

import pytest

from tryll_fast import codec
from tryll_fast.errors import ErrorCode

from wire import Wire, start_server, wait_for


@pytest.fixture(params=["reactor", "uvloop"])
def server(request, tmp_path):
    cls = None
    if request.param == "uvloop":
        from benchmarks.uvloop_server import UvloopServer
        cls = UvloopServer
    srv = start_server(tmp_path, cls=cls)
    yield srv
    srv.shutdown(2)


def test_the_same_protocol_on_both(server):
    with Wire(server.address) as w:
        assert w.ready.protocol_version == 29
        w.expect_error(codec.ListModelsRequest(request_id=1), ErrorCode.SessionNotReady)
        w.create_session(locale="de")
        w.send_raw(b"".join(codec.encode(codec.SetSessionLocaleRequest(request_id=10 + i,
                                                                       locale="en"))
                            for i in range(50)))
        assert [w.recv().request_id for _ in range(50)] == list(range(10, 60))
        w.send(codec.DebugCommandRequest(request_id=2, command="stream", args=["5000", "t"]))
        frames = w.recv_until(codec.DebugCommandResponse)
        assert len(frames) == 5002 and json.loads(frames[-1].output)["frames"] == 5000
        err = w.expect_error(codec.DebugCommandRequest(request_id=3, command="repeat",
                                                       args=["x", str(1 << 21)]),
                             ErrorCode.FrameTooLarge)
        assert err.request_id == 3
        w.send_raw(b"\x00\x00\x00\x00")                   # a zero length: closed, no reply
        assert w.wait_closed()
    assert wait_for(lambda: not server.sessions)
