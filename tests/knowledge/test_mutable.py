"""Mutable knowledge bases in-process with the real embedding model (all-MiniLM-L6-v2):
upsert semantics and per-record results, deletes, tombstones and compaction, queries with
filters and thresholds, paging while another thread writes, Lazy against Now, snapshots
and game-memory files (parts, truncation, corruption), and an atomic save that a kill -9
cannot tear."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib

import pytest

from tryll_fast import codec
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.knowledge import mutable as M
from tryll_fast.knowledge.mutable import KbSchema, MutableKb, Record

pytestmark = pytest.mark.model
MINILM = "all-MiniLM-L6-v2"
S = codec.MutableKbWriteStatus
SCHEMA = KbSchema("npc_memory", 1, MINILM, ())

FACTS = [
    ("name", "The player's name is Aldric of Wyndmere.", {"speaker": "player", "turn": 1}),
    ("quest", "The player is searching for the Sunken Crown beneath Lake Orrow.",
     {"speaker": "player", "turn": 2}),
    ("pet", "The player travels with a grey cat called Pebble.", {"speaker": "player",
                                                                  "turn": 3}),
    ("inn", "The innkeeper gave the player a room key for the attic.",
     {"speaker": "assistant", "turn": 4}),
    ("dragon", "A red dragon burned the mill at Ashcombe last winter.",
     {"speaker": "assistant", "turn": 5, "tags": ["danger"]}),
]


@pytest.fixture(scope="module")
def embedder(model_file):
    from tryll_fast.engines.llama.embeddings import Embedder
    path = model_file(MINILM)
    e = Embedder(str(path / "model.safetensors") if path.is_dir() else str(path))
    yield e
    e.close()


def rec(rid: str, text: str, meta=None) -> Record:
    return Record(rid, text, json.dumps(meta) if meta is not None else "")


@pytest.fixture
def kb(embedder):
    store = MutableKb("memory", SCHEMA, embedder)
    results = store.write([rec(*f) for f in FACTS])
    assert [r.status for r in results] == [S.Inserted] * len(FACTS)
    return store


def ids(hits) -> list[str]:
    return [r.id for r, _ in hits]


def test_upsert_reports_each_record(kb):
    results = kb.write([
        rec("name", FACTS[0][1], FACTS[0][2]),                      # same: Unchanged
        rec("quest", "The player gave up on the Sunken Crown.", {"turn": 9}),   # Updated
        rec("", "The player owes the smith three silver coins."),   # a new id
        rec("bad", "   "),                                          # empty text
        rec("worse", "typed", {"turn": "nine"}),                    # turn is an int here
        rec("x" * 300, "too long an id"),
        rec("pet", "The player's cat Pebble is now white.", FACTS[2][2]),
        rec("pet", "The player's cat Pebble is now white.", FACTS[2][2]),   # same as above
    ])
    assert [r.status for r in results] == [S.Unchanged, S.Updated, S.Inserted, S.Rejected,
                                           S.Rejected, S.Rejected, S.Updated, S.Unchanged]
    assert results[2].id.startswith("m-")
    assert results[3].error_code == ErrorCode.InvalidMutableKbRecord
    assert "records[3].text" in results[3].message
    assert "records[4].metadata_json.turn" in results[4].message and "an int" in \
        results[4].message
    assert "at most 256" in results[5].message
    assert kb.get("quest").text == "The player gave up on the Sunken Crown."
    assert kb.get(results[2].id).metadata_json == "{}"
    assert kb.get("bad") is None and kb.get("worse") is None
    assert kb.stats()["live"] == len(FACTS) + 1
    assert kb.stats()["tombstoned"] == 2


def test_a_metadata_only_change_keeps_the_vector(kb, embedder):
    calls = []
    real = embedder.embed

    def counting(texts):
        calls.append(list(texts))
        return real(texts)
    kb._embedder = type("E", (), {"embed": staticmethod(counting), "dim": embedder.dim})()
    kb.write([rec("name", FACTS[0][1], {"speaker": "player", "turn": 7})])
    assert calls == []
    assert json.loads(kb.get("name").metadata_json)["turn"] == 7
    assert ids(kb.query("What is the player called?", 1, 0, ""))[0] == "name"


def test_schema_fields_restrict_metadata(embedder):
    store = MutableKb("m", KbSchema("s", 0, MINILM, ("speaker", "turn")), embedder)
    r = store.write([rec("a", "text", {"speaker": "player", "mood": "sad"})])[0]
    assert r.status == S.Rejected and "metadata_json.mood" in r.message
    assert "speaker, turn" in r.message


def test_query_is_best_first_with_filter_and_threshold(kb):
    hits = kb.query("What is my name?", 3, 0.0, "")
    assert ids(hits)[0] == "name"
    assert [d for _, d in hits] == sorted(d for _, d in hits)
    said_by_player = {"op": "eq", "lhs": {"knowledge": "speaker"}, "rhs": {"value": "player"}}
    assert set(ids(kb.query("inn room dragon", 5, 0, json.dumps(said_by_player)))) == \
        {"name", "quest", "pet"}
    late = {"op": "ge", "lhs": {"knowledge": "turn"}, "rhs": {"value": 4}}
    assert set(ids(kb.query("anything", 5, 0, json.dumps(late)))) == {"inn", "dragon"}
    tagged = {"op": "in", "needle": {"value": "danger"}, "haystack": {"knowledge": "tags"}}
    assert ids(kb.query("anything", 5, 0, json.dumps(tagged))) == ["dragon"]
    # a field no record carries: every record lacks it, so eq is false and not-eq true
    mood = {"op": "eq", "lhs": {"knowledge": "mood"}, "rhs": {"value": "sad"}}
    assert kb.query("anything", 5, 0, json.dumps(mood)) == []
    assert len(kb.query("anything", 5, 0, json.dumps({"op": "not", "arg": mood}))) == 5
    every = kb.query("What is my name?", 5, 0, "")
    cut = (every[0][1] + every[-1][1]) / 2
    near = kb.query("What is my name?", 5, cut, "")
    assert near and all(d <= cut for _, d in near) and len(near) < 5


@pytest.mark.parametrize("args, field", [
    (("", 5, 0, ""), "query_text"), (("q", 0, 0, ""), "top_k"), (("q", 1001, 0, ""), "top_k"),
    (("q", 5, -1, ""), "max_distance"), (("q", 5, float("nan"), ""), "max_distance"),
    (("q", 5, 0, "{nope"), "filter_json"),
    (("q", 5, 0, '{"op": "lt", "lhs": {"knowledge": "speaker"}, "rhs": {"value": 1}}'),
     "filter_json"),
    (("q", 5, 0, '{"op": "eq", "lhs": {"var": "level"}, "rhs": {"value": 1}}'),
     "filter_json"),
])
def test_bad_queries_name_the_field(kb, args, field):
    with pytest.raises(TryllError) as e:
        kb.query(*args)
    assert e.value.code == ErrorCode.InvalidMutableKbQuery and field in e.value.message


def test_deletes_tombstone_and_compaction_reclaims(embedder):
    store = MutableKb("m", SCHEMA, embedder)
    store.write([rec(f"r{i:03d}", f"Record number {i} about {w}")
                 for i, w in enumerate(["bread", "wolves", "gold", "rain"] * 25)])
    assert store.delete(["r000", "r001", "nope"]) == 2
    assert store.stats() == {**store.stats(), "live": 98, "tombstoned": 2}
    gone = [f"r{i:03d}" for i in range(2, 80)]
    assert store.delete(gone) == 78
    s = store.stats()
    assert s["live"] == 20 and s["tombstoned"] == 0           # 80 > 20: compacted
    assert len(store._ids) == 20
    assert set(ids(store.query("wolves", 20, 0, ""))) == {f"r{i:03d}" for i in range(80, 100)}
    assert store.clear() == 20 and store.stats()["live"] == 0
    assert store.query("wolves", 5, 0, "") == []


def test_paging_is_stable_while_another_thread_writes(embedder):
    store = MutableKb("m", SCHEMA, embedder)
    store.write([rec(f"a{i:03d}", f"Old fact {i}") for i in range(60)])
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            store.write([rec(f"b{i:03d}", f"New fact {i}")])
            store.delete([f"b{i - 3:03d}"])
            i += 1
    t = threading.Thread(target=writer)
    t.start()
    try:
        seen, cursor = [], ""
        while True:
            page, cursor = store.page(cursor, 7)
            seen += [r.id for r in page]
            if not cursor:
                break
    finally:
        stop.set()
        t.join()
    assert seen == sorted(seen) and len(seen) == len(set(seen))
    assert {f"a{i:03d}" for i in range(60)} <= set(seen)


def test_lazy_and_now_give_the_same_results(embedder):
    data = M.encode_file([("memory", SCHEMA, [rec(*f) for f in FACTS])])
    parsed = M.parse_file(data, "f")
    now = MutableKb("memory", SCHEMA, embedder)
    now.load_records(parsed[0].records, parsed[0].metas, embed_now=True)
    lazy = MutableKb("memory", SCHEMA, embedder)
    lazy.load_records(parsed[0].records, parsed[0].metas, embed_now=False)
    assert lazy.stats()["pending"] == len(FACTS) and now.stats()["pending"] == 0
    for q in ("What is my name?", "Where is the crown?", "Who burned the mill?"):
        a, b = now.query(q, 3, 0, ""), lazy.query(q, 3, 0, "")
        assert ids(a) == ids(b)
        assert [round(d, 5) for _, d in a] == [round(d, 5) for _, d in b]
    assert lazy.stats()["pending"] == 0


def test_snapshots_split_into_parts_and_validate(kb):
    records = kb.records()
    parts = M.encode_parts("memory", SCHEMA, records, limit=200)
    assert len(parts) > 1
    read = [M.parse_part(p, f"p{i}") for i, p in enumerate(parts)]
    whole, = M.join_parts(read, "file")
    assert whole.records == records and whole.model == MINILM
    with pytest.raises(TryllError, match="truncated"):
        M.join_parts(read[:-1], "file")
    with pytest.raises(TryllError) as e:
        M.parse_part(parts[0][:-9], "p")
    assert e.value.code == ErrorCode.InvalidMutableKbSnapshot
    dup = codec.encode_root(codec.PersistedKb(
        format_version=1, store_name="m", parts=1,
        records=[codec.PersistedKbRecord(id="a", text="x"),
                 codec.PersistedKbRecord(id="a", text="y")]))
    with pytest.raises(TryllError, match="appears twice"):
        M.parse_part(dup, "p")
    future = codec.encode_root(codec.PersistedKb(format_version=9, store_name="m"))
    with pytest.raises(TryllError, match="newer"):
        M.parse_part(future, "p")


def test_game_memory_files_detect_truncation_and_corruption(kb):
    data = M.encode_file([("memory", SCHEMA, kb.records()), ("empty", SCHEMA, [])])
    stores = M.parse_file(data, "f")
    assert [s.name for s in stores] == ["memory", "empty"]
    for cut in (10, len(data) // 2, len(data) - 1):
        with pytest.raises(TryllError) as e:
            M.parse_file(data[:cut], "f")
        assert e.value.code == ErrorCode.InvalidMutableKbSnapshot
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x40
    with pytest.raises(TryllError, match="checksum"):
        M.parse_file(bytes(flipped), "f")
    # a consistent header over garbage still fails on the buffers themselves
    body = os.urandom(64)
    forged = M._HEADER.pack(M.FILE_MAGIC, 1, 1, zlib.crc32(struct_len(body)), 0) + \
        struct_len(body)
    with pytest.raises(TryllError) as e:
        M.parse_file(forged, "f")
    assert e.value.code == ErrorCode.InvalidMutableKbSnapshot
    with pytest.raises(TryllError, match="TGMF"):
        M.parse_file(b"TDLG" + data[4:], "f")


def struct_len(body: bytes) -> bytes:
    return len(body).to_bytes(4, "little") + body


_WRITER = r"""
import sys, time
from tryll_fast.knowledge import mutable as M
from tryll_fast.knowledge.mutable import KbSchema, Record
from tryll_fast.server import saves
from pathlib import Path
schema = KbSchema("s", 1, "m", ())
big = [Record(f"r{i:05d}", "old " * 200, "") for i in range(3000)]
new = [Record(f"r{i:05d}", "new " * 200, "") for i in range(3000)]
path = Path(sys.argv[1])
saves.write_atomic(path, M.encode_file([("kb", schema, big)]), "t")
print("ready", flush=True)
while True:
    saves.write_atomic(path, M.encode_file([("kb", schema, new)]), "t")
    saves.write_atomic(path, M.encode_file([("kb", schema, big)]), "t")
