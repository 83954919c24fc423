"""Summarize: folds older interactions into the dialog's running summary (docs/workflow.md).

A long conversation pushes its start out of the window; a summary keeps what was said
there. When the node runs and a trigger fires, the interactions before the last
`keep_recent_turns` that the running summary does not cover yet are folded, with that
summary, into a new one: one greedy request of at most `max_summary_tokens` on the node's
model, through the same batched engine as Generate.

The node never waits for it. The request is background work: it is submitted with the
Background priority, so the engine admits it after interactive requests, its prompt is
decoded only while no interactive request is waiting for its first token, and under a
throttle it is left out of steps while interactive ones run. The node takes default_exit
at once; the summary lands in the dialog when it is done, as a "summary" component on the
first interaction kept verbatim with `count` = how many of the dialog's first interactions
it stands for (PersistedSummary in snapshots), and from then on every projection shows it
after the system prompt instead of those interactions (projection.py).

Triggers: at least `trigger_turns` (> 0) foldable interactions, or the unsummarized dialog
(the kept ones included) over `trigger_token_ratio` x the node's context size, counted in
the node's model's tokens. Both 0: the node does nothing. One summarization per agent and
node at a time: while one runs, the node only reports it. A summarization that does not
land leaves the dialog as it was: it failed (an engine error, an empty reply: logged, and
in the node's next diagnostics), the dialog changed under it (an edit, an import, a failed
turn that took the interaction it was to land on), or the agent was destroyed (destroy()
cancels it).

Two forms. With a `template` or `system_prompt` of the game's, the request is that
template over the previous summary and the folded dialog, and its reply replaces the
summary. Without either, the summary is notes about the player: the model is asked for
notes from the player's statements in the fold, and they are appended to the previous
notes (which are never rewritten) when the player's words ground them; notes past
max_summary_tokens are left off at the end.

When the folded dialog and the previous summary do not fit the node's window (context
size minus max_summary_tokens), fewer interactions are folded (the rest wait for the next
run); a single one too long for it is cut.

Event: NodeEvent `summary_started` {interactions: how many interactions the new summary is
to stand for, folding: how many of them are new, trigger: turns | tokens}, sent by the node
when it starts one. Diagnostics (the node's entry): `summary` (started / running /
not_triggered / off), `summarized` and `unsummarized` interactions, for a start `trigger`,
`folding`, `interactions` and `unsummarized_tokens` (when counted), and `last_summary`, the
outcome of the latest summarization that ended: status (written / failed / discarded /
cancelled), interactions, prompt_tokens, summary_tokens, ms, error.
"""
from __future__ import annotations

import asyncio
import logging
import math
import re
import time
from dataclasses import dataclass

from tryll_fast import codec
from tryll_fast.engines.roles import Priority, SamplingParams
from tryll_fast.workflow.dialog import USER_SLOT, Component, Dialog, Interaction
from tryll_fast.workflow.graph import CompileContext, Node, NodeType
from tryll_fast.workflow.nodes.generate import compile_template_field
from tryll_fast.workflow.nodes.llm import compile_llm
from tryll_fast.workflow.projection import ProjectionError
from tryll_fast.workflow.templates import compile_template
from tryll_fast.workflow.turn import _settle

log = logging.getLogger("tryll_fast.workflow")

# Written as the memory the character keeps about the player: small models then open
# with who the player is and what they want, the facts a long chat must not lose. They
# follow an instruction best right after the text it is about, so the request ends with it.
BUILTIN_INSTRUCTION = (
    "You write the memory a game character (the NPC) keeps about the player: who the "
    "player is, what they want, and what was agreed. Keep it short and factual.")
BUILTIN_TEMPLATE = compile_template(
    "{{#summary}}Memory so far: {{summary}}\n\n{{/summary}}New conversation:\n{{dialog}}\n\n"
    "Write the updated memory in a few short sentences: the player's name, what the player "
    "wants, and the other facts worth remembering.")
