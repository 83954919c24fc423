"""The Summarize node: which interactions a run folds, where the running summary lands and
how every prompt shows it (after the system prompt, the interactions it stands for left
out, the shared prefix untouched), snapshots, the node's params, and over the wire: the
summary runs in the background, lands for the next turn, is cancelled with its agent, and
a 300-turn conversation keeps its window, and the fact of turn 5 reaches the summary."""
from __future__ import annotations

import json
import time

import pytest

from tryll_fast import codec
from tryll_fast.errors import ErrorCode
from tryll_fast.workflow import snapshot
from tryll_fast.workflow.dialog import Component, Dialog, Interaction
from tryll_fast.workflow.graph import Graph
from tryll_fast.workflow.nodes.summarize import (dialog_text, grounded, merge_notes,
                                                 parse_notes,
                                                 plan_fold, player_statements,
                                                 still_applies)
from tryll_fast.workflow.projection import SUMMARY_LABEL, Projection

from flows import SMOL, create, create_error, gen, graph, node, texts, turn

G = ErrorCode.GraphCompilationFailed
SYSTEM = "You are Brenna, the baker of Oakvale. Answer in one short sentence."


def scripted(n: int, start: int = 1) -> Dialog:
    d = Dialog()
    for i in range(start, start + n):
        d.append_scripted(f"question {i}", f"answer {i}")
    return d


def add_summary(inter: Interaction, text: str, count: int) -> Component:
    return inter.add(Component(kind="summary", slot="sum", text=text, node_name="sum",
                               role="system", extra={"count": count}))


def plan(d: Dialog, current, keep=4, turns=8, ratio=0.0, n_ctx=2048, count=None):
    def never(_inter):
        raise AssertionError("tokens counted for a trigger that does not need them")
    return plan_fold(d, current, keep_recent=keep, trigger_turns=turns, trigger_ratio=ratio,
                     n_ctx=n_ctx, count_tokens=count or never)


# ---- which interactions a run folds ----

def test_the_turn_trigger_folds_all_but_the_recent_ones():
    d = scripted(11)
    current = d.begin("now")
    assert plan(d, current) is None                    # 7 foldable < 8
    d = scripted(12)
    current = d.begin("now")
    p = plan(d, current)
    assert p.trigger == "turns" and p.previous is None and p.covered == 0
    assert [i.user_text for i in p.fold] == [f"question {i}" for i in range(1, 9)]
    assert p.holder is d.interactions[8] and p.count == 8   # the first kept verbatim


def test_a_run_folds_only_what_the_running_summary_does_not_cover():
    d = scripted(20)
    old = add_summary(d.interactions[8], "Earlier.", 8)
    current = d.begin("now")
    p = plan(d, current)
    assert p.previous is old and p.covered == 8 and p.count == 16
    assert [i.id for i in p.fold] == list(range(9, 17)) and p.holder.id == 17
    d = scripted(15)
    add_summary(d.interactions[8], "Earlier.", 8)
    assert plan(d, d.begin("now")) is None            # 7 unsummarized - 4 kept = 3


def test_keep_recent_turns_zero_lands_on_the_current_interaction():
    d = scripted(8)
    current = d.begin("now")
    p = plan(d, current, keep=0)
    assert len(p.fold) == 8 and p.holder is current and p.count == 8


def test_the_token_trigger_counts_the_unsummarized_dialog():
    counted = []

    def count(inter):
        counted.append(inter.id)
        return 10

    d = scripted(6)
    p = plan(d, d.begin("now"), keep=2, turns=0, ratio=0.5, n_ctx=100, count=count)
    assert p.trigger == "tokens" and p.unsummarized_tokens == 60 and len(p.fold) == 4
    assert sorted(counted) == list(range(1, 7))         # the kept ones count too
    d = scripted(5)
    assert plan(d, d.begin("now"), keep=2, turns=0, ratio=0.5, n_ctx=100,
                count=count) is None                    # 50 is not over 50
    d = scripted(3)
    assert plan(d, d.begin("now"), keep=4, turns=0, ratio=0.01, n_ctx=100,
                count=count) is None                    # nothing to fold: all are kept


