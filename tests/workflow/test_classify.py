"""ClassifyIntentLLM and IntentToInstruction with the real SmolLM2: options answered by name
(calibrated by their prior) or by letter through the batched engine, found / not_found and their reasons, the sink intent, the
intent_classified event, the instruction attached from a Map storage or inline entries."""
from __future__ import annotations

import json
import math

import pytest

from tryll_fast import codec
from tryll_fast.errors import ErrorCode

from flows import canned, create, create_error, graph, node, turn

pytestmark = pytest.mark.model
G = ErrorCode.GraphCompilationFailed
Notify = codec.NotifyClient


def classify(ids: str, **kw) -> codec.ClassifyIntentLLMParams:
    kw.setdefault("found_exit", "route")
    kw.setdefault("not_found_exit", "route")
    return codec.ClassifyIntentLLMParams(intents_ids=ids, **kw)


def route(keys=(), texts=(), **kw) -> codec.IntentToInstructionParams:
    return codec.IntentToInstructionParams(
        inline_keys=list(keys), instructions=[codec.LocalizableText(text=t) for t in texts],
        instruction_name="route", default_exit="say", **kw)


def nodes_of(frames) -> dict:
    return {n["node"]: n for n in json.loads(frames[-1].debug_info)["nodes"]}


def agent(w, params, route_params=None, **kw):
    return create(w, graph(node("cls", params), node("route", route_params or route()),
                           node("say", canned("ok"))), enable_diagnostics=True, **kw)


def test_the_best_letter_routes_and_its_instruction_is_attached(w):
    aid = agent(w, classify("shop,quest,chat", intents_prompt="buying or selling goods,"
                            "asking for work or an adventure,small talk",
                            threshold=0.0, margin=0.0),
                route(("shop", "quest", "chat"),
                      ("Talk about prices.", "Offer the wolf hunt.", "Chat about {{locale}}.")))
    frames = turn(w, aid, "How much for that sword?")
    diag = nodes_of(frames)
    cls = diag["cls"]
    assert cls["exit"] == "found"
    scores = cls["scores"]
    assert list(scores) == ["A:shop", "B:quest", "C:chat"]
    assert math.isclose(sum(scores.values()), 1.0, abs_tol=1e-3)
    best = max(scores, key=scores.get)
    assert cls["intent"] == best.split(":")[1]                 # the argmax routes
    expected = {"shop": "Talk about prices.", "quest": "Offer the wolf hunt.",
                "chat": "Chat about en."}[cls["intent"]]      # rendered as Mustache
    assert diag["route"]["instruction"] == "route" and diag["route"]["text"] == expected


def test_options_are_answered_by_name_unless_two_names_start_alike(w):
    from tryll_fast.workflow.nodes.classify import _calibrated
    named = agent(w, classify("buy_bread,hire_guard,chat", threshold=0.0, margin=0.0))
    cls = nodes_of(turn(w, named, "Two loaves, please."))["cls"]
    assert cls["answered_by"] == "name" and len(cls["scores"]) == 3
    # "ask_way" and "ask_price" both start with "ask": letters tell them apart
    lettered = agent(w, classify("ask_way,ask_price", threshold=0.0, margin=0.0))
    cls = nodes_of(turn(w, lettered, "Where is the ferry?"))["cls"]
    assert cls["answered_by"] == "letter" and list(cls["scores"]) == ["A:ask_way",
                                                                      "B:ask_price"]
    # the prior divides: an option the model leans to whatever is said loses that lean
    assert _calibrated([0.6, 0.3, 0.1], [0.6, 0.3, 0.1]) == pytest.approx([1 / 3] * 3)
    assert _calibrated([0.5, 0.5], [0.8, 0.2]) == pytest.approx([0.2, 0.8])