# Without a template or system prompt of its own, the node keeps notes instead of
# rewriting a summary. A small model asked to rewrite its summary with each new part of
# the conversation loses a little every time: on Qwen2.5-Coder-0.5B, four of ten facts the
# player gave in the first turns were left after 300 turns, beside copied dialog lines.
# Notes are asked of the player's own statements only (questions state nothing about the
# player; the NPC's lines are not about the player), and the previous notes are never
# rewritten: new ones are appended, so a fact, once noted, stays. The 0.5B also invents
# notes ("Those rolls look crusty." gave "The player has a favorite TV show"), so a note
# is kept only when most of its words are the player's own. Asked to shorten its notes
# when they outgrew max_summary_tokens, it rewrote ten true facts into invented ones, so
# notes that do not fit are left off instead.
NOTES_INSTRUCTION = "You take notes about a person from what they say."
# One note per line of the player's, in order: asked instead for notes by kind (home,
# work, belongings), the 0.5B filed "a stonemason by trade" under belongings and dropped
# the sister and the debt; asked line by line, it kept every fact, mostly as quotes.
# At most this many lines of the player's a request: given eight, the 0.5B left out the
# last one now and then.
NOTES_BATCH = 4
NOTES_REQUEST = (
    "The player said:\n{lines}\n\nFor each line, write one short note about the player "
    "starting with \"- The player\", in the same order. Skip lines that say nothing about "
    "the player.")
_SPEAKERS = {"user": "Player", "assistant": "NPC"}
_MAX_CUTS = 12              # halvings of one interaction's text before giving up


@dataclass
class FoldPlan:
    """What one summarization folds, and where its summary lands."""
    previous: Component | None      # the running summary it extends
    covered: int                    # the dialog's first interactions `previous` stands for
    fold: list[Interaction]         # the interactions to fold in, oldest first
    holder: Interaction             # the first one kept verbatim: the summary goes there
    trigger: str                    # turns | tokens
    unsummarized_tokens: int | None = None

    @property
    def count(self) -> int:
        return self.covered + len(self.fold)


def plan_fold(dialog: Dialog, current: Interaction, *, keep_recent: int, trigger_turns: int,
              trigger_ratio: float, n_ctx: int, count_tokens) -> FoldPlan | None:
    """The fold a run of the node starts, or None when no trigger fires. `count_tokens`
    (an interaction -> its tokens) is only called for the token trigger."""
    previous, covered = dialog.running_summary()
    earlier = [i for i in dialog.interactions if i is not current]
    unsummarized = earlier[covered:]
    n_fold = len(unsummarized) - keep_recent
    if n_fold <= 0:
        return None
    trigger, tokens = None, None
    if trigger_turns > 0 and n_fold >= trigger_turns:
        trigger = "turns"
    elif trigger_ratio > 0:
        tokens = sum(count_tokens(i) for i in unsummarized)
        if tokens > trigger_ratio * n_ctx:
            trigger = "tokens"
    if trigger is None:
        return None
    holder = unsummarized[n_fold] if n_fold < len(unsummarized) else current
    return FoldPlan(previous, covered, unsummarized[:n_fold], holder, trigger, tokens)


def still_applies(dialog: Dialog, plan: FoldPlan) -> bool:
    """Is the dialog still the one the plan was made on, as far as the summary goes: the
    same running summary, the folded interactions where they were, the holder after them?
    (Edits only remove from the end or replace everything, so the interactions before an
    unchanged summary are unchanged.)"""
    inters = dialog.interactions
    n = plan.count
    if len(inters) <= n or inters[n] is not plan.holder:
        return False
    if dialog.running_summary()[0] is not plan.previous:
        return False
    return all(a is b for a, b in zip(inters[plan.covered:n], plan.fold))


def dialog_text(interactions, cut: int | None = None) -> str:
    """The interactions as "Player: ..." / "NPC: ..." lines (tool results by name); `cut`
    keeps only that many characters of each message."""
    lines = []
    for inter in interactions:
        for m in inter.messages():
            text = m["content"] or ""
            if cut is not None and len(text) > cut:
                text = text[:cut] + "..."
            if not text:
                continue
            speaker = _SPEAKERS.get(m["role"]) or f"Tool {m.get('name') or ''}".strip()
            lines.append(f"{speaker}: {text}")
    return "\n".join(lines)


class SummaryJob:
    """One summarization in flight; cancel() from any thread (Agent.destroy)."""

    def __init__(self, plan: FoldPlan) -> None:
        self.plan = plan
        self.cancelled = False
        self.handle = None
        self.task: asyncio.Task | None = None
        self.started = time.perf_counter()

    def cancel(self) -> None:
        self.cancelled = True
        handle = self.handle
        if handle is not None:
            handle.cancel()


