"""ClassifyIntentLLM and IntentToInstruction (docs/knowledge.md).

ClassifyIntentLLM asks the node's model to answer with a letter: the system message is the
instruction (the built-in one, or `system_prompt`) followed by the choices "A. <prompt>",
"B. <prompt>", ...; the history is the last `history_turns` interactions; the message is
the input slot's text. One scoring request (SamplingParams.score_tokens: no token is
generated) returns the probabilities of the letters as the reply's first token, softmaxed
over the letters only. The best letter is found when its probability reaches `threshold`
and leads the second by `margin`, and its intent is not the sink (`not_found_intent`).
The turn's intent is then its id; when nothing passes, it is `not_found_intent` (if set).
Diagnostics: every letter's probability and, when not found, `not_found_reason`.
`notify_client` sends NodeEvent `intent_classified` (intent, probability, found).

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
    check_slot, check_unsupported, compile_template_field,
)
from tryll_fast.workflow.nodes.llm import compile_llm

MAX_INTENTS = 26
DEFAULT_CONTEXT = 2048
BUILTIN_INSTRUCTION = (
    "Classify the player's last message. Choose the one option below that fits it best "
    "and reply with its letter only.")
Notify = codec.NotifyClient


def _csv(text: str) -> list[str]:
    return [part.strip() for part in text.split(",")] if text.strip() else []


class ClassifyIntentLLMNode(NodeType):
    kind = "ClassifyIntentLLM"
    params_cls = codec.ClassifyIntentLLMParams
    exits = ("found", "not_found")
    uses_model = True

    def compile(self, name: str, p, ctx: CompileContext):
        where = f"node {name!r}"
        check_unsupported(name, p)
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
        for field in ("threshold", "margin"):
            v = getattr(p, field)
            if not (math.isfinite(v) and 0.0 <= v <= 1.0):
                raise ctx.fail(where, f"{field} {v!r} must be between 0 and 1")
        if p.history_turns < 0:
            raise ctx.fail(where, f"history_turns {p.history_turns} is negative")
        if p.notify_client not in {int(m) for m in Notify}:
            raise ctx.fail(where, f"notify_client {int(p.notify_client)} is not a "
                                  "NotifyClient (0..2)")
        spec = compile_llm(name, p.model_name, p.context_size, None, ctx,
                           default_context=DEFAULT_CONTEXT, default_max_tokens=1)
        letters = [chr(ord("A") + i) for i in range(len(ids))]
        options = "\n".join(f"{letter}. {text}" for letter, text in zip(letters, prompts))
        system = f"{p.system_prompt or BUILTIN_INSTRUCTION}\n\n{options}"
        # one token, greedy: the scoring request reads the first position only
        spec.sampling.update(max_tokens=1, temperature=0.0)
        spec.extra.update(input=check_slot(name, p.input, ctx), ids=tuple(ids),
                          letters=tuple(letters), system=system)
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
        handle, _ = await turn.run_model(
            node, node.spec, system_prompt=x["system"], input_slot=x["input"],
            max_history=p.history_turns,
            score_tokens=lambda engine: letter_tokens(engine, x["letters"], node.name))
        scores = handle.scores
        if scores is None or len(scores) != len(x["ids"]):
            return self._not_found(turn, node, "score_size_mismatch", scores)
        ranked = sorted(range(len(scores)), key=scores.__getitem__, reverse=True)
        best = ranked[0]
        second = scores[ranked[1]] if len(ranked) > 1 else 0.0
        intent = x["ids"][best]
        if scores[best] < p.threshold:
            return self._not_found(turn, node, "below_threshold", scores)
        if scores[best] - second < p.margin:
            return self._not_found(turn, node, "below_margin", scores)
        if p.not_found_intent and intent == p.not_found_intent:
            return self._not_found(turn, node, "sink_intent", scores)
        turn.intent = intent
        turn.note(node, intent=intent, probability=round(scores[best], 4),
                  scores=_table(x, scores))
        if p.notify_client in (Notify.OnFound, Notify.Always):
            _notify(turn, node, intent, scores[best], True)
        return "found"

    def _not_found(self, turn, node: Node, reason: str, scores) -> str:
        p = node.params
        x = node.spec.extra
        turn.intent = p.not_found_intent or None
        best = max(scores) if scores else 0.0
        turn.note(node, intent=turn.intent, not_found_reason=reason,
                  scores=_table(x, scores) if scores else None)
        if p.notify_client == Notify.Always:
            _notify(turn, node, turn.intent or "", best, False)
        return "not_found"


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