def test_not_found_reasons_and_the_sink_intent(w):
    # nothing reaches probability 1 with a lead of 1 among three letters
    aid = agent(w, classify("a,b,c", threshold=1.0, margin=1.0))
    cls = nodes_of(turn(w, aid, "Hello there"))["cls"]
    assert cls["exit"] == "not_found"
    assert cls["not_found_reason"] in ("below_threshold", "below_margin")
    assert cls["intent"] is None
    # one intent has probability 1: found, unless it is the sink
    sink = agent(w, classify("unknown", not_found_intent="unknown"),
                 route(("unknown",), ("Say you did not understand.",)))
    diag = nodes_of(turn(w, sink, "Hello there"))
    assert diag["cls"]["exit"] == "not_found"
    assert diag["cls"]["not_found_reason"] == "sink_intent"
    assert diag["cls"]["intent"] == "unknown"                  # recorded, and mapped
    assert diag["route"]["text"] == "Say you did not understand."
    # an empty message never reaches the model
    assert nodes_of(turn(w, sink, "   "))["cls"]["not_found_reason"] == "empty_message"


def test_intent_classified_events_follow_notify_client(w):
    def events(notify, ids, **kw):
        aid = agent(w, classify(ids, notify_client=notify, **kw))
        frames = turn(w, aid, "Any work for me?")
        return [f for f in frames if isinstance(f, codec.NodeEvent)]
    [found] = events(Notify.OnFound, "work")
    assert (found.node_name, found.event_type) == ("cls", "intent_classified")
    kv = {p.key: p.value for p in found.kv_pairs}
    assert kv["intent"] == "work" and kv["found"] == "true"
    assert float(kv["probability"]) == pytest.approx(1.0)
    assert events(Notify.OnFound, "a,b", threshold=1.0, margin=1.0) == []
    [missed] = events(Notify.Always, "a,b", threshold=1.0, margin=1.0)
    assert {p.key: p.value for p in missed.kv_pairs}["found"] == "false"
    assert events(Notify.Never, "work") == []


def test_intent_to_instruction_reads_a_map_storage_inline_entries_win(w):
    w.request(codec.CreateStringStorageRequest(
        request_id=w.rid(), name="orders", kind=codec.StringStorageKind.Map,
        keys=["go", "stay"], strings=["Tell them to go.", "Tell them to stay."]))
    one = agent(w, classify("go"), route(("stay",), ("Inline stay.",), string_storage="orders"))
    assert nodes_of(turn(w, one, "hi"))["route"]["text"] == "Tell them to go."
    two = agent(w, classify("stay"), route(("stay",), ("Inline stay.",),
                                           string_storage="orders"))
    assert nodes_of(turn(w, two, "hi"))["route"]["text"] == "Inline stay."
    # an intent without an entry attaches nothing, and the turn goes on
    three = agent(w, classify("elsewhere"), route(string_storage="orders"))
    frames = turn(w, three, "hi")
    assert nodes_of(frames)["route"]["instruction"] is None
    assert frames[-1].status == codec.TurnStatus.Success


@pytest.mark.parametrize("params,words", [
    (classify(""), "intents_ids is empty"),
    (classify("a,,b"), "intents_ids entry 1 is empty"),
    (classify("a,b,a"), "names 'a' twice"),
    (classify(",".join(f"i{k}" for k in range(27))), "at most 26"),
    (classify("a,b", intents_prompt="only one"), "intents_prompt has 1 entries"),
    (classify("a", threshold=1.5), "threshold 1.5"),
    (classify("a", margin=float("nan")), "margin nan"),
    (classify("a", history_turns=-1), "history_turns -1"),
    (classify("a", notify_client=9), "notify_client 9"),
])
def test_classifier_params_are_checked(w, params, words):
    err = create_error(w, graph(node("cls", params), node("route", route()),
                                node("say", canned("ok"))), G)
    assert "node 'cls'" in err.message and words in err.message, err.message


def test_intent_to_instruction_params_are_checked(w):
    def make(params, code=G):
        return create_error(w, graph(node("route", params), node("say", canned("ok"))), code)
    err = make(route(("a", "b"), ("only one",)))
    assert "inline_keys has 2 entries and instructions 1" in err.message
    w.request(codec.CreateStringStorageRequest(request_id=w.rid(), name="a list",
                                               strings=["x"]))
    err = make(route(string_storage="a list"), ErrorCode.StorageKindMismatch)
    assert "'a list' is a List" in err.message
    err = make(route(("a",), ("{{#open}}",)))
    assert "instruction for 'a'" in err.message


# ---- ClassifyAttributesLLM

