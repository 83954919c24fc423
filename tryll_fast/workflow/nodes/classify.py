"""ClassifyIntentLLM and IntentToInstruction (docs/knowledge.md).

ClassifyIntentLLM asks the node's model which option fits the player's words: the system
message is the instruction (the built-in one, or `system_prompt`); the history is the last
`history_turns` interactions; the last user turn asks the question: the input slot's text
quoted, the options as "- <name>: <prompt>" (the intent id written as words:
`ask_way` -> "ask way"), "Answer with one of: <names>". One scoring request
(SamplingParams.score_tokens: no token is generated) returns the probabilities of the
options' first tokens as the reply's first token, softmaxed over those tokens only; each
option's probability is then divided by its prior (its probability for a content-free
message, measured once per model: see Question) and normalised. Where two names start with
the same token, the options are lettered instead ("A. <prompt>", "Answer with the letter
only", no calibration). The best option is found when its probability reaches `threshold`
and leads the second by `margin`, and its intent is not the sink (`not_found_intent`).
The turn's intent is then its id; when nothing passes, it is `not_found_intent` (if set).
Diagnostics: every option's probability (keyed "<letter>:<intent>"), `answered_by` (name or
letter) and, when not found, `not_found_reason`.
`notify_client` sends NodeEvent `intent_classified` (intent, probability, found).

ClassifyAttributesLLM asks the same kind of question once per attribute (its question
and options in the last user turn, after the quoted message; `history_turns` as above), one
scoring request after another on the node's conversation. An attribute whose best option
reaches `threshold` is resolved: its value is written to its `target_variable` (a declared
string variable; `{{var.<name>}}` and filters see it from then on) and to the turn's
`{{attribute_<name>}}`; an unresolved one leaves its variable as it was. found when every
attribute resolved. Diagnostics: each attribute's probabilities, value and whether it
resolved; `notify_client` sends NodeEvent `attributes_classified` with `<name>` -> value
(empty when unresolved) and `<name>.probability`.

IntentToInstruction looks the turn's intent up in its Map (a Map string storage, with the
inline `inline_keys` / `instructions` winning on equal keys) and attaches the text as an
instruction (`{{instruction_<name>}}`, `{{#instructions}}`), rendered as Mustache when it
runs. No intent, or one without an entry: nothing attached. It always exits default.
"""
from __future__ import annotations

import math

from tryll_fast import codec
from tryll_fast.knowledge import Kind
from tryll_fast.workflow.graph import CompileContext, Node, NodeType
from tryll_fast.workflow.nodes.generate import (
    check_slot, compile_template_field,
)
from tryll_fast.workflow.nodes.llm import compile_llm
from tryll_fast.workflow.projection import neutralize

MAX_INTENTS = 26
DEFAULT_CONTEXT = 2048
MAX_ATTRIBUTES = 16
# The system message when the node sets none. The question itself comes last, in the user
# turn: the player's words, the options, "answer with the letter". With the options in the
# system message instead, Qwen2.5-Coder-1.5B put 0.25-0.45 on the right letter of four
# (often another one first); asked last, 0.60-0.96 and always the right one.
BUILTIN_ATTRIBUTE_INSTRUCTION = (
    "You read what a player says to a character in a game and answer questions about it.")
BUILTIN_INSTRUCTION = (
    "You classify what a player says to a character in a game.")
_QUESTION = 'The player says: "{message}"\n\n{question}'
# the message a prior is measured on: it says nothing, so what the model answers is its
# leaning toward each option
CONTENT_FREE = "N/A"
INTENT_QUESTION = "Which option fits it best?"
Notify = codec.NotifyClient


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",")] if text.strip() else []