def test_a_summary_lands_only_on_the_dialog_it_was_made_for():
    d = scripted(12)
    current = d.begin("now")
    p = plan(d, current)
    assert still_applies(d, p)
    d.append_scripted("later", "still fine")               # appending changes nothing
    assert still_applies(d, p)
    d.remove_from_end(6)                                    # the holder went
    assert not still_applies(d, p)
    d = scripted(12)
    p = plan(d, d.begin("now"))
    d.replace([Interaction(id=i.id, outcome="completed", components=list(i.components))
               for i in d.interactions])                    # an import: new interactions
    assert not still_applies(d, p)
    d = scripted(12)
    p = plan(d, d.begin("now"))
    add_summary(d.interactions[10], "Someone else's.", 10)  # another summary came first
    assert not still_applies(d, p)


def test_the_folded_dialog_reads_as_lines():
    d = scripted(2)
    assert dialog_text(d.interactions) == ("Player: question 1\nNPC: answer 1\n"
                                           "Player: question 2\nNPC: answer 2")
    assert dialog_text(d.interactions[:1], cut=3) == "Player: que...\nNPC: ans..."


def test_notes_are_taken_from_the_players_statements_only():
    d = Dialog()
    d.append_scripted("I'm Aldric. Where is the inn?", "By the well.")
    d.append_scripted("What smells so good?", "Rye bread, love.")
    d.append_scripted("My sister Mira waits at home! Is it far?", "Not far.")
    assert player_statements(d.interactions) == ["I'm Aldric.", "My sister Mira waits at home!"]
    assert player_statements(d.interactions[:1], cut=4) == ["I'm"]


def test_a_reply_becomes_notes_without_questions_or_nothing():
    reply = ("- The player is Aldric.\n- The player said: \"Is it far?\"\n"
             "- Nothing\n\n* The player has a horse called Thistle. - The player owes 12 silver.")
    assert parse_notes(reply) == ["The player is Aldric.",
                                  "The player has a horse called Thistle.",
                                  "The player owes 12 silver."]
    assert parse_notes("- Nothing") == parse_notes("The player said nothing.") == []


def test_a_note_is_kept_only_when_the_players_words_ground_it():
    said = "I'm Aldric, by the way. My horse is a grey mare called Thistle. Those rolls look crusty."
    assert grounded("The player is Aldric.", said)
    assert grounded("The player's horse is a grey mare called Thistle.", said)
    assert grounded("The player has a grey mare.", said)
    assert not grounded("The player has a favorite TV show.", said)
    assert not grounded("John is from Highbarrow.", said)
    assert not grounded("The player said:", said)


def test_notes_are_appended_never_rewritten():
    old = "The player is Aldric.\nThe player is a stonemason."
    assert merge_notes(old, ["the player is aldric", "The player likes pie."]) == (
        old + "\nThe player likes pie.")
    assert merge_notes("", []) == ""


# ---- how prompts show it ----

@pytest.fixture(scope="module")
def engine(model_file):
    from tryll_fast.engines.llama import LlamaEngine
    with LlamaEngine(model_file(SMOL), n_ctx=2048, n_slots=1, n_batch=64) as eng:
        yield eng


def build(engine, d: Dialog, text="What now?", n_ctx=2048, reserve=64, template="", **kw):
    current = d.begin(text)
    try:
        proj = Projection(engine, engine.chat_formatter())
        return proj.build(d, current, system_prompt=SYSTEM, template_text=template,
                          placement=codec.Placement.BeforeUserAsSystem, input_text=text,
                          n_ctx=n_ctx, reserve=reserve, **kw)
    finally:
        d.remove(current)


@pytest.mark.model
def test_the_summary_follows_the_system_prompt_and_replaces_what_it_covers(engine):
    d = scripted(12)
    add_summary(d.interactions[8], "The player is Aldric; he seeks the silver key.", 8)
    p = build(engine, d)
    assert p.messages[0] == {"role": "system", "content": SYSTEM}
    assert p.messages[1] == {"role": "system", "content": f"{SUMMARY_LABEL}\nThe player is "
                                                          "Aldric; he seeks the silver key."}
    users = [m["content"] for m in p.messages if m["role"] == "user"]
    assert users == [f"question {i}" for i in range(9, 13)] + ["What now?"]
    assert p.summarized == 8 and p.window == 4
    assert p.text.index(SYSTEM) < p.text.index(SUMMARY_LABEL) < p.text.index("question 9")
    assert not any(m["content"] in ("question 1", "answer 8") for m in p.messages)


