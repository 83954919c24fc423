"""Mutable knowledge bases, game-memory files and WriteToMemory over TCP with the real
models: every message and its errors, Retrieve and ClassifyIntent reading what the game
wrote, a character that remembers the player's name across a server restart, and files
that are missing, truncated or corrupt changing nothing."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tryll_fast import codec
from tryll_fast.client import AsyncTryllClient, GraphDescription, KbRecord, TryllClient
from tryll_fast.errors import ErrorCode

from flows import SMOL, canned, create, create_error, gen, graph, node, turn
from wire import MODELS_DIR, Wire, start_server

pytestmark = pytest.mark.model
MINILM = "all-MiniLM-L6-v2"
E = ErrorCode
S = codec.MutableKbWriteStatus


def _start(tmp: Path):
    srv = start_server(tmp, models_dir=MODELS_DIR, overrides=[
        "llama.max_n_ctx=4096", "llama.n_slots=8", "workflow.max_steps_per_turn=16"])
    Path(srv.config.storage_root).mkdir(parents=True, exist_ok=True)
    return srv


@pytest.fixture(scope="module")
def server_dir(model_file, tmp_path_factory):
    model_file(SMOL)
    model_file(MINILM)
    return tmp_path_factory.mktemp("mem")


@pytest.fixture(scope="module")
def server(server_dir):
    srv = _start(server_dir)
    yield srv
    srv.shutdown(10)


@pytest.fixture
def w(server):
    wire = Wire(server.address, timeout=60)
    wire.create_session(locale="en")
    yield wire
    wire.close()


@pytest.fixture
def client(server):
    host, port = server.address
    with TryllClient(host, port, timeout=120) as c:
        c.create_session()
        yield c


def ensure(w, name="notes", **schema):
    r = w.request(codec.EnsureMutableKbRequest(request_id=w.rid(), store_name=name,
                                               schema=codec.MutableKbSchema(**schema)))
    assert isinstance(r, codec.EnsureMutableKbResponse), r
    return r


def write(w, name, *records):
    r = w.request(codec.MutableKbWriteRequest(
        request_id=w.rid(), store_name=name,
        records=[codec.MutableKbRecord(id=i, text=t, metadata_json=m) for i, t, m in records]))
    assert isinstance(r, codec.MutableKbWriteResponse), r
    return r.results


def test_the_mutable_kb_cap_is_a_setting(server_dir, tmp_path):
    srv = start_server(tmp_path, models_dir=MODELS_DIR,
                       overrides=["session.max_mutable_kbs=1"])
    try:
        with Wire(srv.address, timeout=60) as w:
            w.create_session(locale="en")
            ensure(w, "first", embedding_model_name=MINILM)
            r = w.request(codec.EnsureMutableKbRequest(
                request_id=w.rid(), store_name="second",
                schema=codec.MutableKbSchema(embedding_model_name=MINILM)))
            assert r.code == E.MutableKbLimitExceeded
            assert "session.max_mutable_kbs allows (1)" in r.message
            assert not ensure(w, "first", embedding_model_name=MINILM).created
    finally:
        srv.shutdown(10)


# ---- every message

def test_every_message_through_the_client(client):
    kb = client.ensure_mutable_kb("journal", schema_name="journal", schema_version=2,
                                  metadata_fields=["day", "place"])
    assert kb.created
    again = client.ensure_mutable_kb("journal", schema_name="journal", schema_version=2,
                                     metadata_fields=["place", "day"])
    assert not again.created
    out = kb.write([{"id": "d1", "text": "We crossed the river at dawn.",
                     "metadata": {"day": 1, "place": "river"}},
                    KbRecord("d2", "The bridge at Kell was burned.", {"day": 2}),
                    "Nothing happened on the third day.",
                    {"id": "d4", "text": "Camped at the inn.", "metadata": {"mood": "x"}}])
    assert [o.status for o in out] == [S.Inserted, S.Inserted, S.Inserted, S.Rejected]
    assert out[3].error_code == E.InvalidMutableKbRecord and "mood" in out[3].message
    assert client.enumerate_mutable_kbs() == [("journal", 3)]
    hits = kb.query("Which bridge burned?", top_k=2)
    assert hits[0].id == "d2" and hits[0].metadata == {"day": 2}
    assert [h.id for h in kb.query("river", top_k=5, filter={
        "op": "eq", "lhs": {"knowledge": "place"}, "rhs": {"value": "river"}})] == ["d1"]
    assert kb.get("d1") == KbRecord("d1", "We crossed the river at dawn.",
                                    {"day": 1, "place": "river"})
    assert kb.get("missing") is None
    page, cursor = kb.list(page_size=2)
    assert [r.id for r in page] == ["d1", "d2"] and cursor == "d2"
    assert [r.id for r in kb.records(page_size=2)][:2] == ["d1", "d2"]
    stats = kb.stats()
    assert stats["live"] == 3 and stats["tombstoned"] == 0 and stats["size_bytes"] > 0
    snapshot = kb.export()
    assert snapshot[4:8] == b"TMKB"
    assert kb.delete("d1", "nope") == 1
    assert kb.stats()["tombstoned"] == 1
    name, count, warnings = client.import_mutable_kb(snapshot, "journal_copy")
    assert (name, count, warnings) == ("journal_copy", 3, [])
    assert client.mutable_kb("journal_copy").get("d1").text.startswith("We crossed")
    assert kb.clear() == 2 and kb.stats()["live"] == 0
    assert sorted(client.enumerate_mutable_kbs()) == [("journal", 0), ("journal_copy", 3)]


def test_errors_name_the_problem(w):
    ensure(w, "notes", schema_name="n", metadata_fields=["a"])
    M = codec.MutableKbSchema
    Now, Unspecified = codec.EmbedTiming.Now, codec.EmbedTiming.Unspecified
    cases = [
        (codec.EnsureMutableKbRequest, dict(store_name="notes", schema=M(schema_name="other")),
         E.MutableKbSchemaMismatch, "schema_name"),
        (codec.EnsureMutableKbRequest, dict(store_name=""), E.InvalidMutableKbName, "empty"),
        (codec.EnsureMutableKbRequest, dict(store_name="x", schema=M(embedding_model_name=SMOL)),
         E.InvalidMutableKbSchema, "embedding_model_name"),
        (codec.EnsureMutableKbRequest, dict(store_name="x", schema=M(metadata_fields=[" a"])),
         E.InvalidMutableKbSchema, "metadata_fields[0]"),
        (codec.MutableKbWriteRequest, dict(store_name="nope"), E.MutableKbNotFound, "nope"),
        (codec.MutableKbQueryRequest, dict(store_name="notes", query_text="q", top_k=0),
         E.InvalidMutableKbQuery, "top_k"),
        (codec.MutableKbQueryRequest, dict(store_name="notes", query_text="q",
                                           filter_json="[1]"),
         E.InvalidMutableKbQuery, "filter_json"),
        (codec.MutableKbListRequest, dict(store_name="notes", page_size=5000),
         E.InvalidMutableKbQuery, "page_size"),
        (codec.ImportMutableKbRequest, dict(snapshot=b"garbage bytes"),
         E.InvalidMutableKbSnapshot, "snapshot"),
        (codec.SaveGameMemoryRequest, dict(save_id="../x"), E.InvalidSaveId, "save_id"),
        (codec.LoadGameMemoryRequest, dict(save_id="s", embed_timing=Unspecified),
         E.InvalidEmbedTiming, "embed_timing"),
        (codec.LoadGameMemoryRequest, dict(save_id="never", embed_timing=Now),
         E.GameMemoryFileNotFound, "never"),
    ]
    for cls, kw, code, word in cases:
        err = w.expect_error(cls(request_id=w.rid(), **kw), code)
        assert word in err.message, (cls, err.message)


def test_files_that_are_truncated_or_corrupt_change_nothing(w, server):
    ensure(w, "facts")
    write(w, "facts", ("a", "The well is dry.", ""), ("b", "The well is haunted.", ""))
    r = w.request(codec.SaveGameMemoryRequest(request_id=w.rid(), save_id="slot-t"))
    assert isinstance(r, codec.SaveGameMemoryResponse) and r.store_count == 1
    path = Path(server.config.storage_root) / "memory" / "slot-t.tgmf"
    data = path.read_bytes()
    write(w, "facts", ("c", "The mayor is a vampire.", ""))
    for bad in (data[:len(data) - 5], data[:3], data[:30] + bytes([data[30] ^ 1]) + data[31:]):
        path.write_bytes(bad)
        w.expect_error(codec.LoadGameMemoryRequest(request_id=w.rid(), save_id="slot-t",
                                                   embed_timing=codec.EmbedTiming.Now),
                       E.InvalidMutableKbSnapshot)
        r = w.request(codec.MutableKbStatsRequest(request_id=w.rid(), store_name="facts"))
        assert r.live_count == 3                      # the session's store is untouched
    path.write_bytes(data)
    r = w.request(codec.LoadGameMemoryRequest(request_id=w.rid(), save_id="slot-t",
                                              embed_timing=codec.EmbedTiming.Lazy))
    assert isinstance(r, codec.LoadGameMemoryResponse) and r.store_count == 1
    r = w.request(codec.MutableKbStatsRequest(request_id=w.rid(), store_name="facts"))
    assert (r.live_count, r.pending_embedding_count) == (2, 2)
    r = w.request(codec.MutableKbQueryRequest(request_id=w.rid(), store_name="facts",
                                              query_text="ghosts", top_k=1))
    assert r.hits[0].id == "b"
    r = w.request(codec.MutableKbStatsRequest(request_id=w.rid(), store_name="facts"))
    assert r.pending_embedding_count == 0


# ---- nodes

def _recall_graph(store: str, **retrieve) -> GraphDescription:
    """Recall (Retrieve over the store), answer, then remember what the player said."""
    template = ("Earlier, the player told you:\n{{#knowledge_memory}}{{#chunks}}"
                "- \"{{text}}\"\n{{/chunks}}{{/knowledge_memory}}"
                "Answer the player's question from what the player told you.")
    g = GraphDescription().set_default_model_name(SMOL)
    return g.add_node(
        "recall", codec.RetrieveParams(embedded_string_storage=store, top_k=2,
                                            threshold=0.0, source="memory",
                                            found_exit="answer", not_found_exit="answer",
                                            **retrieve)).add_node(
        "answer", gen(max_tokens=24, template=template, default_exit="remember",
                      placement=codec.Placement.BeforeUserAsSystem,
                      system_prompt="You are Mara, an innkeeper talking to a traveller. "
                                    "Answer in one short sentence.")).add_node(
        "remember", codec.WriteToMemoryParams(mutable_kb=store,
                                              content=codec.MemoryContent.UserMessage))


def _diag(frames) -> dict:
    return {n["node"]: n for n in json.loads(frames[-1].debug_info)["nodes"]}


def test_retrieve_reads_what_the_game_wrote_before_the_turn(w):
    ensure(w, "rumours", metadata_fields=["level"])
    agent = create(w, graph(
        node("find", codec.RetrieveParams(
            embedded_string_storage="rumours", top_k=1, threshold=0.0, source="r",
            filter='{"op": "le", "lhs": {"knowledge": "level"}, "rhs": {"var": "lvl"}}',
            found_exit="say", not_found_exit="none")),
        node("say", canned("found")), node("none", canned("nothing"))),
        enable_diagnostics=True,
        variables=[codec.AgentVariable(name="lvl", value=codec.VarInt(value=5))])
    frames = turn(w, agent, "Tell me about the dragon.")
    assert _diag(frames)["find"]["result_count"] == 0          # empty store: not_found
    write(w, "rumours", ("dragon", "A dragon sleeps in the northern hills.", '{"level": 3}'),
          ("lich", "A lich rules the drowned crypt.", '{"level": 9}'))
    frames = turn(w, agent, "Tell me about the dragon.")
    d = _diag(frames)["find"]
    assert d["result_count"] == 1 and d["results"][0]["id"] == "dragon"
    frames = turn(w, agent, "Tell me about the lich.")
    assert _diag(frames)["find"]["results"][0]["id"] == "dragon"   # level 9 > lvl 5


def test_classify_intent_reads_a_mutable_kb(w):
    ensure(w, "intents")
    write(w, "intents", ("s1", "I want to buy bread.", '{"intent": "shop"}'),
          ("s2", "How much is a loaf?", '{"intent": "shop"}'),
          ("q1", "Do you have work for me?", '{"intent": "quest"}'))
    agent = create(w, graph(
        node("route", codec.ClassifyIntentParams(embedded_string_storage="intents",
                                                 threshold=0.0, found_exit="yes",
                                                 not_found_exit="no")),
        node("yes", canned("routed")), node("no", canned("unrouted"))),
        enable_diagnostics=True)
    frames = turn(w, agent, "Can I buy some of your bread?")
    assert _diag(frames)["route"]["intent"] == "shop"


def test_write_to_memory_params_and_events(w):
    bad = [codec.WriteToMemoryParams(mutable_kb=""),
           codec.WriteToMemoryParams(mutable_kb="m", content=codec.MemoryContent.Template),
           codec.WriteToMemoryParams(mutable_kb="m", record_id="{{#open}}")]
    for p in bad:
        create_error(w, graph(node("w", p)), E.GraphCompilationFailed)
    # no store yet: nothing written, the turn goes on
    agent = create(w, graph(node("w", codec.WriteToMemoryParams(mutable_kb="diary"))),
                   enable_diagnostics=True)
    frames = turn(w, agent, "I am hungry.")
    assert _diag(frames)["w"]["written"] is False
    assert frames[-1].status == codec.TurnStatus.Success
    ensure(w, "diary")
    agent = create(w, graph(
        node("w", codec.WriteToMemoryParams(
            mutable_kb="diary", content=codec.MemoryContent.Template,
            template="The player said: {{user_message}}", record_id="last_words",
            metadata_json='{"mood": "{{var.mood}}"}'))),
        enable_diagnostics=True,
        variables=[codec.AgentVariable(name="mood", value=codec.VarString(value="cross"))])
    frames = turn(w, agent, "I am hungry.")
    events = [f for f in frames if isinstance(f, codec.NodeEvent)]
    assert events and events[0].event_type == "memory_written"
    pairs = {p.key: p.value for p in events[0].kv_pairs}
    assert pairs == {"store": "diary", "id": "last_words", "status": "inserted"}
    r = w.request(codec.MutableKbGetRequest(request_id=w.rid(), store_name="diary",
                                            record_id="last_words"))
    assert r.found and r.record.text == "The player said: I am hungry."
    meta = json.loads(r.record.metadata_json)
    assert meta["speaker"] == "template" and meta["agent"] == agent and meta["mood"] == "cross"
    agent = create(w, graph(node("w", codec.WriteToMemoryParams(
        mutable_kb="diary", metadata_json="[1, 2]"))))
    frames = turn(w, agent, "Hello")
    assert any(isinstance(f, codec.ErrorResponse) and f.code == E.InferenceFailed
               and "not a JSON object" in f.message for f in frames)


def test_a_character_remembers_the_player_across_a_restart(server_dir, model_file):
    srv = _start(server_dir)
    try:
        host, port = srv.address
        with TryllClient(host, port, timeout=180) as c:
            c.create_session()
            c.ensure_mutable_kb("player_memory")
            npc = c.create_agent(_recall_graph("player_memory"), enable_diagnostics=True)
            assert npc.send("Hello! My name is Aldric and I am looking for the Sunken "
                            "Crown.").result().ok
            assert npc.send("I also keep a grey cat called Pebble.").result().ok
            assert c.save_game_memory("aldric") == 1
    finally:
        srv.shutdown(10)
    srv = _start(server_dir)                 # a new process state: nothing in memory
    try:
        host, port = srv.address
        with TryllClient(host, port, timeout=180) as c:
            c.create_session()
            assert c.enumerate_mutable_kbs() == []
            assert c.load_game_memory("aldric", lazy=True) == (1, [])
            kb = c.mutable_kb("player_memory")
            assert kb.stats()["live"] == 2
            npc = c.create_agent(_recall_graph("player_memory"), enable_diagnostics=True)
            result = npc.send("What is my name?").result()
            assert result.ok
            recall = {n["node"]: n for n in json.loads(result.debug_info)["nodes"]}["recall"]
            assert "Aldric" in json.dumps(recall["results"]) or any(
                "Aldric" in kb.get(r["id"]).text for r in recall["results"])
            assert "Aldric" in result.texts["answer"], result.texts
    finally:
        srv.shutdown(10)


def test_the_asyncio_client_has_the_same_handle(server):
    async def main():
        host, port = server.address
        async with AsyncTryllClient(host, port, timeout=60) as c:
            await c.create_session()
            kb = await c.ensure_mutable_kb("async_notes")
            assert kb.created
            out = await kb.write(["The ferry leaves at noon.", "The ferry costs a copper."])
            assert [o.status for o in out] == [S.Inserted, S.Inserted]
            hits = await kb.query("When does the ferry leave?", top_k=1)
            assert hits[0].text == "The ferry leaves at noon."
            assert len([r async for r in kb.records(page_size=1)]) == 2
            assert await c.save_game_memory("async-slot") == 1
            assert await c.load_game_memory("async-slot") == (1, [])
            assert (await kb.stats())["live"] == 2
    asyncio.run(main())


def test_a_save_that_cannot_be_written_is_8109_and_leaves_nothing_behind(w, server):
    # the save's file name is taken by a directory: the atomic rename cannot land
    ensure(w, "facts")
    write(w, "facts", ("a", "The well is dry.", ""))
    folder = Path(server.config.storage_root) / "memory"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "slot-blocked.tgmf").mkdir()
    before = sorted(p.name for p in folder.iterdir())
    err = w.expect_error(codec.SaveGameMemoryRequest(request_id=w.rid(), save_id="slot-blocked"),
                         E.GameMemoryWriteFailed)
    assert "slot-blocked" in err.message
    assert sorted(p.name for p in folder.iterdir()) == before      # no half-written file
    assert isinstance(w.request(codec.SaveGameMemoryRequest(request_id=w.rid(),
                                                            save_id="slot-free")),
                      codec.SaveGameMemoryResponse)              # the session is fine
