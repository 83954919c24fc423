"""Scoring a case's outcome, strictly, and the statistics of a run.

A case passes when every check it names holds (cases.py lists the keys):
- `expect`: each item appears in the reply text, one of its alternatives, matched
  case-insensitively on word boundaries after the reply's quotes and spaces are normalised;
- `forbid`: none of the regexes matches (case-insensitive);
- `checks`: the named check sets in CHECKS find nothing (in_world and in_character let the
  reply repeat words of the player's line: "Online? I don't follow");
- `calls`: the tool calls detected are exactly these, in any order, arguments compared
  as parsed JSON (strings case-insensitively and trimmed, numbers by value);
- `intent` / `attributes` / `route`: equal to what the server reported.

Scores: a category's pass rate with its Wilson 95 % interval; the overall score is the
mean of the category scores (each category weighs the same, whatever its size) with a
95 % interval from a stratified bootstrap over the cases (seeded, so a report is
reproducible from its case outcomes).
"""
from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

# A character must never say what it is made of. Seen from the models here: "As an AI, I
# ...", "I am ChatGPT, a language model created by OpenAI", "I'm Qwen", "I don't have
# feelings". Only claims about itself count: "Language model? Never heard of it" is in
# character.
_SELF = r"\b(i am|i'm|im|i was|i've been)\s+(just\s+|only\s+|merely\s+|actually\s+|really\s+)?"
_NOT_A_MODEL = [
    r"\bas an? (ai|a\.i\.|artificial intelligence|language model|ai language model"
    r"|assistant|ai assistant|chat ?bot|virtual assistant)\b",
    _SELF + r"(an?\s+)?(ai|a\.i\.|artificial intelligence|(large\s+)?language model"
    r"|ai (language )?model|chat ?bot|virtual assistant|ai assistant|digital assistant"
    r"|computer program|program|bot|machine)\b",
    _SELF + r"(chatgpt|qwen|claude|llama|smollm|gpt|gemini|mistral|an openai)\b",
    r"\b(created|developed|trained|built|made|programmed|designed) by (openai|alibaba"
    r"|anthropic|google|meta|hugging ?face|mistral|the qwen team)\b",
    r"\bmy (training( data)?|programming|developers|creators|knowledge cutoff)\b",
    r"\bi (don't|do not|can't|cannot) have (personal |real |any )?(feelings|emotions"
    r"|a body|opinions|personal opinions|experiences|personal experiences|a physical form)\b",
    r"\bi (don't|do not) have (the ability to|access to) (browse|the internet|real-time"
    r"|current)\b",
    r"\bi (can't|cannot) (browse|access) the (internet|web)\b",
    r"\b(running|run|built|based) on (openai|gpt|chatgpt|qwen|llama|claude|a language model"
    r"|an ai)\b",
    r"\b(chatgpt|gpt-?[345]|openai|qwen|alibaba cloud|anthropic)\b",
    _SELF + r"(just\s+)?(an?\s+)?(fictional\s+)?character\b",
    r"\b(a|the) character (from|in) (the|a|this) (story|game|book)\b",
]
# Narration a voice would read out as words: *smiles*, (laughs softly), [nods].
_STAGE = [
    r"\*[^*\n]{1,80}\*",
    r"\((smil|laugh|chuckl|grin|nod|sigh|wink|shrug|lean|pause|look|gestur|clear)[a-z]*\b[^)]{0,60}\)",
    r"\[(smil|laugh|chuckl|grin|nod|sigh|wink|shrug|lean|pause|look|gestur|clear)[a-z]*\b[^\]]{0,60}\]",
]
# Things that do not exist in a world before electricity (fantasy, age of sail, frontier;
# trains and telegraphs do, so they are not here).
_MODERN = [
    r"\b(smart ?phones?|cell ?phones?|mobile phones?|telephones?|internet|online|websites?"
    r"|web ?sites?|search (bar|engine)|google|e-?mails?|computers?|apps?|wi-?fi|gps|laptops?"
    r"|television|tv|electricity|automobiles?|taxis?|airplanes?|credit cards?|plastic)\b",
    r"\$\s?\d", r"\b\d+\s?(dollars|usd|euros?|cents)\b", r"\bdollars?\b",
]
# A tool call spelled out as text instead of being recognised as a call.
_RAW_CALL = [r"<tool_call>", r"</tool_call>", r"\{\s*\"name\"\s*:", r"\"arguments\"\s*:",
             r"```\s*json", r"\[TOOL_CALLS\]"]

CHECKS: dict[str, list[re.Pattern]] = {
    "in_character": [re.compile(p, re.I) for p in _NOT_A_MODEL],
    "no_stage_directions": [re.compile(p, re.I) for p in _STAGE],
    "in_world": [re.compile(p, re.I) for p in _MODERN],
    "no_raw_call": [re.compile(p, re.I) for p in _RAW_CALL],
}

# Checks for which words the player said may be repeated back (in puzzlement: "ChatGPT?
# Never heard of it"). A claim the player did not say is still caught.
ECHO_ALLOWED = {"in_world", "in_character"}

_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"',
                         "\u2013": "-", "\u2014": "-", "\u00a0": " "})


def normalise(text: str) -> str:
    return " ".join(text.translate(_QUOTES).split()).casefold()