@pytest.mark.model
def test_the_summary_is_never_in_the_shared_prefix(engine):
    plain = build(engine, scripted(12))
    d = scripted(12)
    add_summary(d.interactions[8], "The player is Aldric.", 8)
    with_summary = build(engine, d)
    d = scripted(12)
    add_summary(d.interactions[8], "The player is Mira, a bard from the coast.", 8)
    other = build(engine, d)
    n = with_summary.shared_prefix_len
    # the system part is the same tokens with or without a summary, and two agents with
    # the same system prompt but different summaries share the same prefix
    assert 0 < n <= plain.shared_prefix_len and n == other.shared_prefix_len
    assert with_summary.tokens[:n] == plain.tokens[:n] == other.tokens[:n]
    assert "Aldric" not in engine.detokenize(with_summary.tokens[:n])
    # it ends where the next message's role starts, exactly as when that message is a
    # system message anyway (a template placed before the player's words, no history)
    assert build(engine, Dialog(), template="A rule.").shared_prefix_len == n


@pytest.mark.model
def test_bounded_histories_get_no_summary(engine):
    d = scripted(12)
    add_summary(d.interactions[8], "The player is Aldric.", 8)
    p = build(engine, d, max_history=2)
    assert SUMMARY_LABEL not in p.text and p.summarized == 0
    assert [m["content"] for m in p.messages if m["role"] == "user"] == [
        "question 11", "question 12", "What now?"]


@pytest.mark.model
def test_the_summary_is_pinned_while_the_window_drops(engine):
    d = scripted(40)
    add_summary(d.interactions[8], "The player is Aldric.", 8)
    p = build(engine, d, n_ctx=400, reserve=64)
    assert SUMMARY_LABEL in p.text and p.dropped > 0 and len(p.tokens) <= 400 - 64
    users = [m["content"] for m in p.messages if m["role"] == "user"]
    assert p.summarized == 8 and users[0] == f"question {9 + p.dropped}"


@pytest.mark.model
def test_a_snapshot_keeps_the_summary_and_projects_the_same(engine):
    d = scripted(12)
    add_summary(d.interactions[8], "The player is Aldric.", 8)
    data = snapshot.encode(d.interactions, Graph({}, ""), "en")
    s = codec.decode_root(codec.PersistedDialogSnapshot, data).to_dict()
    body = s["interactions"][8]["components"][-1]["body"]
    assert body == {"PersistedSummary": {"text": "The player is Aldric.",
                                         "summarized_interaction_count": 8}}
    imported = Dialog()
    imported.replace(snapshot.parse(data).interactions)
    a, b = build(engine, d), build(engine, imported)
    assert a.text == b.text and a.tokens == b.tokens and b.summarized == 8
    assert a.shared_prefix_len == b.shared_prefix_len


# ---- params ----

def summarize(**kw) -> codec.SummarizeParams:
    return codec.SummarizeParams(**kw)


@pytest.mark.model
@pytest.mark.parametrize("params,words", [
    (summarize(keep_recent_turns=-1), "keep_recent_turns -1 is negative"),
    (summarize(trigger_turns=-2), "trigger_turns -2 is negative"),
    (summarize(trigger_token_ratio=1.5), "trigger_token_ratio 1.5 must be between 0 and 1"),
    (summarize(trigger_token_ratio=-0.25), "trigger_token_ratio -0.25 must be between 0"),
    (summarize(trigger_token_ratio=float("nan")), "trigger_token_ratio nan must be between"),
    (summarize(max_summary_tokens=0), "max_summary_tokens 0 must be > 0"),
    (summarize(max_summary_tokens=-5), "max_summary_tokens -5 must be > 0"),
    (summarize(context_size=512, max_summary_tokens=512),
     "max_summary_tokens 512 must be smaller than the node's context size 512"),
    (summarize(context_size=-1), "context_size -1 is negative"),
    (summarize(context_size=1 << 20), "context_size 1048576 exceeds"),
    (summarize(template="{{#summary}}"), "template: Mustache syntax error"),
    (summarize(model_name="no-such-model"), "no-such-model"),
])
def test_bad_params_are_3003_naming_the_field(w, params, words):
    err = create_error(w, graph(node("sum", params)), G)
    assert "node 'sum'" in err.message and words in err.message, err.message


