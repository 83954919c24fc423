"""Embedded string storages, Retrieve and ClassifyIntent over TCP with the real models
(all-MiniLM-L6-v2 embeddings, SmolLM2 answering): Path A and Path B, the index file built
once and rebuilt when stale, for another model or corrupt, every error code, a lore agent
that answers from its records and falls back on an off-topic question, filters on agent
variables, hybrid retrieval of a rare name, and intent routing on held-out lines."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tryll_fast import codec
from tryll_fast.errors import ErrorCode

from flows import SMOL, canned, create, create_error, gen, graph, node, turn
from wire import MODELS_DIR, start_server

pytestmark = pytest.mark.model
MINILM = "all-MiniLM-L6-v2"
E = ErrorCode

LORE = [
    ("ashcombe_smith", "Brannoc the blacksmith of Ashcombe forges horseshoes, ploughshares "
     "and the guard's spears.", {"region": "ashcombe", "min_level": 1, "tags": ["trade"]}),
    ("ashcombe_mill", "The mill of Ashcombe grinds rye flour; the miller sells a sack for "
     "three copper coins.", {"region": "ashcombe", "min_level": 1, "tags": ["trade"]}),
    ("quillemarch_gate", "The gates of Quillemarch close at sunset, and the gatekeeper "
     "charges one silver coin to open them at night.", {"region": "quillemarch",
                                                        "min_level": 3}),
    ("dragon", "An old red dragon sleeps under the Cinder Peaks; it wakes when someone "
     "steals from its hoard.", {"region": "cinder_peaks", "min_level": 12,
                                "tags": ["danger", "quest"]}),
    ("library", "The great library of Quillemarch lends books to anyone who leaves a "
     "deposit of five silver coins.", {"region": "quillemarch", "min_level": 1}),
    ("scribe", "The scribes of the library copy old books by candlelight and sell the "
     "copies to travelling scholars.", {"region": "quillemarch", "min_level": 1}),
    ("archive", "Scholars who read the archive's books must wear gloves and may not bring "
     "ink near the shelves.", {"region": "quillemarch", "min_level": 5}),
    ("varrowen", "Ysolde Varrowen keeps the rarest volumes and trades them only for "
     "another rare volume, never for coin.", {"region": "quillemarch", "min_level": 8}),
    ("wolves", "Wolves hunt in the Greyfen marsh at night; the hunters' guild pays a "
     "bounty for every pelt.", {"region": "greyfen", "min_level": 4,
                                "tags": ["danger", "quest"]}),
    ("inn", "The Drowned Lantern is the inn of Greyfen; a bed costs two copper coins and "
     "the stew is free.", {"region": "greyfen", "min_level": 1, "tags": ["trade"]}),
]
FIELDS = [{"name": "region", "type": "string", "default": ""},
          {"name": "min_level", "type": "int", "default": 0},
          {"name": "tags", "type": "set<string>", "optional": True}]

INTENTS = {
    "shop": ["What do you have for sale?", "I want to buy a new sword.",
             "How much does this cost?", "Can I sell you these furs?",
             "Show me your wares."],
    "quest": ["Do you have any work for me?", "I'm looking for an adventure.",
              "Is there a job that pays well?", "Any monsters that need slaying?",
              "Give me a task."],
    "greet": ["Hello there!", "Good morning to you.", "Hi, nice to meet you.",
              "Greetings, friend.", "Hey, how are you?"],
    "farewell": ["Goodbye.", "I have to go now.", "See you later.", "Farewell, friend.",
                 "I'll be on my way."],
    "threat": ["Hand over your gold or else.", "I will burn this place down.",
               "Give me everything or you die.", "Don't make me hurt you.",
               "I'm going to kill you."],
}
HELD_OUT = [("Are you selling any potions?", "shop"), ("What's the price of that bow?", "shop"),
            ("Got any quests for a traveller?", "quest"),
            ("I need some work, anything at all.", "quest"),
            ("Good evening!", "greet"), ("Hello, shopkeeper.", "greet"),
            ("Bye for now.", "farewell"), ("Take care, I'm leaving.", "farewell"),
            ("Your money or your life!", "threat"), ("I'll smash your shop to pieces.", "threat")]


def write_kb(root: Path, folder: str, records, fields=FIELDS, **config) -> str:
    d = root / folder
    d.mkdir(parents=True, exist_ok=True)
    (d / "lore.kb.json").write_text(json.dumps(
        [{"id": i, "text": t, "metadata": m} for i, t, m in records]), "utf-8")
    cfg = {"version": 1, "embedding_model": MINILM, "records_file": "lore.kb.json",
           "fields": fields}
    cfg.update(config)
    (d / "lore.json").write_text(json.dumps(cfg), "utf-8")
    return f"{folder}/lore.json"


@pytest.fixture(scope="module")
def server(model_file, tmp_path_factory):
    model_file(SMOL)
    model_file(MINILM)
    srv = start_server(tmp_path_factory.mktemp("emb"), models_dir=MODELS_DIR, overrides=[
        "llama.max_n_ctx=4096", "llama.n_slots=8", "workflow.max_steps_per_turn=16",
        # the lore agent tests retrieval with SmolLM2, which the character frame pulls
        # away from the record it is given; the frame has its own tests
        "workflow.character_frame="])
    root = Path(srv.config.storage_root)
    root.mkdir(parents=True, exist_ok=True)
    write_kb(root, "lore", LORE)
    intents = root / "intents"
    intents.mkdir()
    (intents / "intents.kb.json").write_text(json.dumps(
        [{"id": f"{k}{i}", "text": t, "metadata": {"intent": k}}
         for k, lines in INTENTS.items() for i, t in enumerate(lines)]), "utf-8")
    (intents / "intents.json").write_text(json.dumps({
        "embedding_model": MINILM, "records_file": "intents.kb.json",
        "fields": [{"name": "intent", "type": "string", "default": ""}]}), "utf-8")
    yield srv
    srv.shutdown(10)


def make(w, name, **kw):
    r = w.request(codec.CreateEmbeddedStringStorageRequest(request_id=w.rid(), name=name, **kw))
    assert isinstance(r, codec.CreateEmbeddedStringStorageResponse), r
    assert r.name == name
    return r


def make_error(w, code, **kw):
    kw.setdefault("name", "kb")
    return w.expect_error(codec.CreateEmbeddedStringStorageRequest(request_id=w.rid(), **kw),
                          code)


def diag(frames) -> dict:
    return {n["node"]: n for n in json.loads(frames[-1].debug_info)["nodes"]}


def retrieve(storage="lore/lore.json", **kw) -> codec.RetrieveParams:
    kw.setdefault("found_exit", "answer")
    kw.setdefault("not_found_exit", "sorry")
    return codec.RetrieveParams(embedded_string_storage=storage, **kw)


def lore_agent(w, retrieve_params, **kw):
    template = ("Facts you know:\n{{#knowledge_lore}}{{#chunks}}- {{text}}\n{{/chunks}}"
                "{{/knowledge_lore}}")
    return create(w, graph(
        node("find", retrieve_params),
        node("answer", gen(max_tokens=40, template=template,
                           placement=codec.Placement.BeforeUserAsSystem,
                           system_prompt="You are a town guide. Answer from the facts in "
                                         "one sentence.")),
        node("sorry", canned("I know nothing about that."))),
        enable_diagnostics=True, **kw)


# ---- storages

def test_inline_storage_reports_records_and_dimensions(w):
    r = make(w, "barks", strings=["Hello", "Welcome to the inn", "Mind the dragon"],
             embedding_model=MINILM, metadata_json=['{"mood": "calm"}', "", '{"lvl": 3}'])
    assert (r.record_count, r.embedding_dim) == (3, 384)
    assert isinstance(w.request(codec.DestroyEmbeddedStringStorageRequest(
        request_id=w.rid(), name="barks")), codec.Ack)


@pytest.mark.parametrize("kw, code, message", [
    (dict(name=" kb"), E.InvalidEmbeddedStringStorageName, "leading or trailing"),
    (dict(strings=["a"]), E.InvalidEmbeddedStringStorageData, "embedding_model"),
    (dict(strings=["a"], embedding_model=SMOL), E.InvalidEmbeddedStringStorageData,
     "not an embedding model of the catalog (embedding models: all-MiniLM-L6-v2"),
    (dict(strings=["a", ""], embedding_model=MINILM), E.InvalidEmbeddedStringStorageData,
     "strings[1]: the text is empty"),
    (dict(strings=["a", "b"], embedding_model=MINILM, metadata_json=["{}"]),
     E.InvalidEmbeddedStringStorageData, "metadata_json: 1 entries for 2 strings"),
    (dict(strings=["a"], embedding_model=MINILM, metadata_json=["[1]"]),
     E.InvalidEmbeddedStringStorageData, "metadata_json[0]: must be a JSON object"),
    (dict(strings=["a"], embedding_model=MINILM, config_path="lore/lore.json"),
     E.InvalidEmbeddedStringStorageData, "not both"),
    (dict(), E.InvalidEmbeddedStringStorageData, "give config_path"),
    (dict(config_path="/etc/passwd.json"), E.StorageOutsideRoot, "absolute"),
    (dict(config_path="../lore.json"), E.StorageOutsideRoot, "climbs out"),
    (dict(config_path="lore/missing.json"), E.StorageFileNotFound, "not a file"),
    (dict(config_path="lore/lore.kb.json"), E.InvalidEmbeddedStringStorageData,
     "a KB config is a JSON object"),
])
def test_create_errors_name_the_field(w, kw, code, message):
    err = make_error(w, code, **kw)
    assert message in err.message, err.message


def test_names_are_unique_across_both_storage_kinds(w):
    make(w, "kb", strings=["one"], embedding_model=MINILM)
    assert "already has an embedded" in make_error(
        w, E.EmbeddedStringStorageAlreadyExists, strings=["two"],
        embedding_model=MINILM).message
    w.expect_error(codec.CreateStringStorageRequest(request_id=w.rid(), name="kb",
                                                    strings=["x"]), E.StorageNameInUse)
    assert isinstance(w.request(codec.CreateStringStorageRequest(
        request_id=w.rid(), name="barks", strings=["x"])), codec.CreateStringStorageResponse)
    make_error(w, E.StorageNameInUse, name="barks", strings=["x"], embedding_model=MINILM)
    err = w.expect_error(codec.DestroyEmbeddedStringStorageRequest(request_id=w.rid(),
                                                                   name="nope"),
                         E.InvalidEmbeddedStringStorageName)
    assert "(it has: kb)" in err.message


@pytest.mark.parametrize("records, fields, message", [
    ({"id": 1}, FIELDS, "must be a JSON array"),
    ([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}], FIELDS, "[1].id: 'a' appears twice"),
    ([{"id": "a"}], FIELDS, "[0].text: must be a string"),
    ([{"id": "a", "text": "x", "metadata": {"min_level": "high"}}], FIELDS,
     "[0].metadata.min_level: 'high' is not an integer"),
    ([{"id": "a", "text": "x"}], [{"name": "lvl", "type": "int"}],
     "needs exactly one of `default` or `optional: true`"),
])
def test_bad_records_and_schemas_are_8003(w, root, records, fields, message):
    d = root / "bad"
    d.mkdir(exist_ok=True)
    (d / "lore.kb.json").write_text(json.dumps(records), "utf-8")
    (d / "lore.json").write_text(json.dumps({"embedding_model": MINILM,
                                             "records_file": "lore.kb.json",
                                             "fields": fields}), "utf-8")
    err = make_error(w, E.InvalidEmbeddedStringStorageData, config_path="bad/lore.json")
    assert message in err.message, err.message


def test_index_file_is_built_once_and_rebuilt_when_stale_foreign_or_corrupt(w, root):
    rel = write_kb(root, "cache", LORE[:4])
    index = root / "cache" / "lore.usearch"
    side = root / "cache" / "lore.usearch.json"
    assert make(w, "a", config_path=rel).record_count == 4
    assert index.is_file() and json.loads(side.read_text())["model"] == MINILM
    built = index.stat().st_mtime_ns
    time.sleep(0.01)
    # a fresh file is reused (a second storage of the same config, after the cache)
    assert make(w, "b", config_path=rel).embedding_dim == 384
    assert index.stat().st_mtime_ns == built
    # edited records: rebuilt
    write_kb(root, "cache", LORE[:6])
    assert make(w, "c", config_path=rel).record_count == 6
    assert index.stat().st_mtime_ns != built
    # an index recorded for another model: rebuilt
    meta = json.loads(side.read_text())
    side.write_text(json.dumps(dict(meta, model="Some-Other-Embedder")), "utf-8")
    os.utime(root / "cache" / "lore.json")                       # a new cache key
    make(w, "d", config_path=rel)
    assert json.loads(side.read_text())["model"] == MINILM
    # a corrupt index: rebuilt, never a crash
    index.write_bytes(b"\x00garbage" * 50)
    os.utime(root / "cache" / "lore.json", ns=(time.time_ns(), time.time_ns()))
    assert make(w, "e", config_path=rel).record_count == 6
    assert index.stat().st_size > 1000


# ---- Retrieve

def test_lore_agent_answers_from_its_records_and_falls_back_off_topic(w):
    aid = lore_agent(w, retrieve(top_k=2, threshold=0.6, source="lore"))
    frames = turn(w, aid, "When do the gates of Quillemarch close?")
    d = diag(frames)
    assert d["find"]["exit"] == "found"
    assert d["find"]["results"][0]["id"] == "quillemarch_gate"
    answer = "".join(f.text for f in frames if isinstance(f, codec.AnswerText)
                     and f.node_name == "answer")
    assert "silver" in answer.lower(), answer             # a fact only the record holds
    frames = turn(w, aid, "What is the airspeed of an unladen swallow?")
    d = diag(frames)
    assert d["find"]["exit"] == "not_found" and d["find"]["result_count"] == 0
    assert [f.text for f in frames if isinstance(f, codec.AnswerText)] == [
        "I know nothing about that."]


def test_filters_read_agent_variables_on_every_turn(w):
    level_filter = json.dumps({"op": "ge", "lhs": {"var": "level"},
                               "rhs": {"knowledge": "min_level"}})
    aid = lore_agent(w, retrieve(top_k=3, threshold=0.0, source="lore", filter=level_filter),
                     variables=[codec.AgentVariable(name="level",
                                                    value=codec.VarInt(value=1))])
    ask = "Tell me about the dragon of the Cinder Peaks."
    ids = [r["id"] for r in diag(turn(w, aid, ask))["find"]["results"]]
    assert "dragon" not in ids and len(ids) == 3
    assert isinstance(w.request(codec.UpdateAgentVariablesRequest(
        request_id=w.rid(), agent_id=aid, updates=[codec.VariableUpdate(
            name="level", op=codec.VariableOp.Assign, value=codec.VarInt(value=20))])),
        codec.Ack)
    assert diag(turn(w, aid, ask))["find"]["results"][0]["id"] == "dragon"
    # a bad new filter is 3007 and the old one stays; a good one applies at once
    err = w.expect_error(codec.ChangeAgentParamRequest(
        request_id=w.rid(), agent_id=aid, node_name="find",
        params=retrieve(top_k=3, threshold=0.0, source="lore",
                        filter='{"op": "lt", "lhs": {"knowledge": "region"}, '
                               '"rhs": {"value": 1}}')), E.InvalidParamValue)
    assert "node 'find': filter at the top: \"lt\" orders numbers" in err.message
    assert diag(turn(w, aid, ask))["find"]["results"][0]["id"] == "dragon"
    region = json.dumps({"op": "in", "needle": {"value": "quest"},
                         "haystack": {"knowledge": "tags"}})
    assert isinstance(w.request(codec.ChangeAgentParamRequest(
        request_id=w.rid(), agent_id=aid, node_name="find",
        params=retrieve(top_k=3, threshold=0.0, source="lore", filter=region))), codec.Ack)
    ids = [r["id"] for r in diag(turn(w, aid, ask))["find"]["results"]]
    assert sorted(ids) == ["dragon", "wolves"]


def test_hybrid_finds_a_rare_name_the_vectors_miss(w):
    # the question is about books and the library, where three other records sit closer
    # to it than the one record that names Varrowen
    ask = "Which books does Varrowen lend at the library?"
    found = {}
    for mode in (codec.RetrievalMode.Vector, codec.RetrievalMode.Lexical,
                 codec.RetrievalMode.Hybrid):
        aid = lore_agent(w, retrieve(top_k=3, threshold=0.0, source="lore",
                                     retrieval_mode=mode, rrf_k=60))
        found[mode.name] = [r["id"] for r in diag(turn(w, aid, ask))["find"]["results"]]
    assert "varrowen" not in found["Vector"], found
    assert "varrowen" in found["Lexical"], found
    assert "varrowen" in found["Hybrid"], found


def test_knowledge_is_kept_in_the_exported_dialog(w):
    aid = lore_agent(w, retrieve(top_k=1, threshold=0.0, source="lore"))
    turn(w, aid, "Where can I sleep in Greyfen?")
    r = w.request(codec.ExportDialogRequest(request_id=w.rid(), agent_id=aid))
    snap = codec.decode_root(codec.PersistedDialogSnapshot, bytes(r.snapshot)).to_dict()
    bodies = [c["body"] for c in snap["interactions"][0]["components"]]
    knowledge = [next(iter(b.values())) for b in bodies if "PersistedKnowledge" in b]
    assert knowledge and knowledge[0]["source"] == "lore"
    assert knowledge[0]["entries"][0]["id"] == "inn"
    assert json.loads(knowledge[0]["entries"][0]["metadata_json"])["region"] == "greyfen"


def test_node_reference_errors(w):
    g = graph(node("find", retrieve("nothing-here")), node("answer", canned("a")),
              node("sorry", canned("b")))
    assert "names no embedded string storage" in create_error(
        w, g, E.GraphCompilationFailed).message
    g = graph(node("find", retrieve(top_k=0)), node("answer", canned("a")),
              node("sorry", canned("b")))
    assert "top_k 0 must be between 1 and 1000" in create_error(
        w, g, E.GraphCompilationFailed).message
    g = graph(node("find", retrieve("../x.json")), node("answer", canned("a")),
              node("sorry", canned("b")))
    create_error(w, g, E.StorageOutsideRoot)


# ---- ClassifyIntent

def test_intent_npc_routes_held_out_lines(w):
    instructions = {k: f"The player's intent is {k}." for k in INTENTS}
    aid = create(w, graph(
        node("cls", codec.ClassifyIntentParams(
            embedded_string_storage="intents/intents.json", metadata_field="intent",
            threshold=0.6, notify_client=codec.NotifyClient.OnFound,
            found_exit="route", not_found_exit="answer")),
        node("route", codec.IntentToInstructionParams(
            inline_keys=list(instructions),
            instructions=[codec.LocalizableText(text=t) for t in instructions.values()],
            instruction_name="intent", default_exit="answer")),
        node("answer", gen(max_tokens=8, template="{{instruction_intent}}",
                           placement=codec.Placement.BeforeUserAsSystem))),
        enable_diagnostics=True)
    right = 0
    for line, expected in HELD_OUT:
        frames = turn(w, aid, line)
        d = diag(frames)
        events = [f for f in frames if isinstance(f, codec.NodeEvent)]
        if d["cls"]["exit"] == "found":
            assert d["route"]["text"] == instructions[d["cls"]["intent"]]
            pairs = {kv.key: kv.value for kv in events[0].kv_pairs}
            assert events[0].event_type == "intent_classified"
            assert pairs["intent"] == d["cls"]["intent"] and pairs["found"] == "true"
        right += d["cls"].get("intent") == expected
    assert right >= 8, right


def test_classify_intent_needs_a_string_label_field(w):
    g = graph(node("cls", codec.ClassifyIntentParams(
        embedded_string_storage="lore/lore.json", metadata_field="min_level",
        found_exit="a", not_found_exit="a")), node("a", canned("x")))
    err = create_error(w, g, E.GraphCompilationFailed)
    assert "metadata_field 'min_level' is not a string field" in err.message