def _scoring_spec(name: str, p, ctx: CompileContext, probabilities: tuple[str, ...]):
    """The checks and the model spec the letter-scoring nodes share: probabilities in 0..1,
    history_turns, notify_client; one token, greedy (the request reads the first position
    only)."""
    where = f"node {name!r}"
    for field in probabilities:
        v = getattr(p, field)
        if not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise ctx.fail(where, f"{field} {v!r} must be between 0 and 1")
    if p.history_turns < 0:
        raise ctx.fail(where, f"history_turns {p.history_turns} is negative")
    if p.notify_client not in {int(m) for m in Notify}:
        raise ctx.fail(where, f"notify_client {int(p.notify_client)} is not a "
                              "NotifyClient (0..2)")
    spec = compile_llm(name, p.model_name, p.context_size, None, ctx,
                       default_context=DEFAULT_CONTEXT, default_max_tokens=1, node_params=p)
    spec.sampling.update(max_tokens=1, temperature=0.0)
    return spec


class ClassifyIntentLLMNode(NodeType):
    kind = "ClassifyIntentLLM"
    params_cls = codec.ClassifyIntentLLMParams
    exits = ("found", "not_found")
    uses_model = True

    def compile(self, name: str, p, ctx: CompileContext):
        where = f"node {name!r}"
        ids = _csv(p.intents_ids)
        if not ids:
            raise ctx.fail(where, "intents_ids is empty: give the intents, comma-separated")
        if len(ids) > MAX_INTENTS:
            raise ctx.fail(where, f"{len(ids)} intents; at most {MAX_INTENTS} (letters A..Z)")
        for i, intent in enumerate(ids):
            if not intent:
                raise ctx.fail(where, f"intents_ids entry {i} is empty")
            if intent in ids[:i]:
                raise ctx.fail(where, f"intents_ids names {intent!r} twice")
        prompts = _csv(p.intents_prompt) or ids
        if len(prompts) != len(ids):
            raise ctx.fail(where, f"intents_prompt has {len(prompts)} entries for "
                                  f"{len(ids)} intents_ids")
        spec = _scoring_spec(name, p, ctx, ("threshold", "margin"))
        letters = [chr(ord("A") + i) for i in range(len(ids))]
        spec.extra.update(input=check_slot(name, p.input, ctx), ids=tuple(ids),
                          letters=tuple(letters), system=p.system_prompt or BUILTIN_INSTRUCTION,
                          question=Question(INTENT_QUESTION, tuple(_spoken(i) for i in ids),
                                            tuple(prompts), tuple(letters)))
        return spec

    def model_names(self, node: Node, default_model: str) -> tuple[str, ...]:
        return (node.spec.model,)

    def prefix_args(self, agent, node: Node, formatter) -> dict:
        x = node.spec.extra
        return dict(system_prompt=x["system"], template_text="", placement=0,
                    input_slot=x["input"], max_history=node.params.history_turns)

    async def run(self, turn, node: Node) -> str:
        p = node.params
        x = node.spec.extra
        if not turn.slot(x["input"]).strip():
            return self._not_found(turn, node, "empty_message", None)
        engine = await turn.agent.engine(node.spec.model)
        scores, answered_by = await _ask(turn, node, engine, x["question"], node.name)
        if scores is None or len(scores) != len(x["ids"]):
            return self._not_found(turn, node, "score_size_mismatch", scores, answered_by)
        ranked = sorted(range(len(scores)), key=scores.__getitem__, reverse=True)
        best = ranked[0]
        second = scores[ranked[1]] if len(ranked) > 1 else 0.0
        intent = x["ids"][best]
        if scores[best] < p.threshold:
            return self._not_found(turn, node, "below_threshold", scores, answered_by)
        if scores[best] - second < p.margin:
            return self._not_found(turn, node, "below_margin", scores, answered_by)
        if p.not_found_intent and intent == p.not_found_intent:
            return self._not_found(turn, node, "sink_intent", scores, answered_by)
        turn.intent = intent
        turn.note(node, intent=intent, probability=round(scores[best], 4),
                  scores=_table(x, scores), answered_by=answered_by)
        if p.notify_client in (Notify.OnFound, Notify.Always):
            _notify(turn, node, intent, scores[best], True)
        return "found"

    def _not_found(self, turn, node: Node, reason: str, scores,
                   answered_by: str | None = None) -> str:
        p = node.params
        x = node.spec.extra
        turn.intent = p.not_found_intent or None
        best = max(scores) if scores else 0.0
        turn.note(node, intent=turn.intent, not_found_reason=reason,
                  scores=_table(x, scores) if scores else None, answered_by=answered_by)
        if p.notify_client == Notify.Always:
            _notify(turn, node, turn.intent or "", best, False)
        return "not_found"


