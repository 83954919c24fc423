"""The pipeline transport against the TCP protocol, in one server process with the real
SmolLM2: the same graph (one greedy Generate node), the same messages, each side a real
client over a real socket, one thread each (our own Client for TCP, the `websockets`
library's protocol for WebSocket), rounds alternating which side goes first.

Gates (python -m benchmarks.gates):
  pipeline_first_token_overhead_ms  p50 over WebSocket (JSON) turns of (message about to be
                                    sent -> first token element received, minus the turn's
                                    own time from the engine request's submit to its first
                                    text handed to the connection, from its diagnostics),
                                    minus the same p50 over TCP: what the pipeline adds to
                                    the first token, with the engine's part (which the
                                    detokenizer makes one step longer when it holds the
                                    first token back) taken out of both. One long-lived
                                    agent a side: a session's first turn costs more
                                    (its lane starts) on either front door             <= 3
  pipeline_stream_vs_tcp            20 000 streamed tokens from the server's dev-mode debug
                                    stream (one producer thread, as fast as the connection
                                    takes them; the same code for both), all of their text
                                    received and decoded by the client: the time over TCP
                                    divided by the time over WebSocket (MSGPACK), median
                                    of paired rounds                                  >= 0.5
A model's tokens come far slower than either side can carry them (a few hundred a
second), so the stream is measured with a producer that is not the bottleneck: what is
measured is the transport, the element codec and the client.
"""
import collections
import json
import os
import socket
import statistics
import tempfile
import time

import msgpack
import pytest
from websockets.client import ClientProtocol
from websockets.protocol import CONNECTING
from websockets.uri import parse_uri

from benchmarks.test_workflow_bench import (
    MODELS_DIR, QUESTIONS, SETTINGS, SMOL, SYSTEM, _p99,
)
from benchmarks.transport_load import Client, ServerProcess
from tryll_fast import codec
from tryll_fast.models import ensure_model

FIRST_MAX_TOKENS = 32
STREAM_TOKENS = 20_000
TOKEN = "token "
FIRST_PAIRS = 24
STREAM_PAIRS = 15
CONFIG = f'''
[agents.baker]
default_model = "{SMOL}"
enable_diagnostics = true
[agents.baker.nodes.answer]
type = "Generate"
system_prompt = "{SYSTEM}"
sampling = {{ temperature = 0.0, max_tokens = {FIRST_MAX_TOKENS} }}
'''


@pytest.fixture(scope="module")
def server():
    ensure_model(SMOL, MODELS_DIR)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pipeline.toml")
        with open(path, "w") as f:
            f.write(CONFIG)
        proc = ServerProcess("reactor", models_dir=MODELS_DIR, settings=SETTINGS,
                             pipeline_config=path)
        yield proc
        proc.close()


def tcp_agent(c: Client, max_tokens: int, diagnostics: bool) -> int:
    sampling = codec.SamplingOverrides(temperature=0, max_tokens=max_tokens)
    c.sock.sendall(codec.encode(codec.CreateAgentRequest(
        request_id=2, graph=codec.GraphDescription(
            nodes=[codec.NodeDescription(name="answer", params=codec.GenerateParams(
                system_prompt=SYSTEM, sampling=sampling))], start_node="answer"),
        default_model_name=SMOL, enable_diagnostics=diagnostics)))
    reply = codec.decode(c.next_frame()).body
    assert isinstance(reply, codec.CreateAgentResponse), reply
    return reply.agent_id


def tcp_turn(c: Client, agent_id: int, text: str) -> tuple[float, float, object]:
    """(s to the first AnswerText, s to the last one, TurnComplete)."""
    frame = codec.encode(codec.SendMessageRequest(request_id=3, agent_id=agent_id, text=text))
    t0 = time.perf_counter()
    c.sock.sendall(frame)
    first = last = None
    while True:
        body = codec.decode(c.next_frame()).body
        if isinstance(body, codec.AnswerText) and body.text:
            last = time.perf_counter() - t0
            if first is None:
                first = last
        elif isinstance(body, codec.TurnComplete):
            assert body.status == codec.TurnStatus.Success, body
            return first, last, body