class SummarizeNode(NodeType):
    kind = "Summarize"
    params_cls = codec.SummarizeParams
    exits = ("default",)

    def compile(self, name: str, p, ctx: CompileContext):
        where = f"node {name!r}"
        for field in ("keep_recent_turns", "trigger_turns"):
            if getattr(p, field) < 0:
                raise ctx.fail(where, f"{field} {getattr(p, field)} is negative")
        ratio = p.trigger_token_ratio
        if not (math.isfinite(ratio) and 0.0 <= ratio <= 1.0):
            raise ctx.fail(where, f"trigger_token_ratio {ratio!r} must be between 0 and 1 "
                                  "(0 = off)")
        spec = compile_llm(name, p.model_name, p.context_size, None, ctx,
                           fixed_max_tokens=("max_summary_tokens", p.max_summary_tokens),
                           node_params=p)
        spec.sampling["temperature"] = 0.0          # greedy: the same dialog, the same summary
        spec.extra["template"] = (compile_template_field(name, "template", p.template, ctx)
                                  or BUILTIN_TEMPLATE)
        spec.extra["notes"] = not p.template and not p.system_prompt
        return spec

    def model_names(self, node: Node, default_model: str) -> tuple[str, ...]:
        return (node.spec.model,)

    async def run(self, turn, node: Node) -> str:
        p = node.params
        agent = turn.agent
        state = agent.node_state(node.name)
        dialog = agent.dialog
        previous, covered = dialog.running_summary()
        earlier = sum(1 for i in dialog.interactions if i is not turn.interaction)
        diag = {"summarized": covered, "unsummarized": max(0, earlier - covered)}
        if "last" in state:
            diag["last_summary"] = state["last"]
        job = state.get("job")
        if job is not None:
            turn.note(node, summary="running", **diag)
        elif p.trigger_turns == 0 and p.trigger_token_ratio == 0:
            turn.note(node, summary="off", **diag)
        else:
            plan = await self._plan(turn, node, state)
            if plan is None:
                turn.note(node, summary="not_triggered", **diag)
            else:
                self._start(turn, node, state, plan)
                turn.note(node, summary="started", trigger=plan.trigger,
                          folding=len(plan.fold), interactions=plan.count,
                          unsummarized_tokens=plan.unsummarized_tokens, **diag)
                turn.send_event(node.name, "summary_started", {
                    "interactions": str(plan.count), "folding": str(len(plan.fold)),
                    "trigger": plan.trigger})
        return "default"

    async def _plan(self, turn, node: Node, state: dict) -> FoldPlan | None:
        p = node.params
        agent = turn.agent
        counts = state.get("tokens")
        if counts is None or counts[0] != agent.dialog.version:
            counts = state["tokens"] = (agent.dialog.version, {})
        engine = await agent.engine(node.spec.model) if p.trigger_token_ratio > 0 else None

        def count_tokens(inter: Interaction) -> int:
            # interactions do not change once finished: count each once (per dialog version)
            n = counts[1].get(inter.id)
            if n is None:
                n = counts[1][inter.id] = len(engine.tokenize(
                    dialog_text([inter]), add_special=False, parse_special=False))
            return n

        plan = plan_fold(agent.dialog, turn.interaction, keep_recent=p.keep_recent_turns,
                         trigger_turns=p.trigger_turns, trigger_ratio=p.trigger_token_ratio,
                         n_ctx=node.spec.n_ctx, count_tokens=count_tokens)
        if plan is not None:
            # the interactions folded now are never counted again
            first_kept = plan.holder.id
            for iid in [i for i in counts[1] if i < first_kept]:
                del counts[1][iid]
        return plan

    def _start(self, turn, node: Node, state: dict, plan: FoldPlan) -> None:
        agent = turn.agent
        job = SummaryJob(plan)
        context = turn.template_context()
        state["job"] = job
        with agent.lock:
            agent.background.add(job)
        job.task = asyncio.get_running_loop().create_task(
            _summarize(agent, node, job, context))


