"""The NPC quality suite's cases: TOML files under benchmarks/npc/cases/, read and checked here.

One file per setting (a fantasy village, a space station, ...):

    setting = "Oakvale, a fantasy village"           # one line for the report

    # The characters, in the pipeline config's agent format (docs/pipeline.md, "Agents"):
    # nodes as TOML tables, the first node is the start. `default_model` is not written: the
    # runner sets it to the model under test, and gives every language-model node
    # temperature 0 and a fixed seed (greedy, reproducible).
    [agents.brenna]
    variables = { mood = "cheerful" }
    [agents.brenna.nodes.reply]
    type = "Generate"
    system_prompt = "You are Brenna, the baker of Oakvale. ..."
    sampling = { max_tokens = 96 }

    # Embedded storages that Retrieve nodes name: records embedded by the default
    # embedding model when the suite starts (metadata optional, one table per record).
    [storages.oakvale_lore]
    records = ["The mill burned down in the winter of the long frost.", ...]

    # Player lines the recall conversations fill their turns with, cycled.
    [fillers]
    oakvale = ["What's good today?", ...]

    [[case]]
    id = "brenna-rye-price"          # unique across the suite
    category = "facts"               # one of CATEGORIES
    agent = "brenna"
    say = "How much is a loaf of rye?"   # or a list: the lines before the last are said
                                         # first (unscored), the last one is scored
    variables = { mood = "grumpy" }  # optional: initial values instead of the agent's
    # What is scored; every key given must hold:
    expect = ["3 copper|three copper"]   # each item must appear in the reply: any of its
                                         # |-separated alternatives, case-insensitive, on
                                         # word boundaries
    forbid = ["\\bsilver\\b"]        # case-insensitive regexes, none may match the reply
    checks = ["in_character"]        # named checks (score.CHECKS): in_character,
                                     # no_stage_directions, in_world, no_raw_call
    calls = [{ name = "give_item", arguments = { item = "rye", count = 2 } }]
                                     # exactly these tool calls, in any order; [] = none
    intent = "buy"                   # the intent_classified event's intent ("" = none found)
    attributes = { tone = "angry" }  # the attributes_classified event's values
    route = "triggered"              # the exit the agent's HumanMessageGuardrail took

    # A recall conversation: the player states facts in the first turns, then fillers; at
    # each checkpoint (turns after the last fact) the dialog is exported, and each question
    # is asked of a copy of it (one case per checkpoint and question, category "recall").
    [[recall]]
    id = "aldric"
    agent = "brenna_long"
    facts = ["My name is Aldric.", "I'm looking for my sister Mira."]
    filler = "oakvale"
    checkpoints = [5, 50, 300]
    questions = [{ say = "What is my name?", expect = ["Aldric"] }]

Nothing here talks to a server: `load_suite()` reads and checks every file, and an error
names the file and the key.
"""
from __future__ import annotations

import hashlib
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tryll_fast.gateway.config import PipelineAgent, parse_pipeline_config
from tryll_fast.server.config import ConfigError

CASES_DIR = Path(__file__).with_name("cases")
CATEGORIES = ("facts", "knowledge", "recall", "character", "tools", "classify", "guardrail")
_CASE_KEYS = {"id", "category", "agent", "say", "variables", "expect", "forbid", "checks",
              "calls", "intent", "attributes", "route", "note"}
_SCORED = ("expect", "forbid", "checks", "calls", "intent", "attributes", "route")
_RECALL_KEYS = {"id", "agent", "facts", "filler", "checkpoints", "questions", "note"}
_FILE_KEYS = {"setting", "agents", "storages", "fillers", "case", "recall"}
_ID_RE = re.compile(r"[a-z0-9][a-z0-9_.@:-]*")


class SuiteError(ValueError):
    """A case file is malformed: the message names the file and the key."""


@dataclass(frozen=True)
class Call:
    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True)
class Case:
    id: str
    category: str
    setting: str                       # the file's stem
    agent: str
    say: tuple[str, ...]               # the last line is scored
    variables: Mapping[str, Any] = field(default_factory=dict)
    expect: tuple[tuple[str, ...], ...] = ()
    forbid: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    calls: tuple[Call, ...] | None = None
    intent: str | None = None
    attributes: Mapping[str, str] | None = None
    route: str | None = None
    # recall: the conversation it forks from and the turns after the last fact
    recall: str = ""
    checkpoint: int = 0


@dataclass(frozen=True)
class Recall:
    id: str
    setting: str
    agent: str
    facts: tuple[str, ...]
    filler: tuple[str, ...]
    checkpoints: tuple[int, ...]
    cases: tuple[Case, ...]            # checkpoint-major


