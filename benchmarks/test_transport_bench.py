"""Transport: our epoll reactor vs an asyncio + uvloop server built from the same Server,
sessions, codec and handlers (benchmarks/uvloop_server.py), each in its own process, same
run, same load generator (benchmarks/transport_load.py).

Gates (python -m benchmarks.gates):
  transport_rps_vs_uvloop_64conn  median time of uvloop / ours for the same pipelined work:
                                  64 connections x 16 SetSessionLocale requests in flight
                                  >= 1.3
  transport_stream_vs_uvloop      the same for 100 000 AnswerText frames streamed to one
                                  client by a producer thread                      >= 1.5
Reported, not gated: round-trip p50/p99 at 1 and 16 connections (one request in flight
each), cross-thread send latency p50/p99 (a producer thread sending one frame per ms: ours
with direct sends, ours through the eventfd path, uvloop's call_soon_threadsafe)."""
import pytest

from benchmarks.transport_load import (
    ServerProcess, connect, cross_thread_latency, debug_stream, percentiles, pipelined_round,
    round_trips,
)

IMPLS = ["ours", "uvloop"]
N_CONN = 64
DEPTH = 16
PER_CONN = 1500
STREAM_FRAMES = 100_000


@pytest.fixture(scope="module")
def servers():
    procs = {"ours": ServerProcess("reactor"), "uvloop": ServerProcess("uvloop"),
             "ours_eventfd": ServerProcess("reactor", direct_send=False)}
    yield procs
    for proc in procs.values():
        proc.close()


@pytest.mark.parametrize("impl", IMPLS)
def test_rps_64_connections(benchmark, servers, impl):
    clients = connect(servers[impl].port, N_CONN)
    try:
        pipelined_round(clients, 200, DEPTH)
        benchmark.group = "transport rps (64 connections, pipelined)"
        benchmark.extra_info.update(suite="transport", case="rps_64conn", impl=impl,
                                    requests=N_CONN * PER_CONN)
        n = benchmark.pedantic(pipelined_round, args=(clients, PER_CONN, DEPTH), rounds=7,
                               iterations=1, warmup_rounds=1)
        assert n == N_CONN * PER_CONN
        benchmark.extra_info["rps"] = n / benchmark.stats.stats.median
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("impl", IMPLS)
def test_stream_100k_frames(benchmark, servers, impl):
    [client] = connect(servers[impl].port, 1)
    try:
        debug_stream(client, 10_000)
        benchmark.group = "transport stream (100 000 AnswerText frames)"
        benchmark.extra_info.update(suite="transport", case="stream_100k", impl=impl,
                                    frames=STREAM_FRAMES)
        elapsed, seen = benchmark.pedantic(debug_stream, args=(client, STREAM_FRAMES), rounds=7,
                                           iterations=1, warmup_rounds=1)
        assert seen == STREAM_FRAMES + 1      # the frames and the final chunk
        benchmark.extra_info["fps"] = STREAM_FRAMES / benchmark.stats.stats.median
    finally:
        client.close()


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("n_conn", [1, 16])
def test_round_trip_latency(benchmark, servers, impl, n_conn):
    clients = connect(servers[impl].port, n_conn)
    try:
        round_trips(clients, 200)
        benchmark.group = f"transport round trip ({n_conn} connections)"
        count = 3000 // n_conn
        rtts = benchmark.pedantic(round_trips, args=(clients, count), rounds=1, iterations=1)
        benchmark.extra_info.update(suite="transport", case=f"rtt_{n_conn}conn", impl=impl,
                                    **percentiles(rtts))
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("impl", ["ours", "ours_eventfd", "uvloop"])
def test_cross_thread_send_latency(benchmark, servers, impl):
    [client] = connect(servers[impl].port, 1)
    try:
        cross_thread_latency(client, 100, 1000)
        benchmark.group = "transport cross-thread send latency"
        lat = benchmark.pedantic(cross_thread_latency, args=(client, 1000, 1000), rounds=1,
                                 iterations=1)
        benchmark.extra_info.update(suite="transport", case="cross_thread", impl=impl,
                                    **percentiles(lat))
    finally:
        client.close()