def contains(text: str, phrase: str) -> bool:
    """`phrase` in `text` on word boundaries, case-insensitively (both normalised)."""
    phrase = normalise(phrase)
    left = r"\b" if phrase[:1].isalnum() else ""
    right = r"\b" if phrase[-1:].isalnum() else ""
    return re.search(left + re.escape(phrase) + right, normalise(text)) is not None


@dataclass
class Outcome:
    """What the server did for one case, and the verdict."""
    case_id: str
    category: str
    text: str = ""
    calls: list[dict] = field(default_factory=list)
    intent: str | None = None
    attributes: dict[str, str] | None = None
    route: str | None = None
    error: str = ""
    first_token_s: float | None = None
    turn_s: float | None = None
    tokens: int = 0
    passed: bool = False
    failures: list[str] = field(default_factory=list)

    def as_json(self) -> dict:
        out = {"id": self.case_id, "category": self.category, "passed": self.passed,
               "text": self.text}
        for name in ("calls", "intent", "attributes", "route"):
            value = getattr(self, name)
            if value not in (None, []):
                out[name] = value
        if self.failures:
            out["failures"] = self.failures
        if self.error:
            out["error"] = self.error
        return out


def judge(case, out: Outcome) -> Outcome:
    """Fill out.passed / out.failures from the case's expectations."""
    fails = []
    if out.error:
        fails.append(f"error: {out.error}")
    for alts in case.expect:
        if not any(contains(out.text, a) for a in alts):
            fails.append("missing " + " | ".join(alts))
    for pattern in case.forbid:
        m = re.search(pattern, out.text, re.I)
        if m:
            fails.append(f"forbidden {m.group(0)!r}")
    said = normalise(case.say[-1])
    for check in case.checks:
        for pattern in CHECKS[check]:
            hits = [m.group(0) for m in pattern.finditer(out.text)]
            if check in ECHO_ALLOWED:       # "Online? I don't follow." repeats the player
                hits = [h for h in hits if normalise(h) not in said]
            if hits:
                fails.append(f"{check}: {hits[0]!r}")
                break
    if case.calls is not None:
        want = sorted(_call_key(c.name, c.arguments) for c in case.calls)
        got = sorted(_call_key(c["name"], c["arguments"]) for c in out.calls)
        if want != got:
            fails.append(f"calls {got} != expected {want}")
    if case.intent is not None and (out.intent or "") != case.intent:
        fails.append(f"intent {out.intent!r} != {case.intent!r}")
    if case.attributes is not None:
        got = out.attributes or {}
        for name, value in case.attributes.items():
            if got.get(name, "") != value:
                fails.append(f"attribute {name} {got.get(name, '')!r} != {value!r}")
    if case.route is not None and out.route != case.route:
        fails.append(f"route {out.route!r} != {case.route!r}")
    out.failures = fails
    out.passed = not fails
    return out


def _norm_value(v: Any) -> Any:
    if isinstance(v, bool):
        return ("b", v)
    if isinstance(v, (int, float)):
        return ("n", float(v))
    if isinstance(v, str):
        return ("s", " ".join(v.split()).casefold())
    if isinstance(v, list):
        return ("l", tuple(_norm_value(x) for x in v))
    if isinstance(v, Mapping):
        return ("o", tuple(sorted((k, _norm_value(x)) for k, x in v.items())))
    return ("?", repr(v))


def _call_key(name: str, arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return f"{name}(<unparsed {arguments!r}>)"
    return f"{name}{_norm_value(arguments or {})}"


# ---------------------------------------------------------------------------- statistics

Z95 = 1.959963984540054


def wilson(passed: int, n: int) -> tuple[float, float]:
    """The Wilson score interval (95 %) of a pass rate."""
    if n == 0:
        return (float("nan"), float("nan"))
    p = passed / n
    denom = 1 + Z95 ** 2 / n
    centre = (p + Z95 ** 2 / (2 * n)) / denom
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def category_scores(outcomes: Iterable[Outcome], categories: Sequence[str]) -> dict:
    by: dict[str, list[bool]] = {c: [] for c in categories}
    for o in outcomes:
        by.setdefault(o.category, []).append(o.passed)
    out = {}
    for cat, results in by.items():
        if not results:
            continue
        n, k = len(results), sum(results)
        lo, hi = wilson(k, n)
        out[cat] = {"n": n, "passed": k, "score": k / n, "ci95": [lo, hi]}
    return out


def overall(outcomes: Sequence[Outcome], resamples: int = 2000, seed: int = 20261206) -> dict:
    """Macro mean over categories, with a stratified bootstrap 95 % interval."""
    by: dict[str, list[bool]] = {}
    for o in outcomes:
        by.setdefault(o.category, []).append(o.passed)
    if not by:
        return {"score": float("nan"), "ci95": [float("nan"), float("nan")], "n": 0}
    score = sum(sum(v) / len(v) for v in by.values()) / len(by)
    rng = random.Random(seed)
    means = []
    for _ in range(resamples):
        total = 0.0
        for v in by.values():
            total += sum(v[rng.randrange(len(v))] for _ in range(len(v))) / len(v)
        means.append(total / len(by))
    means.sort()
    lo = means[int(0.025 * resamples)]
    hi = means[min(resamples - 1, int(0.975 * resamples))]
    return {"score": score, "ci95": [lo, hi], "n": sum(len(v) for v in by.values()),
            "categories": len(by)}


def percentile(values: Sequence[float], q: float) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    k = (len(values) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)
