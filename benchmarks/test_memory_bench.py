"""Mutable knowledge bases and game-memory files, over TCP against a server process with the
real embedding model (all-MiniLM-L6-v2, 2 threads), 10 000 memory-like records (one short
sentence each, about 18 tokens).

Gate (python -m benchmarks.gates):
  game_memory_load_lazy_vs_now  LoadGameMemory of the 10 000 records with embed_timing Now
                                (every record embedded before the reply) over the same with
                                Lazy (read, validated and indexed by id; embedded when the
                                store is first searched), the client's clock around each
                                request, rounds in alternating pairs                   >= 10
Reported: write throughput (records/s: 2 000 records in MutableKbWrite batches of 500,
embedding included), MutableKbQuery p50 at 10 000 records (the client's clock: the query's
embedding and the search), and the store's size. The 10 000-record file is written in the
server's storage root with the encoder SaveGameMemory uses (knowledge/mutable.py), so the
run embeds the records only in the loads it measures.
"""
import functools
import os
import statistics
import tempfile
import time
from pathlib import Path

import pytest

from benchmarks.pairs import alternated
from benchmarks.transport_load import Client, ServerProcess
from tryll_fast import codec
from tryll_fast.knowledge import mutable
from tryll_fast.models import ensure_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(ROOT, "build", "models")
MINILM = "all-MiniLM-L6-v2"
N_RECORDS = 10_000
N_WRITTEN = 2_000
WRITE_BATCH = 500
PAIRS = 2
QUERIES = 50
SIDES = ("now", "lazy")           # the last round ends on Now: its store is queried

_WHO = ["the player", "Mara the innkeeper", "the blacksmith", "a hooded stranger",
        "the captain of the guard", "the miller's daughter", "an old hermit", "the bard"]
_DID = ["lost", "found", "sold", "bought", "hid", "stole", "repaired", "buried"]
_WHAT = ["a silver key", "the red lantern", "a map of the marsh", "three gold coins",
         "a wolf pelt", "the mayor's letter", "a broken sword", "a jar of honey",
         "the old compass", "a sack of rye"]
_WHERE = ["at the inn", "near the mill", "by the north gate", "in the library",
          "under the bridge", "in the Greyfen marsh", "at the market", "on the hill road"]


def memory_records(n: int) -> list[codec.MutableKbRecord]:
    out = []
    for i in range(n):
        text = (f"On day {i // 40 + 1}, {_WHO[i % 8]} {_DID[(i // 8) % 8]} "
                f"{_WHAT[(i // 64) % 10]} {_WHERE[(i // 640) % 8]}.")
        out.append(codec.MutableKbRecord(id=f"m{i:05d}", text=text,
                                         metadata_json=f'{{"day": {i // 40 + 1}}}'))
    return out


@pytest.fixture(scope="module")
def server():
    ensure_model(MINILM, MODELS_DIR)
    root = Path(tempfile.mkdtemp(prefix="tryll-memory-bench-"))
    proc = ServerProcess("reactor", models_dir=MODELS_DIR, settings=(f"storage_root={root}",))
    proc.root = root
    yield proc
    proc.close()


def _request(c: Client, body):
    c.sock.sendall(codec.encode(body))
    while True:
        reply = codec.decode(c.next_frame()).body
        if getattr(reply, "request_id", None) == body.request_id:
            assert not isinstance(reply, codec.ErrorResponse), reply
            return reply


def _timed(c: Client, body) -> tuple[float, object]:
    t0 = time.perf_counter()
    reply = _request(c, body)
    return time.perf_counter() - t0, reply


def test_game_memory_load_lazy_vs_now(benchmark, server):
    c = Client(server.port)
    _request(c, codec.EnsureMutableKbRequest(request_id=2, store_name="memory",
                                             schema=codec.MutableKbSchema(
                                                 schema_name="npc", embedding_model_name=MINILM)))
    records = memory_records(N_RECORDS)
    t0 = time.perf_counter()
    for i in range(0, N_WRITTEN, WRITE_BATCH):
        reply = _request(c, codec.MutableKbWriteRequest(
            request_id=3, store_name="memory", records=records[i:i + WRITE_BATCH]))
        assert all(r.status == codec.MutableKbWriteStatus.Inserted for r in reply.results)
    write_s = time.perf_counter() - t0
    schema = mutable.KbSchema("npc", 0, MINILM, ())
    data = mutable.encode_file([("memory", schema, [
        mutable.Record(r.id, r.text, r.metadata_json) for r in records])])
    (server.root / "memory").mkdir(parents=True, exist_ok=True)
    (server.root / "memory" / "bench.tgmf").write_bytes(data)

    def load(timing):
        return codec.LoadGameMemoryRequest(request_id=5, save_id="bench", embed_timing=timing)

    def load_round(timing) -> float:
        seconds, reply = _timed(c, load(timing))
        assert reply.store_count == 1
        return seconds

    timing = {"now": codec.EmbedTiming.Now, "lazy": codec.EmbedTiming.Lazy}
    runs = {side: functools.partial(load_round, timing[side]) for side in SIDES}
    times = benchmark.pedantic(alternated, args=(runs, PAIRS), rounds=1, iterations=1)
    if PAIRS % 2 == 1:                  # the last load was Lazy: make the store resident
        _request(c, load(codec.EmbedTiming.Now))
    stats = _request(c, codec.MutableKbStatsRequest(request_id=6, store_name="memory"))
    assert stats.live_count == N_RECORDS and stats.pending_embedding_count == 0
    questions = [f"What did {_WHO[i % 8]} do with {_WHAT[i % 10]}?" for i in range(QUERIES)]
    query_s = []
    for q in questions:
        seconds, reply = _timed(c, codec.MutableKbQueryRequest(
            request_id=7, store_name="memory", query_text=q, top_k=10))
        assert len(reply.hits) == 10
        query_s.append(seconds)
    c.sock.close()
    benchmark.group = "memory"
    benchmark.extra_info.update(
        suite="memory", case="load_lazy_vs_now", records=N_RECORDS, pairs=PAIRS,
        lazy_rounds_s=times["lazy"], now_rounds_s=times["now"],
        lazy_s_median=statistics.median(times["lazy"]),
        now_s_median=statistics.median(times["now"]),
        write_records_per_s=N_WRITTEN / write_s, write_batch=WRITE_BATCH,
        file_bytes=len(data),
        query_ms_p50=statistics.median(query_s) * 1000,
        query_ms_p99=sorted(query_s)[int(len(query_s) * 0.99) - 1] * 1000,
        store_size_bytes=stats.size_bytes)