def tcp_destroy(c: Client, agent_id: int) -> None:
    c.sock.sendall(codec.encode(codec.DestroyAgentRequest(request_id=4, agent_id=agent_id)))
    assert isinstance(codec.decode(c.next_frame()).body, codec.Ack)


class WsClient:
    """A pipeline connection to one agent, ready for turns: the `websockets` library's
    sans-I/O protocol over a blocking socket, one thread, as the TCP client is (its
    threaded client hands every message from a reader thread to the caller's)."""

    def __init__(self, port: int, agent: str, fmt: str) -> None:
        self.fmt = fmt
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(120)
        self.protocol = ClientProtocol(parse_uri(
            f"ws://127.0.0.1:{port}/pipeline?agent={agent}&inputFormat=JSON"
            f"&outputFormat={fmt}"), max_size=None)
        self.protocol.send_request(self.protocol.connect())
        self._flush()
        self.pending: collections.deque = collections.deque()
        while self.protocol.handshake_exc is None and self.protocol.state == CONNECTING:
            self.protocol.receive_data(self.sock.recv(1 << 16))
        events = self.protocol.events_received()         # the response, maybe frames too
        self.pending.extend(e.data for e in events[1:])
        while self.recv()[0] != "ready":
            pass

    def _flush(self) -> None:
        for data in self.protocol.data_to_send():
            self.sock.sendall(data)

    def send(self, text: str) -> None:
        self.protocol.send_text(text.encode())
        self._flush()

    def recv(self) -> tuple[str, dict]:
        """(a token's kind or a command's name, the element's fields)."""
        while not self.pending:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the pipeline closed the connection")
            self.protocol.receive_data(data)
            self.pending.extend(f.data for f in self.protocol.events_received())
            self._flush()                                  # pongs
        data = self.pending.popleft()
        if self.fmt == "MSGPACK":
            [(kind, fields)] = msgpack.unpackb(data).items()
        else:
            fields = json.loads(data)
            kind = fields["type"]
        if kind == "command":
            return fields["name"], fields
        assert kind == "token", (kind, fields)
        return kind, fields

    def turn(self, text: str) -> tuple[float, float, dict]:
        """(s to the first token element, s to the last one, turnComplete's parameters)."""
        token = json.dumps({"type": "token", "text": text})
        commit = json.dumps({"type": "commit"})
        t0 = time.perf_counter()
        self.send(token)
        self.send(commit)
        first = last = None
        while True:
            kind, fields = self.recv()
            if kind == "token":
                last = time.perf_counter() - t0
                if first is None:
                    first = last
            elif kind == "turnComplete":
                assert fields["parameters"]["status"] == "Success", fields
                return first, last, fields["parameters"]

    def close(self) -> None:
        self.protocol.send_close()
        try:
            self._flush()
        finally:
            self.sock.close()


def _server_first_s(debug_info) -> float:
    """The turn's own clock: its first text handed to the connection, from the engine
    request's submit."""
    info = json.loads(debug_info) if isinstance(debug_info, str) else debug_info
    return info["nodes"][0]["timings_ms"]["first_text"] / 1000


