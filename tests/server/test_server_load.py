"""The server under load and abuse: many sessions, slow and vanishing clients, shutdown
with work in flight (fuzzed frames beside a healthy session: test_fuzz_server.py).
Bounded: every loop has a count and every wait a timeout."""
import json
import threading
import time

import pytest

from tryll_fast import codec
from tryll_fast.errors import ErrorCode

from wire import Wire, start_server, wait_for


def small_window_wire(address):
    return Wire(address, timeout=30, rcvbuf=4096)


@pytest.fixture
def server(tmp_path):
    srv = start_server(tmp_path, overrides=[
        "transport.send_queue_high_bytes=262144", "transport.send_queue_low_bytes=65536",
        "transport.stall_timeout_ms=30000", "shutdown.deadline_ms=5000"])
    yield srv
    srv.shutdown(2)


def stream_request(rid, count, text="token "):
    return codec.DebugCommandRequest(request_id=rid, command="stream", args=[str(count), text])


def round_trip(w, rid):
    reply = w.request(codec.DebugCommandRequest(request_id=rid, command="echo", args=[str(rid)]))
    assert reply.output == str(rid)


def test_200_concurrent_sessions(server):
    wires = [Wire(server.address) for _ in range(200)]
    try:
        for w in wires:
            w.send(codec.CreateSessionRequest(request_id=1))
        ids = set()
        for w in wires:
            reply = w.recv()
            assert isinstance(reply, codec.CreateSessionResponse)
            ids.add(reply.session_id)
        assert len(ids) == 200 and len(server.sessions) == 200
        # every session pipelines a few requests at once; each gets its own answers
        for i, w in enumerate(wires):
            w.send_raw(b"".join(codec.encode(codec.DebugCommandRequest(
                request_id=10 + k, command="echo", args=[f"{i}:{k}"])) for k in range(5)))
        for i, w in enumerate(wires):
            outs = [w.recv() for _ in range(5)]
            assert [o.output for o in outs] == [f"{i}:{k}" for k in range(5)]
            assert [o.request_id for o in outs] == [10 + k for k in range(5)]
    finally:
        for w in wires:
            w.close()
    assert wait_for(lambda: len(server.sessions) == 0 and len(server.connections) == 0)
    assert wait_for(lambda: server.teardowns >= 200)


def test_a_client_that_stops_reading_pauses_its_stream_only(server):
    slow = small_window_wire(server.address)
    slow.create_session()
    fast = Wire(server.address)
    fast.create_session()
    slow.send(stream_request(5, 50_000, "x" * 200))        # ~12 MB, far above the cap
    session = next(s for s in server.connections if s.conn.peer.endswith(
        str(slow.sock.getsockname()[1])))
    assert wait_for(lambda: session.conn.paused, timeout=10)
    queued = session.conn.queued_bytes
    time.sleep(0.5)
    # the producer waits: the queue does not grow past the cap by more than a frame
    assert session.conn.queued_bytes <= max(queued, 262144) + 300
    assert session.conn.paused
    # another session is unaffected while this one is paused
    for rid in range(20):
        round_trip(fast, 100 + rid)
    # now read everything: every frame arrives, in order, nothing lost
    frames = slow.recv_until(codec.DebugCommandResponse, timeout=60)
    texts = [f for f in frames if isinstance(f, codec.AnswerText)]
    assert len(texts) == 50_001 and texts[-1].is_final and texts[-1].text == ""
    assert all(t.text == "x" * 200 for t in texts[:-1])
    out = json.loads(frames[-1].output)
    assert out == {"frames": 50_000, "seconds": out["seconds"], "cancelled": False}
    assert server.reactor.pauses >= 1
    slow.close()
    fast.close()