async def _summarize(agent, node: Node, job: SummaryJob, context: dict) -> None:
    """The background half: build the request, run it, land the summary (orchestrator)."""
    state = agent.node_state(node.name)
    plan = job.plan
    spec = node.spec
    outcome = {"status": "failed", "interactions": plan.count}
    try:
        engine = await agent.engine(spec.model)
        lane = await agent.lane(node) if spec.lane is not None else None
        if job.cancelled:
            raise asyncio.CancelledError()
        formatter = agent.runtime.formatter(engine)
        projection = agent.projection(node.name, engine, formatter)
        stop = tuple(dict.fromkeys(formatter.stop_strings + spec.extra["catalog_stop"]))
        outcome["prompt_tokens"] = outcome["summary_tokens"] = 0

        async def ask(prompt) -> tuple[str, bool]:
            """One greedy background request: its text, and whether it hit the limit."""
            loop = asyncio.get_running_loop()
            done = loop.create_future()
            handle = engine.submit(
                prompt.tokens, key=None, sampling=SamplingParams(stop=stop, **spec.sampling),
                priority=Priority.BACKGROUND, shared_prefix_len=prompt.shared_prefix_len,
                on_finish=lambda h: loop.call_soon_threadsafe(_settle, done, h), lane=lane)
            job.handle = handle
            if job.cancelled:
                handle.cancel()
            await done
            outcome["prompt_tokens"] += len(prompt.tokens)
            outcome["summary_tokens"] += handle.stats.tokens_generated
            if job.cancelled or handle.finish_reason == "cancelled":
                raise asyncio.CancelledError()
            if handle.error is not None:
                raise RuntimeError(handle.error)
            return handle.text, handle.finish_reason == "length"

        if spec.extra["notes"]:
            text, folded = await _take_notes(projection, node, plan, ask, engine)
        else:
            render = _rewrite_request(spec.extra["template"], context, plan)
            prompt, folded = _fit(projection, node, plan.fold, render, BUILTIN_INSTRUCTION
                                  if not node.params.system_prompt
                                  else node.params.system_prompt)
            text = None
        if folded < len(plan.fold):
            holder = plan.fold[folded]
            plan = job.plan = FoldPlan(plan.previous, plan.covered, plan.fold[:folded],
                                       holder, plan.trigger, plan.unsummarized_tokens)
            outcome["interactions"] = plan.count
        if text is None:
            reply, truncated = await ask(prompt)
            text = _clean(reply, truncated)
            if not text:
                raise RuntimeError("the model wrote an empty summary")
        with agent.lock:
            if job.cancelled:
                raise asyncio.CancelledError()
            if not still_applies(agent.dialog, plan):
                outcome["status"] = "discarded"
            else:
                plan.holder.add(Component(kind="summary", slot=node.name, text=text,
                                          node_name=node.name, role="system",
                                          extra={"count": plan.count}))
                outcome["status"] = "written"
        log.info("agent %d node %s: summary of %d interactions %s", agent.id, node.name,
                 plan.count, outcome["status"])
    except asyncio.CancelledError:
        outcome["status"] = "cancelled"
    except Exception as exc:
        if job.cancelled:                  # e.g. the engine closed with the agent's lease
            outcome["status"] = "cancelled"
        else:
            outcome["error"] = str(exc) or repr(exc)
            log.warning("agent %d node %s: summarization failed: %s", agent.id, node.name,
                        outcome["error"])
    finally:
        outcome["ms"] = round((time.perf_counter() - job.started) * 1000, 3)
        state["last"] = outcome
        if state.get("job") is job:
            state["job"] = None
        with agent.lock:
            agent.background.discard(job)


def _rewrite_request(template, context: dict, plan: FoldPlan):
    previous = plan.previous.text if plan.previous is not None else ""

    def render(k: int, cut: int | None) -> str:
        return template.render({**context, "summary": previous,
                                "dialog": dialog_text(plan.fold[:k], cut)})
    return render


def player_statements(interactions, cut: int | None = None) -> list[str]:
    """The player's sentences in `interactions` that are not questions, oldest first
    (`cut` keeps only that many characters of each message)."""
    out = []
    for inter in interactions:
        for m in inter.messages():
            if m["role"] != "user" or not m["content"]:
                continue
            text = m["content"] if cut is None else m["content"][:cut]
            said = [s for s in _SENTENCE.split(text.strip()) if s and not s.endswith("?")]
            if said:
                out.append(" ".join(said))
    return out


_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_NOTE_SPLIT = re.compile(r"\n|(?:^|\s)- ")
_NOTHING = re.compile(r"^(the player (said|told|mentioned) )?(nothing|none|n/a)\b", re.I)


def parse_notes(text: str) -> list[str]:
    """The notes of a reply: one per line or "- " item, without questions, "Nothing"
    and empty ones."""
    notes = []
    for part in _NOTE_SPLIT.split(text):
        note = part.strip().lstrip("-*• ").strip()
        if note and "?" not in note and not _NOTHING.match(note):
            notes.append(note)
    return notes


# Words a note about the player uses whatever the player said: not evidence either way.
_FRAME_WORDS = frozenset(
    "the and but that this with from for about into his her hers their they them she him "
    "player players player's said says told tells mentioned mentions has have had having "
    "was were are is been being will would can could also not very who whom whose which "
    "what when where there here likes like loves love favourite favorite wants want needs "
    "need plans plan lives live works work comes come owns own named name called "
    "currently recently".split())
_WORD = re.compile(r"[a-z][a-z']+")