@dataclass(frozen=True)
class Setting:
    name: str                          # the file's stem
    title: str
    agents: Mapping[str, PipelineAgent]
    storages: Mapping[str, tuple[tuple[str, ...], tuple[Any, ...]]]  # records, metadata


@dataclass(frozen=True)
class Suite:
    settings: Mapping[str, Setting]
    cases: tuple[Case, ...]            # single-exchange cases, file order
    recalls: tuple[Recall, ...]
    digest: str                        # sha256 of the case files, in name order

    def all_cases(self) -> list[Case]:
        return list(self.cases) + [c for r in self.recalls for c in r.cases]

    def agent(self, case_or_recall) -> PipelineAgent:
        return self.settings[case_or_recall.setting].agents[case_or_recall.agent]


def load_suite(directory: str | Path = CASES_DIR) -> Suite:
    files = sorted(Path(directory).glob("*.toml"))
    if not files:
        raise SuiteError(f"{directory}: no case files (*.toml)")
    digest = hashlib.sha256()
    settings: dict[str, Setting] = {}
    cases: list[Case] = []
    recalls: list[Recall] = []
    seen: set[str] = set()
    for path in files:
        raw = path.read_bytes()
        digest.update(path.name.encode() + b"\0" + raw)
        setting, file_cases, file_recalls = _load_file(path, raw)
        settings[setting.name] = setting
        for case in file_cases + [c for r in file_recalls for c in r.cases]:
            if case.id in seen:
                raise SuiteError(f"{path.name}: case id {case.id!r} is used twice in the suite")
            seen.add(case.id)
        cases += file_cases
        recalls += file_recalls
    return Suite(settings=settings, cases=tuple(cases), recalls=tuple(recalls),
                 digest=digest.hexdigest())


def _load_file(path: Path, raw: bytes) -> tuple[Setting, list[Case], list[Recall]]:
    where = path.name
    try:
        doc = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise SuiteError(f"{where}: not valid TOML: {exc}") from None
    unknown = set(doc) - _FILE_KEYS
    if unknown:
        raise SuiteError(f"{where}: unknown top-level keys {sorted(unknown)} (allowed: "
                         f"{sorted(_FILE_KEYS)})")
    for name, spec in doc.get("agents", {}).items():
        if isinstance(spec, Mapping) and "default_model" in spec:
            raise SuiteError(f"{where}: agents.{name}.default_model: leave it out, the runner "
                             "sets the model under test")
    try:
        agents = parse_pipeline_config({"agents": doc.get("agents", {})}, where).agents
    except ConfigError as exc:
        raise SuiteError(str(exc)) from None
    storages = {}
    for name, spec in doc.get("storages", {}).items():
        key = f"{where}: storages.{name}"
        records = _strings(spec.get("records") if isinstance(spec, Mapping) else None,
                           f"{key}.records")
        if not records:
            raise SuiteError(f"{key}.records: at least one record")
        metadata = tuple(spec.get("metadata", ()))
        if metadata and len(metadata) != len(records):
            raise SuiteError(f"{key}.metadata: {len(metadata)} entries for {len(records)} "
                             "records")
        storages[name] = (records, metadata)
    fillers = {name: _strings(lines, f"{where}: fillers.{name}")
               for name, lines in doc.get("fillers", {}).items()}
    setting = Setting(name=path.stem, title=str(doc.get("setting", path.stem)),
                      agents=agents, storages=storages)
    cases = [_case(item, i, setting, where) for i, item in enumerate(doc.get("case", []))]
    recalls = [_recall(item, i, setting, fillers, where)
               for i, item in enumerate(doc.get("recall", []))]
    return setting, cases, recalls