@pytest.mark.model
def test_change_agent_param_checks_the_same_with_3007(w):
    aid = create(w, graph(node("sum", summarize())))

    def change(params, code=None):
        body = codec.ChangeAgentParamRequest(request_id=w.rid(), agent_id=aid,
                                             node_name="sum", params=params)
        return w.request(body) if code is None else w.expect_error(body, code)

    err = change(summarize(trigger_token_ratio=2.0), ErrorCode.InvalidParamValue)
    assert "trigger_token_ratio 2.0 must be between 0 and 1" in err.message
    err = change(summarize(keep_recent_turns=-3), ErrorCode.InvalidParamValue)
    assert "keep_recent_turns -3 is negative" in err.message
    err = change(summarize(max_summary_tokens=64), ErrorCode.ParamNotMutable)
    assert "SummarizeParams.max_summary_tokens" in err.message
    assert isinstance(change(summarize(keep_recent_turns=2, trigger_turns=0,
                                       system_prompt="Be brief.")), codec.Ack)


# ---- over the wire ----

REWRITE = "You keep a short summary of a conversation between a player and a villager."
FACT = "Hello! My name is Aldric and I am on a quest to find the silver key of Greyfen."
TOPICS = ["the weather", "the price of bread", "the old mill", "the river fish",
          "the harvest festival", "the blacksmith", "the village well", "the night watch",
          "the herb garden", "the tavern songs", "the market day", "the church bells",
          "the apple orchard", "the fishing boats", "the town guard", "the spring fair"]


def filler(n: int, start: int = 0) -> list:
    out = []
    for i in range(start, start + n):
        t = TOPICS[i % len(TOPICS)]
        out.append(codec.DialogInteraction(
            user_message=f"What do you think about {t}?",
            assistant_message=f"Ah, {t}! Everyone in Oakvale talks about {t} these days."))
    return out


def append(w, aid, pairs) -> None:
    r = w.request(codec.AppendInteractionsRequest(request_id=w.rid(), agent_id=aid,
                                                  interactions=pairs))
    assert isinstance(r, codec.AppendInteractionsResponse) and r.appended_count == len(pairs)


def summaries(w, aid) -> list[tuple[int, dict]]:
    """(interaction_id, PersistedSummary) of every summary in the exported dialog."""
    r = w.request(codec.ExportDialogRequest(request_id=w.rid(), agent_id=aid))
    snap = codec.decode_root(codec.PersistedDialogSnapshot, bytes(r.snapshot)).to_dict()
    return [(i["interaction_id"], c["body"]["PersistedSummary"])
            for i in snap["interactions"] for c in i["components"]
            if "PersistedSummary" in c["body"]]