def test_stall_timeout_closes_the_connection_and_destroys_the_session(tmp_path):
    srv = start_server(tmp_path, overrides=[
        "transport.send_queue_high_bytes=131072", "transport.send_queue_low_bytes=32768",
        "transport.stall_timeout_ms=500"])
    try:
        slow = small_window_wire(srv.address)
        sid = slow.create_session()
        other = Wire(srv.address)
        other.create_session()
        slow.send(stream_request(5, 100_000, "y" * 100))
        assert wait_for(lambda: sid not in srv.sessions, timeout=10)
        assert srv.reactor.stalls == 1
        assert wait_for(lambda: srv.operation_count == 0, timeout=10)   # the stream ended
        round_trip(other, 7)
        slow.close()
        other.close()
    finally:
        srv.shutdown(1)


def test_abrupt_disconnect_mid_stream_frees_everything(server):
    w = small_window_wire(server.address)
    sid = w.create_session()
    w.send(codec.SetInferenceThrottle(throttle=0.5))
    w.send(stream_request(5, 200_000, "z" * 50))
    assert wait_for(lambda: server.operation_count == 1)
    session = server.sessions[sid]
    assert session.owned()["streams"] == 1 and session.owned()["throttle"] == 1
    before = server.teardowns
    w.reset()
    assert wait_for(lambda: server.teardowns == before + 1, timeout=10)
    assert wait_for(lambda: server.operation_count == 0, timeout=10)
    assert session.owned() == {"operations": 0, "downloads": 0, "streams": 0, "turns": 0,
                               "agents": 0, "pins": 0, "voice_inputs": 0,
                               "string_storages": 0, "embedded_string_storages": 0,
                               "mutable_kbs": 0,
                               "resume_callbacks": 0, "throttle": 0}
    assert sid not in server.sessions and server.throttle.effective == 0.0
    with Wire(server.address) as w2:
        w2.create_session()
        round_trip(w2, 3)


def test_shutdown_lets_running_work_finish_and_refuses_new_requests(tmp_path):
    srv = start_server(tmp_path, overrides=[
        "shutdown.deadline_ms=20000", "transport.send_queue_high_bytes=262144",
        "transport.send_queue_low_bytes=65536"])
    slow = small_window_wire(srv.address)
    slow.create_session()
    other = Wire(srv.address)
    other.create_session()
    slow.send(stream_request(5, 30_000, "w" * 100))       # paused: it waits for the reader
    assert wait_for(lambda: srv.operation_count == 1)
    address = srv.address
    result = {}
    t = threading.Thread(target=lambda: result.update(srv.shutdown()))
    t.start()
    assert wait_for(lambda: srv.shutting_down)
    err = other.expect_error(codec.ListModelsRequest(request_id=44), ErrorCode.ServerShuttingDown)
    assert err.request_id == 44
    other.send(codec.SetInferenceThrottle(throttle=0.2))   # still silently accepted
    with pytest.raises(OSError):
        for _ in range(20):   # the listener is closed: new connections are refused
            Wire(address, timeout=2).close()
            time.sleep(0.05)
    # the running stream finishes once the client reads, inside the deadline
    frames = slow.recv_until(codec.DebugCommandResponse, timeout=30)
    assert json.loads(frames[-1].output)["cancelled"] is False
    assert len(frames) == 30_002
    t.join(30)
    assert result["cancelled"] == 0 and result["finished_in_time"] == 1
    assert slow.wait_closed() and other.wait_closed()


def test_shutdown_cancels_work_that_outlives_the_deadline(tmp_path):
    srv = start_server(tmp_path, overrides=[
        "shutdown.deadline_ms=300", "transport.send_queue_high_bytes=262144",
        "transport.send_queue_low_bytes=65536"])
    slow = small_window_wire(srv.address)
    slow.create_session()
    slow.send(stream_request(5, 1_000_000, "v" * 100))   # never read: cannot finish
    assert wait_for(lambda: srv.operation_count == 1)
    # the stream can never finish: shutdown() returns only because its deadline fired
    result = srv.shutdown()
    assert result["cancelled"] == 1 and result["finished_in_time"] == 0
    assert srv.operation_count == 0
