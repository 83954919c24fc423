"""The epoll reactor over real sockets: framing, write batching, cross-thread sends,
backpressure, stalls, closes. A tiny echo receiver stands in for the server layer."""
import socket
import struct
import threading
import time

import pytest

from tryll_fast.transport import MAX_FRAME, Reactor

from wire import wait_for


def frame(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + payload


class Echo:
    """Echoes each frame; records what happened."""

    def __init__(self, conn, log):
        self.conn = conn
        self.log = log
        self.frames = []

    def frame_received(self, payload):
        self.frames.append(payload)
        if payload.startswith(b"flood:"):
            n = int(payload[6:])
            for i in range(n):
                self.conn.send(frame(b"%08d" % i + b"x" * 1000))
        else:
            self.conn.send(frame(payload))

    def connection_lost(self, reason):
        self.log.append(("lost", self.conn.id, reason))

    def writing_resumed(self):
        self.log.append(("resumed", self.conn.id))


class Harness:
    def __init__(self, **kw):
        self.log = []
        self.receivers = []
        sock = socket.create_server(("127.0.0.1", 0))
        self.reactor = Reactor(sock, self, **kw)
        self.thread = threading.Thread(target=self.reactor.run, daemon=True)
        self.thread.start()
        self.address = self.reactor.address

    def connection_made(self, conn):
        r = Echo(conn, self.log)
        self.receivers.append(r)
        return r

    def client(self, rcvbuf=None):
        """A connected client; rcvbuf (set before connecting) keeps the TCP window small,
        so a client that does not read fills the server's queue quickly."""
        before = len(self.receivers)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        s.settimeout(10)
        s.connect(self.address)
        assert wait_for(lambda: len(self.receivers) > before)
        return s

    def stop(self):
        self.reactor.stop()
        self.thread.join(10)
        assert not self.thread.is_alive()


@pytest.fixture
def h():
    harness = Harness()
    yield harness
    harness.stop()


def read_frames(sock, n, timeout=10):
    sock.settimeout(timeout)
    buf = b""
    out = []
    while len(out) < n:
        data = sock.recv(1 << 20)
        if not data:
            raise EOFError(f"closed after {len(out)} frames")
        buf += data
        while len(buf) >= 4:
            ln = struct.unpack_from("<I", buf)[0]
            if len(buf) < 4 + ln:
                break
            out.append(buf[4:4 + ln])
            buf = buf[4 + ln:]
    assert buf == b""
    return out


def closed_without_data(sock, timeout=5):
    sock.settimeout(timeout)
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


def test_frames_split_at_every_byte_arrive_whole(h):
    s = h.client()
    data = frame(b"hello") + frame(b"x" * 3000) + frame(b"!")
    for i in range(len(data)):
        s.send(data[i:i + 1])
    assert read_frames(s, 3) == [b"hello", b"x" * 3000, b"!"]


def test_replies_to_pipelined_frames_share_one_sendmsg(h):
    s = h.client()
    before = h.reactor.sendmsg_calls
    s.sendall(b"".join(frame(b"%d" % i) for i in range(100)))
    assert read_frames(s, 100) == [b"%d" % i for i in range(100)]
    assert h.reactor.sendmsg_calls - before < 10


@pytest.mark.parametrize("length", [0, MAX_FRAME + 1, 0xFFFFFFFF])
def test_bad_length_closes_at_once_and_sends_nothing(h, length):
    s = h.client()
    s.sendall(frame(b"ok"))
    assert read_frames(s, 1) == [b"ok"]
    s.sendall(struct.pack("<I", length) + b"junk" * 4)
    assert closed_without_data(s)
    assert wait_for(lambda: any(e[0] == "lost" and "framing error" in e[2] for e in h.log))
    assert h.reactor.framing_errors == 1


def test_largest_frame_is_accepted(h):
    s = h.client()
    payload = bytes(range(256)) * (MAX_FRAME // 256)
    assert len(payload) == MAX_FRAME
    s.sendall(frame(payload))
    assert read_frames(s, 1, timeout=20) == [payload]


def test_cross_thread_sends_keep_each_threads_order(h):
    s = h.client()
    conn = h.receivers[0].conn
    n = 3000

    def produce(tag):
        for i in range(n):
            assert conn.send(frame(b"%s%06d" % (tag, i)))

    threads = [threading.Thread(target=produce, args=(t,)) for t in (b"A", b"B")]
    for t in threads:
        t.start()
    s.sendall(b"".join(frame(b"R%06d" % i) for i in range(200)))   # inline replies too
    for t in threads:
        t.join()
    got = read_frames(s, 2 * n + 200)
    for tag, count in ((b"A", n), (b"B", n), (b"R", 200)):
        seq = [int(f[1:]) for f in got if f[:1] == tag]
        assert seq == list(range(count))


@pytest.mark.parametrize("direct", [True, False])
def test_eventfd_and_direct_paths_deliver_everything(direct):
    h = Harness(direct_send=direct)
    try:
        s = h.client()
        conn = h.receivers[0].conn
        for i in range(500):
            conn.send(frame(b"%d" % i))
            if i % 50 == 0:
                time.sleep(0.001)
        assert read_frames(s, 500) == [b"%d" % i for i in range(500)]
        if not direct:
            assert h.reactor.direct_writes == 0 and h.reactor.wakeups > 0
    finally:
        h.stop()


def test_backpressure_pauses_then_resumes_without_loss():
    h = Harness(high_water=256 * 1024, low_water=64 * 1024, stall_timeout=30)
    try:
        slow = h.client(rcvbuf=4096)
        conn = h.receivers[0].conn
        other = socket.create_connection(h.address, timeout=10)
        slow.sendall(frame(b"flood:10000"))          # ~10 MB of replies, not read yet
        assert wait_for(lambda: conn.paused)
        assert conn.queued_bytes >= 256 * 1024
        assert not conn.wait_writable(0.05)
        # paused: further requests on that connection are not read...
        slow.sendall(frame(b"after"))
        time.sleep(0.2)
        assert b"after" not in h.receivers[0].frames
        # ...while another connection is served normally
        other.sendall(frame(b"ping"))
        assert read_frames(other, 1) == [b"ping"]
        got = read_frames(slow, 10001, timeout=60)
        assert [int(f[:8]) for f in got[:10000]] == list(range(10000))
        assert got[10000] == b"after"
        assert ("resumed", conn.id) in h.log
        assert not conn.paused and conn.wait_writable(0)
    finally:
        h.stop()


def test_stalled_connection_is_closed_and_others_live_on():
    h = Harness(high_water=128 * 1024, low_water=32 * 1024, stall_timeout=0.5)
    try:
        slow = h.client(rcvbuf=4096)
        slow.sendall(frame(b"flood:10000"))
        other = socket.create_connection(h.address, timeout=10)
        assert wait_for(lambda: any(e[0] == "lost" and e[2].startswith("stalled") for e in h.log),
                        timeout=10)
        assert h.reactor.stalls == 1
        other.sendall(frame(b"still here"))
        assert read_frames(other, 1) == [b"still here"]
    finally:
        h.stop()


def test_abrupt_disconnect_with_frames_queued(h):
    s = h.client(rcvbuf=4096)
    s.sendall(frame(b"flood:5000"))
    time.sleep(0.1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    assert wait_for(lambda: any(e[0] == "lost" for e in h.log))
    other = socket.create_connection(h.address, timeout=10)
    other.sendall(frame(b"fine"))
    assert read_frames(other, 1) == [b"fine"]
    assert h.reactor.connection_count == 1


def test_graceful_close_writes_queued_frames_first(h):
    s = h.client()
    conn = h.receivers[0].conn
    for i in range(200):
        conn.send(frame(b"%d" % i + b"y" * 5000))
    conn.close()
    assert not conn.send(frame(b"late"))          # refused once closing
    got = read_frames(s, 200)
    assert [int(f.rstrip(b"y")) for f in got] == list(range(200))
    assert closed_without_data(s)


def test_send_after_close_returns_false(h):
    s = h.client()
    conn = h.receivers[0].conn
    s.close()
    assert wait_for(lambda: conn.closed)
    assert conn.send(frame(b"x")) is False
    with pytest.raises(TypeError):
        conn.send(bytearray(b"x"))


def test_max_connections_refuses_the_extra_one():
    h = Harness(max_connections=2)
    try:
        a = h.client()
        b = socket.create_connection(h.address, timeout=10)
        assert wait_for(lambda: h.reactor.connection_count == 2)
        c = socket.create_connection(h.address, timeout=10)
        assert closed_without_data(c)
        assert h.reactor.rejected == 1
        a.sendall(frame(b"a"))
        assert read_frames(a, 1) == [b"a"]
        b.close()
    finally:
        h.stop()


def test_stop_closes_every_connection():
    h = Harness()
    socks = [socket.create_connection(h.address, timeout=10) for _ in range(5)]
    assert wait_for(lambda: h.reactor.connection_count == 5)
    h.stop()
    assert all(closed_without_data(s) for s in socks)
    assert sum(1 for e in h.log if e[0] == "lost") == 5
    with pytest.raises(OSError):
        socket.create_connection(h.address, timeout=2)


def test_bad_settings_are_refused():
    sock = socket.create_server(("127.0.0.1", 0))
    with pytest.raises(ValueError, match="low_water"):
        Reactor(sock, object(), high_water=10, low_water=20)
    with pytest.raises(ValueError, match="stall_timeout"):
        Reactor(sock, object(), stall_timeout=0)
    sock.close()


class Timed(Echo):
    """Records when each frame arrived, and echoes it."""

    def frame_received(self, payload):
        self.log.append(("frame", time.monotonic(), payload))
        self.conn.send(frame(payload))


def test_a_connection_past_its_frame_budget_is_read_later_and_loses_nothing():
    rate = 2000
    h = Harness(max_frames_per_second=rate)
    h.connection_made = lambda conn: h.receivers.append(Timed(conn, h.log)) or h.receivers[-1]
    try:
        s = h.client()
        other = h.client()
        n = 3 * rate
        t0 = time.monotonic()
        s.sendall(b"".join(frame(b"%06d" % i) for i in range(n)))
        # another connection's frames are read at once, whatever the flooder's budget
        other.sendall(frame(b"other"))
        assert read_frames(other, 1) == [b"other"]
        got = read_frames(s, n, timeout=30)
        assert got == [b"%06d" % i for i in range(n)]                # all, in order
        times = [t for kind, t, p in (e for e in h.log if e[0] == "frame") if p != b"other"]
        assert len(times) == n and h.reactor.throttles > 0
        # never faster than the bucket allows: one second's worth at once, then `rate`/s
        for k in range(rate + 100, n, 250):
            assert times[k] - t0 >= (k - rate) / rate - 0.01, (k, times[k] - t0)
    finally:
        h.stop()


class Charging(Timed):
    """Charges its connection for every frame that starts with b"bad" (as the session
    does for a request it refuses), and 1e9 frames for b"huge"."""

    def frame_received(self, payload):
        if payload.startswith(b"bad"):
            self.conn.charge(9.0)
        elif payload == b"huge":
            self.conn.charge(1e9)
        super().frame_received(payload)


def charging_harness(rate):
    h = Harness(max_frames_per_second=rate)
    h.connection_made = lambda conn: h.receivers.append(Charging(conn, h.log)) or \
        h.receivers[-1]
    return h


def arrivals(h, prefix):
    return [t for kind, t, p in (e for e in h.log if e[0] == "frame") if p.startswith(prefix)]


def test_charged_frames_are_read_at_a_fraction_of_the_budget_and_none_is_lost():
    rate = 2000
    h = charging_harness(rate)
    try:
        s = h.client()
        n = 400                         # 9 + 1 frames' worth each: 4000 of the budget
        t0 = time.monotonic()
        s.sendall(b"".join(frame(b"bad%04d" % i) for i in range(n)))
        assert read_frames(s, n, timeout=30) == [b"bad%04d" % i for i in range(n)]
        times = arrivals(h, b"bad")
        # one second's worth at once (200 of them), then rate / 10 a second
        for k in range(220, n, 20):
            assert times[k] - t0 >= (10 * k - rate) / rate - 0.01, (k, times[k] - t0)
        # a connection that is not charged keeps the whole budget: its 400 frames fit in
        # one second's worth, so the reactor never stops reading it (no debt carried over)
        honest = h.client()
        throttled = h.reactor.throttles
        honest.sendall(b"".join(frame(b"ok%04d" % i) for i in range(n)))
        assert len(read_frames(honest, n, timeout=30)) == n
        assert h.reactor.throttles == throttled
    finally:
        h.stop()


def test_a_connection_debt_stops_at_one_second_of_budget():
    h = charging_harness(1000)
    try:
        s = h.client()
        s.sendall(frame(b"huge") + frame(b"after"))
        # 1e9 frames at 1000 a second would be 11 days: the debt is capped at 1000
        assert read_frames(s, 2, timeout=10) == [b"huge", b"after"]
    finally:
        h.stop()


def test_charging_without_a_budget_changes_nothing(h):
    h.connection_made = lambda conn: h.receivers.append(Charging(conn, h.log)) or \
        h.receivers[-1]
    s = h.client()
    s.sendall(b"".join(frame(b"bad%d" % i) for i in range(5000)))
    assert len(read_frames(s, 5000, timeout=30)) == 5000
    assert h.reactor.throttles == 0


def test_no_frame_budget_means_no_throttling(h):
    s = h.client()
    s.sendall(b"".join(frame(b"%d" % i) for i in range(30_000)))
    assert len(read_frames(s, 30_000, timeout=30)) == 30_000
    assert h.reactor.throttles == 0 and h.reactor.max_frames_per_second == 0


def test_a_negative_frame_budget_is_refused():
    sock = socket.create_server(("127.0.0.1", 0))
    with pytest.raises(ValueError, match="max_frames_per_second"):
        Reactor(sock, object(), max_frames_per_second=-1)
    sock.close()