"""


def test_kill_9_during_saves_leaves_the_old_or_the_new_file_whole(tmp_path):
    path = tmp_path / "memory" / "slot.tgmf"
    rng = random.Random(7)
    for attempt in range(4):
        p = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)],
                             stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "ready"
            time.sleep(rng.uniform(0.05, 0.6))
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait()
        store, = M.parse_file(path.read_bytes(), "slot")
        assert len(store.records) == 3000
        assert len({r.text for r in store.records}) == 1


def test_views_serve_lexical_search_and_stay_consistent_under_writes(kb):
    view = kb.view()
    rows = view.lexical_search("Pebble the cat", 5, None)
    assert [view.ids[r] for r, _ in rows][0] == "pet"
    kb.write([rec("pet", "The player's cat Pebble ran away.", FACTS[2][2])])
    kb.delete(["inn"])
    # the old view still answers from the rows it saw; a new view sees the change
    assert [view.ids[r] for r, _ in view.lexical_search("Pebble", 5, None)] == ["pet"]
    assert view.texts[rows[0][0]] == FACTS[2][1]
    fresh = kb.view()
    assert fresh is not view and len(fresh) == len(FACTS) - 1
    hit = fresh.lexical_search("Pebble", 5, None)[0][0]
    assert fresh.texts[hit] == "The player's cat Pebble ran away."
    d = fresh.distances(fresh.embed_query("cat"), [hit])
    assert 0.0 < float(d[0]) < 1.0