def attribute(name, question, options, target="", descriptions=()):
    return codec.AttributeDefinition(name=name, question=question, options=list(options),
                                     option_descriptions=list(descriptions),
                                     target_variable=target)


def attributes_agent(w, attrs, **kw):
    kw.setdefault("found_exit", "note")
    kw.setdefault("not_found_exit", "note")
    return create(w, graph(
        node("attrs", codec.ClassifyAttributesLLMParams(attributes=attrs, **kw)),
        node("note", codec.InstructionParams(
            instruction="tone={{attribute_tone}} mood={{var.mood}}", default_exit="say")),
        node("say", canned("ok"))), enable_diagnostics=True,
        variables=[codec.AgentVariable(name="mood", value=codec.VarString(value="unknown"))])


def variable(w, aid, name):
    snap = w.request(codec.GetAgentVariablesRequest(request_id=w.rid(), agent_id=aid))
    return {v.name: v.value.value for v in snap.variables}[name]


def test_attributes_resolve_into_variables_templates_and_an_event(w):
    aid = attributes_agent(w, [
        attribute("tone", "How does the player speak?", ("polite", "rude")),
        attribute("topic", "What does the player talk about?", ("trade", "travel", "other"),
                  target="mood", descriptions=("buying or selling", "roads and places",
                                               "anything else"))],
        threshold=0.0, notify_client=Notify.OnFound)
    frames = turn(w, aid, "Please, kind sir, how much for the bread?")
    d = nodes_of(frames)["attrs"]
    assert d["exit"] == "found"
    table = d["attributes"]
    for name, n in (("tone", 2), ("topic", 3)):
        assert table[name]["resolved"] and len(table[name]["scores"]) == n
        assert math.isclose(sum(table[name]["scores"].values()), 1.0, abs_tol=1e-3)
        best = max(table[name]["scores"], key=table[name]["scores"].get)
        assert table[name]["value"] == best.split(":")[1]     # the argmax is the value
    assert variable(w, aid, "mood") == table["topic"]["value"]
    note = nodes_of(frames)["note"]["text"]
    assert note == f"tone={table['tone']['value']} mood={table['topic']['value']}"
    [event] = [f for f in frames if isinstance(f, codec.NodeEvent)]
    kv = {p.key: p.value for p in event.kv_pairs}
    assert event.event_type == "attributes_classified"
    assert kv["tone"] == table["tone"]["value"] and kv["topic"] == table["topic"]["value"]
    assert 0.0 < float(kv["tone.probability"]) <= 1.0


def test_an_unresolved_attribute_keeps_its_variable_and_routes_not_found(w):
    aid = attributes_agent(w, [attribute("tone", "How does the player speak?",
                                         ("polite", "rude"), target="mood")],
                           threshold=1.0, notify_client=Notify.Always)
    frames = turn(w, aid, "Hello.")
    d = nodes_of(frames)["attrs"]
    assert d["exit"] == "not_found" and d["attributes"]["tone"]["resolved"] is False
    assert variable(w, aid, "mood") == "unknown"
    [event] = [f for f in frames if isinstance(f, codec.NodeEvent)]
    assert {p.key: p.value for p in event.kv_pairs}["tone"] == ""


@pytest.mark.parametrize("attrs, message", [
    ([], "attributes is empty"),
    ([attribute("a", "q?", ("x",))], "1 options; 2 to 26"),
    ([attribute("a", "q?", ("x", "x"))], "options must be non-empty and distinct"),
    ([attribute("a", "", ("x", "y"))], "question is empty"),
    ([attribute("a", "q?", ("x", "y")), attribute("a", "q?", ("x", "y"))],
     "attributes[1]: name 'a' is empty or repeated"),
    ([attribute("a", "q?", ("x", "y"), descriptions=("only one",))],
     "option_descriptions has 1 entries for 2 options"),
    ([attribute("a", "q?", ("x", "y"), target="ghost")],
     "target_variable 'ghost' is not a declared string variable"),
])
def test_attribute_definitions_are_checked(w, attrs, message):
    g = graph(node("attrs", codec.ClassifyAttributesLLMParams(
        attributes=attrs, found_exit="say", not_found_exit="say")), node("say", canned("ok")))
    err = create_error(w, g, G)
    assert message in err.message, err.message