def _case(item: Any, i: int, setting: Setting, where: str, *, recall: str = "",
          checkpoint: int = 0, category: str | None = None) -> Case:
    key = f"{where}: case[{i}]"
    if not isinstance(item, Mapping):
        raise SuiteError(f"{key}: expected a table")
    unknown = set(item) - _CASE_KEYS
    if unknown:
        raise SuiteError(f"{key}: unknown keys {sorted(unknown)} (allowed: {sorted(_CASE_KEYS)})")
    case_id = item.get("id")
    if not isinstance(case_id, str) or not _ID_RE.fullmatch(case_id):
        raise SuiteError(f"{key}.id: {case_id!r} is not a lowercase id ([a-z0-9_.@:-])")
    key = f"{where}: case {case_id!r}"
    category = category or item.get("category")
    if category not in CATEGORIES:
        raise SuiteError(f"{key}.category: {category!r} is not one of {CATEGORIES}")
    agent = item.get("agent")
    if agent not in setting.agents:
        raise SuiteError(f"{key}.agent: {agent!r} is not an agent of this file "
                         f"({', '.join(setting.agents)})")
    say = item.get("say")
    say = (say,) if isinstance(say, str) else _strings(say, f"{key}.say")
    if not say or not all(s.strip() for s in say):
        raise SuiteError(f"{key}.say: at least one non-empty line")
    if not any(k in item for k in _SCORED):
        raise SuiteError(f"{key}: nothing to score (give one of {', '.join(_SCORED)})")
    from benchmarks.npc.score import CHECKS
    checks = _strings(item.get("checks", ()), f"{key}.checks")
    for c in checks:
        if c not in CHECKS:
            raise SuiteError(f"{key}.checks: {c!r} is not one of {sorted(CHECKS)}")
    forbid = _strings(item.get("forbid", ()), f"{key}.forbid")
    for pattern in forbid:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SuiteError(f"{key}.forbid: {pattern!r} is not a regex: {exc}") from None
    expect = tuple(tuple(alt.strip() for alt in item_.split("|") if alt.strip())
                   for item_ in _strings(item.get("expect", ()), f"{key}.expect"))
    if any(not alts for alts in expect):
        raise SuiteError(f"{key}.expect: an empty item")
    calls = None
    if "calls" in item:
        if not isinstance(item["calls"], list):
            raise SuiteError(f"{key}.calls: expected a list of {{name, arguments}}")
        calls = []
        for j, c in enumerate(item["calls"]):
            if not (isinstance(c, Mapping) and isinstance(c.get("name"), str)
                    and isinstance(c.get("arguments", {}), Mapping)
                    and set(c) <= {"name", "arguments"}):
                raise SuiteError(f"{key}.calls[{j}]: expected {{name = str, arguments = "
                                 "table}}")
            calls.append(Call(c["name"], dict(c.get("arguments", {}))))
        calls = tuple(calls)
    intent = item.get("intent")
    if intent is not None and not isinstance(intent, str):
        raise SuiteError(f"{key}.intent: expected a string")
    attributes = item.get("attributes")
    if attributes is not None and not (isinstance(attributes, Mapping) and all(
            isinstance(v, str) for v in attributes.values())):
        raise SuiteError(f"{key}.attributes: expected a table of strings")
    route = item.get("route")
    if route is not None and not isinstance(route, str):
        raise SuiteError(f"{key}.route: expected an exit name")
    variables = item.get("variables", {})
    if not isinstance(variables, Mapping):
        raise SuiteError(f"{key}.variables: expected a table")
    return Case(id=case_id, category=category, setting=setting.name, agent=agent, say=say,
                variables=dict(variables), expect=expect, forbid=forbid, checks=checks,
                calls=calls, intent=intent, attributes=attributes, route=route,
                recall=recall, checkpoint=checkpoint)


def _recall(item: Any, i: int, setting: Setting, fillers: Mapping[str, tuple[str, ...]],
            where: str) -> Recall:
    key = f"{where}: recall[{i}]"
    if not isinstance(item, Mapping):
        raise SuiteError(f"{key}: expected a table")
    unknown = set(item) - _RECALL_KEYS
    if unknown:
        raise SuiteError(f"{key}: unknown keys {sorted(unknown)} (allowed: "
                         f"{sorted(_RECALL_KEYS)})")
    rid = item.get("id")
    if not isinstance(rid, str) or not _ID_RE.fullmatch(rid):
        raise SuiteError(f"{key}.id: {rid!r} is not a lowercase id")
    key = f"{where}: recall {rid!r}"
    agent = item.get("agent")
    if agent not in setting.agents:
        raise SuiteError(f"{key}.agent: {agent!r} is not an agent of this file")
    facts = _strings(item.get("facts"), f"{key}.facts")
    filler = fillers.get(item.get("filler"))
    if not facts or not filler:
        raise SuiteError(f"{key}: needs facts and a filler list named in [fillers]")
    checkpoints = item.get("checkpoints")
    if not (isinstance(checkpoints, list) and checkpoints
            and all(isinstance(n, int) and n > 0 for n in checkpoints)
            and checkpoints == sorted(set(checkpoints))):
        raise SuiteError(f"{key}.checkpoints: increasing positive turn counts")
    questions = item.get("questions")
    if not isinstance(questions, list) or not questions:
        raise SuiteError(f"{key}.questions: at least one")
    cases = []
    for n in checkpoints:
        for j, q in enumerate(questions):
            if not isinstance(q, Mapping):
                raise SuiteError(f"{key}.questions[{j}]: expected a table")
            body = dict(q, id=f"{rid}@{n}:{j + 1}", agent=agent)
            cases.append(_case(body, j, setting, f"{key}.questions", recall=rid,
                               checkpoint=n, category="recall"))
    return Recall(id=rid, setting=setting.name, agent=agent, facts=facts, filler=filler,
                  checkpoints=tuple(checkpoints), cases=tuple(cases))


def _strings(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise SuiteError(f"{key}: expected a list of strings")
    return tuple(value)