class ClassifyAttributesLLMNode(NodeType):
    kind = "ClassifyAttributesLLM"
    params_cls = codec.ClassifyAttributesLLMParams
    exits = ("found", "not_found")
    uses_model = True

    def compile(self, name: str, p, ctx: CompileContext):
        where = f"node {name!r}"
        attrs = list(p.attributes)
        if not attrs:
            raise ctx.fail(where, "attributes is empty")
        if len(attrs) > MAX_ATTRIBUTES:
            raise ctx.fail(where, f"{len(attrs)} attributes; at most {MAX_ATTRIBUTES}")
        compiled = []
        for i, a in enumerate(attrs):
            at = f"{where}: attributes[{i}]"
            if not a.name or a.name in [c[0] for c in compiled]:
                raise ctx.fail(at, f"name {a.name!r} is empty or repeated")
            if not a.question.strip():
                raise ctx.fail(at, "question is empty")
            options = list(a.options)
            if not 2 <= len(options) <= MAX_INTENTS:
                raise ctx.fail(at, f"{len(options)} options; 2 to {MAX_INTENTS} (letters A..Z)")
            if any(not o for o in options) or len(set(options)) != len(options):
                raise ctx.fail(at, "options must be non-empty and distinct")
            shown = list(a.option_descriptions) or options
            if len(shown) != len(options):
                raise ctx.fail(at, f"option_descriptions has {len(shown)} entries for "
                                   f"{len(options)} options")
            if a.target_variable and ctx.variables.kind(a.target_variable) != "string":
                raise ctx.fail(at, f"target_variable {a.target_variable!r} is not a declared "
                                   "string variable")
            letters = [chr(ord("A") + k) for k in range(len(options))]
            question = Question(a.question, tuple(options),
                                tuple(desc or opt for desc, opt in zip(shown, options)),
                                tuple(letters))
            compiled.append((a.name, tuple(options), tuple(letters), question,
                             a.target_variable))
        spec = _scoring_spec(name, p, ctx, ("threshold",))
        spec.extra.update(input=check_slot(name, p.input, ctx), attributes=tuple(compiled),
                          system=p.system_prompt or BUILTIN_ATTRIBUTE_INSTRUCTION)
        return spec

    def model_names(self, node: Node, default_model: str) -> tuple[str, ...]:
        return (node.spec.model,)

    def prefix_args(self, agent, node: Node, formatter) -> dict:
        x = node.spec.extra
        return dict(system_prompt=x["system"], template_text="", placement=0,
                    input_slot=x["input"], max_history=node.params.history_turns)

    async def run(self, turn, node: Node) -> str:
        p = node.params
        x = node.spec.extra
        empty = not turn.slot(x["input"]).strip()
        results: dict[str, tuple[str, float]] = {}
        table = {}
        engine = await turn.agent.engine(node.spec.model)
        for name, options, letters, question, target in x["attributes"]:
            if empty:
                table[name] = {"resolved": False, "reason": "empty_message"}
                continue
            scores, answered_by = await _ask(turn, node, engine, question,
                                             f"{node.name}: attribute {name!r}")
            if scores is None or len(scores) != len(options):
                table[name] = {"resolved": False, "reason": "score_size_mismatch"}
                continue
            best = max(range(len(scores)), key=scores.__getitem__)
            resolved = scores[best] >= p.threshold
            table[name] = {"value": options[best] if resolved else None, "resolved": resolved,
                           "answered_by": answered_by,
                           "scores": {f"{letter}:{opt}": round(sc, 4) for letter, opt, sc
                                      in zip(letters, options, scores)}}
            if resolved:
                results[name] = (options[best], scores[best])
                turn.attributes[name] = options[best]
                if target:
                    turn.agent.variables.apply([codec.VariableUpdate(
                        name=target, op=codec.VariableOp.Assign,
                        value=codec.VarString(value=options[best]))])
        found = len(results) == len(x["attributes"])
        turn.note(node, attributes=table)
        if p.notify_client == Notify.Always or (found and p.notify_client == Notify.OnFound):
            pairs = {}
            for name, *_ in x["attributes"]:
                value, prob = results.get(name, ("", 0.0))
                pairs[name] = value
                pairs[f"{name}.probability"] = f"{prob:.4f}"
            turn.send_event(node.name, "attributes_classified", pairs)
        return "found" if found else "not_found"


