"""Load generators for the transport benchmarks: raw sockets and one epoll loop, so the
client costs far less per frame than the server it measures (frames are split by the same
compiled FrameSplitter and never decoded on the hot path)."""
from __future__ import annotations

import collections
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import time

from tryll_fast import codec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUEST = codec.encode(codec.SetSessionLocaleRequest(request_id=7, locale="en-US"))


class ServerProcess:
    """A benchmark server in a subprocess (benchmarks.transport_server)."""

    def __init__(self, impl: str, direct_send: bool = True, *, models_dir: str | None = None,
                 settings: tuple[str, ...] = (), pipeline_config: str | None = None,
                 stderr=None) -> None:
        self.impl = impl
        extra = ["--models-dir", models_dir] if models_dir else []
        if pipeline_config:
            extra += ["--pipeline-config", pipeline_config]
        for item in settings:
            extra += ["--set", item]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.transport_server", "--impl", impl,
             "--direct-send", str(int(direct_send)), *extra],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True)
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"{impl} server did not start: {line!r}")
        self.port = int(line.split()[1])
        self.pipeline_port = 0
        if pipeline_config:
            line = self.proc.stdout.readline()
            if not line.startswith("PIPELINE "):
                self.proc.kill()
                raise RuntimeError(f"{impl} server's pipeline did not start: {line!r}")
            self.pipeline_port = int(line.split()[1])

    def close(self) -> None:
        try:
            self.proc.stdin.close()
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Client:
    """One connection with its session created; reads raw frames."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.splitter = codec.FrameSplitter()
        self.pending: collections.deque[bytes] = collections.deque()
        self.got = 0
        ready = codec.decode(self.next_frame()).body
        assert isinstance(ready, codec.ConnectionReady), ready
        self.sock.sendall(codec.encode(codec.CreateSessionRequest(request_id=1)))
        reply = codec.decode(self.next_frame()).body
        assert isinstance(reply, codec.CreateSessionResponse), reply
        self.sock.sendall(REQUEST)
        ack = codec.decode(self.next_frame()).body
        assert isinstance(ack, codec.Ack) and ack.request_id == 7, ack

    def next_frame(self) -> bytes:
        while not self.pending:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("server closed the connection")
            self.pending.extend(self.splitter.feed(data))
        return self.pending.popleft()

    def close(self) -> None:
        self.sock.close()


def connect(port: int, n: int) -> list[Client]:
    return [Client(port) for _ in range(n)]


def pipelined_round(clients: list[Client], per_conn: int, depth: int) -> int:
    """Every client keeps `depth` SetSessionLocale requests in flight until it has had
    `per_conn` replies; returns the number of replies."""
    batches = [REQUEST * k for k in range(depth + 1)]
    sel = selectors.DefaultSelector()
    to_send = {}
    for c in clients:
        first = min(depth, per_conn)
        c.sock.sendall(batches[first])
        to_send[c] = per_conn - first
        c.got = 0
        sel.register(c.sock, selectors.EVENT_READ, c)
    done = 0
    total = len(clients) * per_conn
    while done < total:
        for key, _ in sel.select():
            c = key.data
            n = len(c.splitter.feed(c.sock.recv(1 << 18)))
            c.got += n
            done += n
            k = min(n, to_send[c])
            if k:
                to_send[c] -= k
                c.sock.sendall(batches[k])
    sel.close()
    return done


def round_trips(clients: list[Client], count: int) -> list[float]:
    """One request in flight per client; returns every round-trip time in seconds."""
    sel = selectors.DefaultSelector()
    sent_at = {}
    left = {}
    for c in clients:
        sel.register(c.sock, selectors.EVENT_READ, c)
        left[c] = count
        sent_at[c] = time.perf_counter()
        c.sock.sendall(REQUEST)
    rtts: list[float] = []
    active = len(clients)
    while active:
        for key, _ in sel.select():
            c = key.data
            frames = c.splitter.feed(c.sock.recv(1 << 16))
            for _ in frames:
                now = time.perf_counter()
                rtts.append(now - sent_at[c])
                left[c] -= 1
                if left[c]:
                    sent_at[c] = time.perf_counter()
                    c.sock.sendall(REQUEST)
                else:
                    active -= 1
    sel.close()
    return rtts


def debug_stream(client: Client, frames: int) -> tuple[float, int]:
    """Ask for `frames` AnswerText frames; returns (seconds until the last, frames seen)."""
    client.sock.sendall(codec.encode(codec.DebugCommandRequest(
        request_id=99, command="stream", args=[str(frames), "token "])))
    t0 = time.perf_counter()
    seen = 0
    while True:
        payload = client.next_frame()
        if codec.peek_body_type(payload) == codec.MessageBody.DebugCommandResponse:
            elapsed = time.perf_counter() - t0
            out = json.loads(codec.decode(payload).body.output)
            assert out["frames"] == frames, out
            return elapsed, seen
        seen += 1


def cross_thread_latency(client: Client, count: int, interval_us: int) -> list[float]:
    """Latency in seconds of `count` frames a server producer thread sends one at a time,
    one every `interval_us` (debug `ping`).

    Both ends read CLOCK_MONOTONIC, one clock for every process on the machine: the
    producer writes time.monotonic_ns() into the frame just before it encodes and sends it,
    and the client takes the time as soon as recv() returns the bytes, before splitting or
    decoding them. So the figure is what the clock says about send call -> loop wake-up ->
    socket -> client, and nothing either server counts itself."""
    assert not client.pending, "frames left over from an earlier exchange"
    client.sock.sendall(codec.encode(codec.DebugCommandRequest(
        request_id=98, command="ping", args=[str(count), str(interval_us)])))
    recv = client.sock.recv
    feed = client.splitter.feed
    clock = time.monotonic_ns
    out_ns: list[int] = []
    while True:
        data = recv(1 << 16)
        now = clock()
        if not data:
            raise ConnectionError("server closed the connection")
        for payload in feed(data):
            msg = codec.decode(payload).body
            if isinstance(msg, codec.DebugCommandResponse):
                assert json.loads(msg.output)["frames"] == count, msg.output
                return [ns / 1e9 for ns in out_ns]
            out_ns.append(now - int(msg.text))


def percentiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=100)
    return {"p50_us": q[49] * 1e6, "p99_us": q[98] * 1e6, "n": len(values)}
