"""`tryll-fast serve` as a real process: the startup line, a client session, graceful exit
on SIGTERM / SIGINT, clear failures."""
import json
import signal
import socket
import subprocess
import sys
import time

import pytest

from tryll_fast.client import TryllClient


def serve(tmp_path, *args):
    """`tryll-fast serve` on any free TCP port, without the pipeline transport unless
    `args` give it a --pipeline-port (the last one wins)."""
    cmd = [sys.executable, "-m", "tryll_fast.cli", "serve", "--port", "0",
           "--models-dir", str(tmp_path / "models"), "--storage-root", str(tmp_path / "store"),
           "--log-format", "json", "--pipeline-port", "0", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_log(proc, msg, timeout=30):
    deadline = time.monotonic() + timeout
    lines = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        record = json.loads(line)
        if record["msg"] == msg:
            return record, lines
    raise AssertionError(f"no {msg!r} log line; got {lines}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_starts_serves_and_stops_gracefully(tmp_path, sig):
    proc = serve(tmp_path, "--dev", "--set", "shutdown.deadline_ms=2000")
    try:
        started, _ = read_log(proc, "listening")
        assert started["host"] == "127.0.0.1" and started["port"] > 0
        assert started["mode"] == "dev" and started["protocol"] == 29
        assert started["models_ready"] == [] and started["models_loaded"] == []
        with TryllClient("127.0.0.1", started["port"], timeout=10) as client:
            assert client.create_session() > 0
            assert client.debug_command("echo", "hi") == "hi"
        proc.send_signal(sig)
        stopped, _ = read_log(proc, "stopped")
        assert proc.wait(20) == 0
    finally:
        proc.kill()
        proc.wait()


def test_port_in_use_fails_with_a_clear_log(tmp_path):
    busy = socket.create_server(("127.0.0.1", 0))
    port = busy.getsockname()[1]
    cmd = [sys.executable, "-m", "tryll_fast.cli", "serve", "--port", str(port),
           "--models-dir", str(tmp_path / "m"), "--storage-root", str(tmp_path / "s"),
           "--log-format", "json"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    finally:
        busy.close()
    assert out.returncode == 1
    record = next(json.loads(line) for line in out.stderr.splitlines()
                  if '"cannot listen"' in line)
    assert record["port"] == port and "Address already in use" in record["error"]


def test_bad_configuration_is_a_usage_error(tmp_path):
    cmd = [sys.executable, "-m", "tryll_fast.cli", "serve", "--set", "transport.bogus=1"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "transport.bogus: unknown setting" in out.stderr


def test_serve_starts_the_pipeline_transport_with_the_example_agents(tmp_path):
    from websockets.sync.client import connect

    from tryll_fast.gateway.elements import decode_output

    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    proc = serve(tmp_path, "--pipeline-port", str(port), "--set", "shutdown.deadline_ms=2000")
    try:
        started, _ = read_log(proc, "pipeline listening")
        assert started["port"] == port and started["agents"] == ["innkeeper", "bard"]
        with connect(f"ws://127.0.0.1:{port}/pipeline?agent=innkeeper&outputFormat=JSON",
                     open_timeout=10) as ws:
            # no models in this server's models dir: CreateAgent's own error, as an element
            error = decode_output(ws.recv(timeout=30), "JSON")
        assert error.type == "error" and error.fields["type"] == "GraphCompilationFailed"
        assert "not downloaded" in error.fields["message"]
        proc.send_signal(signal.SIGTERM)
        read_log(proc, "stopped")
        assert proc.wait(20) == 0
    finally:
        proc.kill()
        proc.wait()


def test_a_bad_pipeline_config_is_a_usage_error(tmp_path):
    bad = tmp_path / "agents.toml"
    bad.write_text("[agents.x.nodes.a]\ntype = \"Generate\"\nsampling = { top_q = 1 }\n")
    cmd = [sys.executable, "-m", "tryll_fast.cli", "serve", "--pipeline-config", str(bad)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "agents.x.nodes.a.sampling.top_q: SamplingOverrides has no field" in out.stderr