def _asked(model, message: str, question: str) -> dict:
    """run_model's arguments that put the question in place of the user turn (the player's
    words quoted in it, control-token spellings broken as in any user message); kept out of
    the dialog, so later prompts show the player's own words."""
    text = _QUESTION.format(message=neutralize(model, message), question=question)
    return dict(template_text=text, placement=int(codec.Placement.InPlaceOfUser),
                keep_template=False)


async def _ask(turn, node: Node, engine, question: "Question", where: str):
    """(the probability of each of `question`'s options for the player's words, calibrated
    by the options' prior (see Question), or None when the engine gave no scores;
    "name" or "letter": how the options were answered)."""
    x = node.spec.extra
    answers = question.answers(engine, where)

    async def score(message: str, history: int):
        handle, _ = await turn.run_model(
            node, node.spec, system_prompt=x["system"], input_slot=x["input"],
            max_history=history, **_asked(engine.model, message, question.text(answers)),
            score_tokens=lambda engine: answers.tokens)
        return answers.per_option(handle.scores)

    scores = await score(turn.slot(x["input"]), node.params.history_turns)
    if scores is None or not answers.by_name:
        return scores, "letter"
    key = _model_key(engine)
    prior = question.priors.get(key)
    if prior is None:
        prior = await score(CONTENT_FREE, 0)
        if prior is None:
            return scores, "name"
        question.priors[key] = prior
    return _calibrated(scores, prior), "name"


def _model_key(engine):
    """What a question's per-model state is kept under: the model's file."""
    return getattr(engine.model, "path", None) or id(engine.model)


def _calibrated(scores, prior) -> list[float]:
    """Each option's probability divided by its prior, normalised again."""
    ratios = [s / max(q, 1e-6) for s, q in zip(scores, prior)]
    total = sum(ratios)
    return [r / total for r in ratios] if total > 0 else list(scores)


def _spoken(intent_id: str) -> str:
    """An intent id as a word a model would write: `ask_directions` -> `ask directions`."""
    return " ".join(intent_id.replace("_", " ").replace("-", " ").split()) or intent_id


class Answers:
    """The tokens one scoring request reads and how they add up to each option: `groups[i]`
    are the positions in `tokens` that start option i's answer."""

    def __init__(self, by_name: bool, tokens: tuple[int, ...],
                 groups: tuple[tuple[int, ...], ...]) -> None:
        self.by_name = by_name
        self.tokens = tokens
        self.groups = groups

    def per_option(self, scores) -> list[float] | None:
        if scores is None or len(scores) != len(self.tokens):
            return None
        return [sum(scores[k] for k in group) for group in self.groups]