def test_pipeline_first_token(benchmark, server):
    """One long-lived agent a side (a TCP session's, a pipeline connection's), the same
    graph and the same messages, so both dialogs stay identical turn after turn."""
    tcp = Client(server.port)
    aid = tcp_agent(tcp, FIRST_MAX_TOKENS, True)
    ws = WsClient(server.pipeline_port, "baker", "JSON")

    def one_tcp(q: str) -> float:
        first, _, done = tcp_turn(tcp, aid, q)
        return first - _server_first_s(done.debug_info)

    def one_ws(q: str) -> float:
        first, _, params = ws.turn(q)
        return first - _server_first_s(params["diagnostics"])

    def pairs(n: int, offset: int) -> tuple[list[float], list[float]]:
        tcp_over, ws_over = [], []
        for i in range(n):
            q = QUESTIONS[(offset + i) % len(QUESTIONS)]
            if i % 2:
                ws_over.append(one_ws(q))
                tcp_over.append(one_tcp(q))
            else:
                tcp_over.append(one_tcp(q))
                ws_over.append(one_ws(q))
        return tcp_over, ws_over

    try:
        pairs(2, 0)                                        # warm: model loaded, caches hot
        tcp_over, ws_over = benchmark.pedantic(pairs, args=(FIRST_PAIRS, 2), rounds=1,
                                               iterations=1)
    finally:
        ws.close()
        tcp.close()
    tcp_ms = [x * 1000 for x in tcp_over]
    ws_ms = [x * 1000 for x in ws_over]
    benchmark.group = "pipeline"
    benchmark.extra_info.update(
        suite="pipeline", case="first_token", pairs=FIRST_PAIRS,
        tcp_overhead_ms_p50=statistics.median(tcp_ms), tcp_overhead_ms_p99=_p99(tcp_ms),
        ws_overhead_ms_p50=statistics.median(ws_ms), ws_overhead_ms_p99=_p99(ws_ms),
        ws_minus_tcp_first_token_ms=statistics.median(ws_ms) - statistics.median(tcp_ms),
        tcp_overhead_ms=tcp_ms, ws_overhead_ms=ws_ms)


def test_pipeline_stream(benchmark, server):
    """The dev-mode debug stream (the server's own producer thread, as fast as the
    connection takes it) onto a TCP connection and onto a pipeline connection: the same
    code sends the same AnswerText frames to both; the clients decode every one."""
    tcp = Client(server.port)
    ws = WsClient(server.pipeline_port, "baker", "MSGPACK")
    action = json.dumps({"type": "action", "name": "debug", "parameters": {
        "command": "stream", "args": [STREAM_TOKENS, TOKEN]}})

    def one_tcp() -> float:
        t0 = time.perf_counter()
        tcp.sock.sendall(codec.encode(codec.DebugCommandRequest(
            request_id=9, command="stream", args=[str(STREAM_TOKENS), TOKEN])))
        got = 0
        while True:
            body = codec.decode(tcp.next_frame()).body
            if isinstance(body, codec.AnswerText):
                got += len(body.text) // len(TOKEN)
            elif isinstance(body, codec.DebugCommandResponse):
                break
        assert got == STREAM_TOKENS, got
        return time.perf_counter() - t0

    def one_ws() -> float:
        t0 = time.perf_counter()
        ws.send(action)
        got = 0
        while True:
            kind, fields = ws.recv()
            if kind == "token":                         # queued tokens come coalesced
                got += len(fields["text"]) // len(TOKEN)
            elif kind == "debug":
                break
        assert got == STREAM_TOKENS, got
        return time.perf_counter() - t0

    def pairs(n: int) -> tuple[list[float], list[float]]:
        tcp_s, ws_s = [], []
        for i in range(n):
            if i % 2:
                ws_s.append(one_ws())
                tcp_s.append(one_tcp())
            else:
                tcp_s.append(one_tcp())
                ws_s.append(one_ws())
        return tcp_s, ws_s

    try:
        pairs(1)
        tcp_s, ws_s = benchmark.pedantic(pairs, args=(STREAM_PAIRS,), rounds=1, iterations=1)
    finally:
        ws.close()
        tcp.close()
    benchmark.group = "pipeline"
    benchmark.extra_info.update(
        suite="pipeline", case="stream", pairs=STREAM_PAIRS, tokens=STREAM_TOKENS,
        tcp_rounds_s=tcp_s, ws_rounds_s=ws_s,
        tcp_tokens_per_s=STREAM_TOKENS / statistics.median(tcp_s),
        ws_tokens_per_s=STREAM_TOKENS / statistics.median(ws_s))
