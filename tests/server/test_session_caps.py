"""Bounded work per session: past a cap a request gets 2008 SessionLimitReached with its
request_id and a message naming the cap; the connection stays up and nothing already
accepted is lost. No model needed."""
from __future__ import annotations

import threading

from tryll_fast import codec
from tryll_fast.errors import ErrorCode

from wire import Wire, start_server


def test_requests_queued_behind_the_lane_are_capped_and_none_accepted_is_lost(tmp_path):
    cap = 8
    srv = start_server(tmp_path, overrides=[f"session.max_queued_requests={cap}",
                                            "workers.threads=1"])
    release = threading.Event()
    try:
        with Wire(srv.address) as w:
            w.create_session()
            # the only worker thread is busy, so every lane job waits in the queue
            busy = srv.workers.submit(release.wait, 30)
            rids = [w.rid() for _ in range(cap + 5)]
            w.send_raw(b"".join(codec.encode(codec.CreateStringStorageRequest(
                request_id=rid, name=f"s{rid}", strings=["x"])) for rid in rids))
            refused = {}
            for _ in range(5):                      # the refusals come at once
                reply = w.recv()
                assert isinstance(reply, codec.ErrorResponse), reply
                refused[reply.request_id] = reply
            assert sorted(refused) == rids[cap:]
            for reply in refused.values():
                assert reply.code == ErrorCode.SessionLimitReached
                assert f"session.max_queued_requests allows ({cap})" in reply.message
            release.set()
            busy.result(10)
            accepted = [w.recv() for _ in range(cap)]
            assert [r.request_id for r in accepted] == rids[:cap]       # in order
            assert all(isinstance(r, codec.CreateStringStorageResponse) for r in accepted)
            # the connection is fine, and the refused names were never created
            again = w.request(codec.CreateStringStorageRequest(
                request_id=w.rid(), name=f"s{rids[-1]}", strings=["y"]))
            assert isinstance(again, codec.CreateStringStorageResponse), again
    finally:
        release.set()
        srv.shutdown(10)