class Question:
    """One multiple-choice question: the options' names (what a model answers with), their
    descriptions, and the letters used when two names start with the same token.

    Options are answered by name and calibrated: a small model binds options to arbitrary
    letters poorly and leans toward the first option listed, whatever the player said. So
    the reply's first token is scored over the options' own first tokens, and each option's
    probability is divided by its prior: its probability for a content-free message
    (CONTENT_FREE, no history), asked once per model and kept. On the quality suite's 32
    labelled questions, Qwen2.5-Coder-0.5B passed the default threshold and margin with
    the right option on 1 of 32 by letter and 13 by calibrated name; Qwen2.5-Coder-1.5B
    on 28 either way."""

    def __init__(self, question: str, names, descriptions, letters) -> None:
        self.question = question
        self.names = tuple(names)
        self.descriptions = tuple(descriptions)
        self.letters = tuple(letters)
        self.priors: dict = {}      # model file -> each option's content-free probability
        self._answers: dict = {}    # model file -> Answers (the tokenizer decides them)

    def answers(self, engine, where: str) -> Answers:
        key = _model_key(engine)
        answers = self._answers.get(key)
        if answers is None:
            answers = _name_tokens(engine, self.names) or Answers(
                False, tuple(letter_tokens(engine, self.letters, where)),
                tuple((k,) for k in range(len(self.letters))))
            self._answers[key] = answers
        return answers

    def text(self, answers: Answers) -> str:
        if not answers.by_name:
            options = "\n".join(f"{letter}. {text}" for letter, text
                                in zip(self.letters, self.descriptions))
            return f"{self.question}\n{options}\n\nAnswer with the letter only."
        options = "\n".join(f"- {name}" if desc == name else f"- {name}: {desc}"
                            for name, desc in zip(self.names, self.descriptions))
        return (f"{self.question}\n{options}\n\n"
                f"Answer with one of: {', '.join(self.names)}.")


def _name_tokens(engine, names) -> Answers | None:
    """The first tokens a reply naming each option can start with (as written and
    capitalised, with and without a leading space), or None when two options share one."""
    owner: dict[int, int] = {}
    for k, name in enumerate(names):
        for form in dict.fromkeys((name, name[:1].upper() + name[1:])):
            for spelled in (form, " " + form):
                ids = engine.tokenize(spelled, add_special=False, parse_special=False)
                if not ids or owner.setdefault(ids[0], k) != k:
                    return None
    tokens = tuple(owner)
    groups = tuple(tuple(i for i, t in enumerate(tokens) if owner[t] == k)
                   for k in range(len(names)))
    return Answers(True, tokens, groups)


def letter_tokens(engine, letters, node_name: str) -> list[int]:
    """The token of each letter as the first token of a reply."""
    out = []
    for letter in letters:
        ids = engine.tokenize(letter, add_special=False, parse_special=False)
        if len(ids) != 1:
            from tryll_fast.workflow.turn import TurnFailure
            raise TurnFailure(f"node {node_name!r}: the model writes the letter {letter!r} "
                              f"as {len(ids)} tokens; letter choices need one token each")
        out.append(ids[0])
    return out


def _table(x: dict, scores) -> dict:
    return {f"{letter}:{intent}": round(s, 4)
            for letter, intent, s in zip(x["letters"], x["ids"], scores)}


def _notify(turn, node: Node, intent: str, probability: float, found: bool) -> None:
    turn.send_event(node.name, "intent_classified", {
        "intent": intent, "probability": f"{probability:.4f}",
        "found": "true" if found else "false"})


class IntentToInstructionNode(NodeType):
    kind = "IntentToInstruction"
    params_cls = codec.IntentToInstructionParams
    exits = ("default",)

    def compile(self, name: str, p, ctx: CompileContext):
        where = f"node {name!r}"
        table: dict = {}
        if p.string_storage:
            stored = ctx.strings(p.string_storage, (Kind.Map,), where)
            table.update(stored.mapping())
        texts = [t.text for t in p.instructions]
        if len(p.inline_keys) != len(texts):
            raise ctx.fail(where, f"inline_keys has {len(p.inline_keys)} entries and "
                                  f"instructions {len(texts)}; they are parallel")
        for i, key in enumerate(p.inline_keys):
            if not key:
                raise ctx.fail(where, f"inline_keys[{i}] is empty")
            table[key] = texts[i]                    # inline entries win on equal keys
        templates = {key: compile_template_field(name, f"instruction for {key!r}", text, ctx)
                     for key, text in table.items()}
        return (p.instruction_name or name, templates)

    async def run(self, turn, node: Node) -> str:
        instruction_name, templates = node.spec
        intent = turn.intent
        if intent is None or intent not in templates:
            turn.note(node, intent=intent, instruction=None)
            return "default"
        template = templates[intent]
        text = template.render(turn.template_context()) if template else ""
        turn.add_instruction(node, instruction_name, text)
        return "default"