def wait_for_summary(w, aid, after: int = 0, timeout: float = 300.0) -> dict:
    """The newest summary once one standing for more than `after` interactions landed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = summaries(w, aid)
        if found and found[-1][1]["summarized_interaction_count"] > after:
            return found[-1][1]
        time.sleep(0.2)
    raise AssertionError(f"no summary of more than {after} interactions after {timeout} s")


def diag(frames, node_name: str) -> dict:
    info = json.loads(frames[-1].debug_info)
    return next(n for n in info["nodes"] if n["node"] == node_name)


def events(frames) -> list[tuple[str, dict]]:
    return [(f.event_type, {p.key: p.value for p in f.kv_pairs}) for f in frames
            if isinstance(f, codec.NodeEvent)]


def chat(max_tokens=24, n_ctx=0, **sum_kw):
    return graph(node("answer", gen(max_tokens=max_tokens, system_prompt=SYSTEM,
                                    context_size=n_ctx, default_exit="sum")),
                 node("sum", summarize(**sum_kw)))


@pytest.mark.model
def test_the_summary_lands_in_the_background_and_the_next_turn_uses_it(w):
    # a system prompt of the game's: the rewritten summary (notes are tested below)
    aid = create(w, chat(keep_recent_turns=2, trigger_turns=4, max_summary_tokens=64,
                         system_prompt=REWRITE),
                 enable_diagnostics=True)
    append(w, aid, [codec.DialogInteraction(user_message=FACT,
                                            assistant_message="Welcome, Aldric!")]
           + filler(5))
    frames = turn(w, aid, "Do you bake cakes?")
    # the node started it and exited at once: the turn did not wait for the summary
    assert events(frames) == [("summary_started", {"interactions": "4", "folding": "4",
                                                   "trigger": "turns"})]
    d = diag(frames, "sum")
    assert d["summary"] == "started" and d["exit"] == "default" and d["folding"] == 4
    assert d["summarized"] == 0 and d["unsummarized"] == 6
    summary = wait_for_summary(w, aid)
    assert summary["summarized_interaction_count"] == 4
    assert summary["text"]
    frames = turn(w, aid, "What did I tell you?")
    p = diag(frames, "answer")
    assert p["summarized_interactions"] == 4 and p["history_interactions"] == 3
    assert f"{SUMMARY_LABEL}\n{summary['text']}" in p["prompt"]
    # the interaction it stands for is left out (its statement may be copied into a note)
    assert "Welcome, Aldric!" not in p["prompt"] and f"user\n{FACT}" not in p["prompt"]
    d = diag(frames, "sum")
    assert d["summary"] == "not_triggered" and d["summarized"] == 4
    assert d["last_summary"]["status"] == "written" and d["last_summary"]["interactions"] == 4
    # the summary sits on the first interaction kept verbatim, and travels with the dialog
    assert [i for i, _ in summaries(w, aid)] == [5]
    data = bytes(w.request(codec.ExportDialogRequest(request_id=w.rid(),
                                                     agent_id=aid)).snapshot)
    other = create(w, chat(keep_recent_turns=2, trigger_turns=4, max_summary_tokens=64,
                           system_prompt=REWRITE),
                   enable_diagnostics=True)
    r = w.request(codec.ImportDialogRequest(request_id=w.rid(), agent_id=other, snapshot=data))
    assert isinstance(r, codec.ImportDialogResponse), r
    a = diag(turn(w, aid, "And the bread?"), "answer")
    b = diag(turn(w, other, "And the bread?"), "answer")
    assert a["prompt"] == b["prompt"] and a["prompt_tokens"] == b["prompt_tokens"]


@pytest.mark.model
def test_the_built_in_summary_keeps_notes_and_never_loses_one(w, model_file):
    """Without a template or system prompt the node keeps notes of the player's own
    statements: a fold of questions alone lands at once without asking the model, and
    the notes of the first fold are still there, word for word, after later folds. On the
    catalog's default model: SmolLM2-135M's notes are mostly invented, and left out."""
    from tryll_fast.models import load_catalog
    from tryll_fast.server.server import default_llm
    model = default_llm(load_catalog(), "")
    model_file(model)
    aid = create(w, chat(keep_recent_turns=1, trigger_turns=3, max_summary_tokens=96),
                 enable_diagnostics=True, default_model=model)
    append(w, aid, [codec.DialogInteraction(user_message=FACT,
                                            assistant_message="Welcome, Aldric!")]
           + filler(3))
    turn(w, aid, "Do you bake cakes?")
    first = wait_for_summary(w, aid)
    assert "Aldric" in first["text"]
    covered = first["summarized_interaction_count"]
    append(w, aid, filler(3, 3))
    frames = turn(w, aid, "Do you bake pies?")
    assert events(frames)[0][0] == "summary_started"
    second = wait_for_summary(w, aid, covered)
    d = diag(turn(w, aid, "And buns?"), "sum")
    assert d["last_summary"]["status"] == "written"
    assert d["last_summary"]["prompt_tokens"] == d["last_summary"]["summary_tokens"] == 0
    assert second["text"] == first["text"]


@pytest.mark.model
def test_one_summarization_at_a_time_and_destroy_cancels_it(server, w):
    g = graph(node("sum", summarize(keep_recent_turns=0, trigger_turns=2,
                                    default_exit="reply")),
              node("reply", codec.CannedResponseParams(
                  lines=[codec.LocalizableText(text="Mm-hm.")])))
    aid = create(w, g, enable_diagnostics=True)
    # a statement to take notes of: a fold of questions alone lands at once, unasked
    append(w, aid, [codec.DialogInteraction(user_message=FACT, assistant_message="Welcome!")]
           + filler(3))
    first = turn(w, aid, "Tell me everything.")
    assert events(first)[0][0] == "summary_started"
    second = turn(w, aid, "And then?")              # sent at once: the first still runs
    assert events(second) == [] and diag(second, "sum")["summary"] == "running"
    agent = server.agents[aid]
    state = agent.node_state("sum")
    assert state["job"] is not None and agent.background
    assert isinstance(w.request(codec.DestroyAgentRequest(request_id=w.rid(), agent_id=aid)),
                      codec.Ack)
    deadline = time.monotonic() + 30
    while "last" not in state and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state["last"]["status"] == "cancelled" and not agent.background


@pytest.mark.model
def test_a_failed_summarization_leaves_the_dialog_as_it_was(w):
    # the instruction alone overflows the node's window: the request is never built
    aid = create(w, chat(keep_recent_turns=1, trigger_turns=2, context_size=128,
                         max_summary_tokens=16, system_prompt="Summarize. " * 80),
                 enable_diagnostics=True)
    append(w, aid, filler(3))
    assert events(turn(w, aid, "Hello?"))[0][0] == "summary_started"
    deadline = time.monotonic() + 60
    while True:
        d = diag(turn(w, aid, "Still there?"), "sum")
        if "last_summary" in d or time.monotonic() > deadline:
            break
    assert d["last_summary"]["status"] == "failed"
    assert "do not fit" in d["last_summary"]["error"]
    assert summaries(w, aid) == []


@pytest.mark.model
@pytest.mark.timeout(900)
def test_three_hundred_turns_keep_the_window_and_the_fact(w, record_property, model_file):
    """Turns 1-4 and most others are scripted (AppendInteractions); a real turn comes every
    36, and each starts a summary of what came since the last one, which the next real turn
    waits for. The prompt stays within the Generate node's window throughout, the summary
    holds what the player said at turn 5 through every rewrite on the catalog's default
    model (SmolLM2-135M loses it within a few), and at turn 300 they ask for it. Whether
    the model answers from the summary is measured, not asserted: the gate
    long_dialog_recall_turn300 of make eval (docs/npc-quality.md)."""
    from tryll_fast.models import load_catalog
    from tryll_fast.server.server import default_llm
    model = default_llm(load_catalog(), "")
    model_file(model)
    n_ctx, max_tokens, block = 1024, 32, 35
    aid = create(w, chat(max_tokens=max_tokens, n_ctx=n_ctx, context_size=2048,
                         max_summary_tokens=64), enable_diagnostics=True,
                 default_model=model)
    append(w, aid, filler(4))
    prompts, waits, covered, texts_ = [], [], 0, []
    frames = turn(w, aid, FACT)                                   # turn 5
    prompts.append(diag(frames, "answer"))
    at = 5
    while True:
        n = min(block, 299 - at)
        append(w, aid, filler(n, at))
        at += n
        if at == 299:
            break
        frames = turn(w, aid, f"What do you think about {TOPICS[at % len(TOPICS)]}?")
        at += 1
        prompts.append(diag(frames, "answer"))
        if any(kind == "summary_started" for kind, _ in events(frames)):
            t0 = time.monotonic()
            landed = wait_for_summary(w, aid, covered)
            covered = landed["summarized_interaction_count"]
            texts_.append(landed["text"])
            waits.append(round(time.monotonic() - t0, 1))
    frames = turn(w, aid, "What is my name, and what is my quest?")   # turn 300
    final = diag(frames, "answer")
    prompts.append(final)
    start = final["prompt"].index(SUMMARY_LABEL)
    summary = final["prompt"][start:final["prompt"].index("<|im_end|>", start)]
    answer = texts(frames, "answer")
    record_property("first_summary", texts_[0])
    record_property("summary_at_turn_300", summary)
    record_property("answer_at_turn_300", answer)
    print(f"\nfirst summary: {texts_[0]!r}\n"
          f"summary at turn 300: {summary!r}\nanswer at turn 300: {answer!r}\n"
          f"prompt tokens of the real turns: {[p['prompt_tokens'] for p in prompts]}\n"
          f"seconds waited for each summary: {waits}")
    assert len(summaries(w, aid)) == len(waits) >= 7
    for p in prompts:
        assert p["prompt_tokens"] <= n_ctx - max_tokens, p["prompt_tokens"]
    # at turn 300 the window holds the summary and the interactions since the last one,
    # far from the point where the window would have to drop some
    assert final["summarized_interactions"] == covered >= 250
    assert final["history_interactions"] == 299 - covered and final["dropped_interactions"] == 0
    # the fact of turn 5 reaches the running summary, survives every rewrite and is in the
    # prompt of turn 300
    assert "Aldric" in texts_[0], texts_[0]
    assert all("Aldric" in t for t in texts_), texts_
    assert SUMMARY_LABEL in final["prompt"] and texts_[-1] in final["prompt"]
    assert "Aldric" in summary, summary