def _content(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.lower()) if len(w) > 2 and w not in _FRAME_WORDS]


def grounded(note: str, said: str) -> bool:
    """Are most of the note's own words (beyond "the player has ...") in what the player
    said? Words match on their first five letters (mare / mares, stonemason / stonemasons)."""
    words = _content(note)
    if not words:
        return False
    heard = {w[:5] for w in _content(said)}
    return sum(w[:5] in heard for w in words) * 2 > len(words)


def _note_key(note: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", note.lower()).strip()


def merge_notes(previous: str, new: list[str]) -> str:
    """The previous notes, then the new ones they do not hold yet."""
    notes = [n for n in previous.split("\n") if n.strip()] if previous else []
    seen = {_note_key(n) for n in notes}
    for note in new:
        key = _note_key(note)
        if key and key not in seen:
            notes.append(note)
            seen.add(key)
    return "\n".join(notes)


async def _take_notes(projection, node: Node, plan: FoldPlan, ask, engine):
    """Notes mode: the new notes from the player's statements in the fold, those the
    statements ground, appended to the previous ones; notes past max_summary_tokens are
    left off at the end. Returns (notes, interactions folded)."""
    spec = node.spec
    previous = plan.previous.text if plan.previous is not None else ""
    new: list[str] = []
    folded = len(plan.fold)
    speaking = [i for i in plan.fold if player_statements([i])]
    for at in range(0, len(speaking), NOTES_BATCH):
        group = speaking[at:at + NOTES_BATCH]

        def render(k: int, cut: int | None, group=group) -> str:
            lines = "\n".join(f"- {s}" for s in player_statements(group[:k], cut))
            return NOTES_REQUEST.format(lines=lines)
        prompt, took = _fit(projection, node, group, render, NOTES_INSTRUCTION,
                            with_previous=False)
        reply, _ = await ask(prompt)
        said = " ".join(player_statements(group[:took]))
        new += [n for n in parse_notes(reply) if grounded(n, said)]
        if took < len(group):          # the rest waits for the next run
            folded = plan.fold.index(group[took])
            break
    notes = merge_notes(previous, new).split("\n")

    def size(lines: list[str]) -> int:
        return len(engine.tokenize("\n".join(lines), add_special=False, parse_special=False))

    while len(notes) > 1 and size(notes) > spec.max_tokens:
        notes.pop()
    return "\n".join(notes), folded


def _fit(projection, node: Node, fold: list[Interaction], render, system: str, *,
         with_previous: bool = True):
    """The request's prompt and how many of `fold` it takes: all of them if they fit the
    node's window (context size minus max_summary_tokens), else the most that do; a first
    one too long on its own is cut. `render(k, cut)` is the request for the first k
    interactions, each message cut to `cut` characters."""
    spec = node.spec

    def build(k: int, cut: int | None = None):
        request = render(k, cut)
        current = Interaction(id=0)
        current.add(Component(kind="user", slot=USER_SLOT, text=request, role="user",
                              producer="node"))
        return projection.build(Dialog(), current, system_prompt=system, template_text="",
                                placement=0, input_text=request, n_ctx=spec.n_ctx,
                                reserve=spec.max_tokens, max_history=0)

    try:
        return build(len(fold)), len(fold)
    except ProjectionError:
        pass
    lo, hi, best = 1, len(fold) - 1, None      # the most interactions that fit
    while lo <= hi:
        mid = (lo + hi) // 2
        try:
            best = (build(mid), mid)
            lo = mid + 1
        except ProjectionError:
            hi = mid - 1
    if best is not None:
        return best
    cut = max(len(m["content"] or "") for m in fold[0].messages()) if fold else 0
    for _ in range(_MAX_CUTS):
        cut //= 2
        try:
            return build(1, cut), 1
        except ProjectionError:
            continue
    what = "the previous summary and the instruction" if with_previous else "the instruction"
    raise ProjectionError(f"{what} alone do not fit the node's window ({spec.n_ctx} tokens "
                          f"minus max_summary_tokens {spec.max_tokens})")


def _clean(text: str, truncated: bool) -> str:
    """The summary without a label the model may repeat, and, when it hit
    max_summary_tokens, without the unfinished sentence at its end."""
    text = text.strip()
    for label in ("Updated summary:", "Summary:"):
        if text.lower().startswith(label.lower()):
            text = text[len(label):].strip()
    if truncated:
        end = max(text.rfind(". "), text.rfind(".\n"), text.rfind("!"), text.rfind("?"))
        if end >= len(text) // 2:
            text = text[:end + 1]
    return text
