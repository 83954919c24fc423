"""Running the suite against a live server: one server process per model, the project's own
client over TCP, every case through the product path (CreateAgent from the case file's
graph, SendMessage, the frames and events a game would read).

Per case an agent of the case's graph with an empty dialog (the case's variables over the
agent's), greedy with a fixed seed; agents are kept between the cases of one worker, as a
game keeps its NPCs. The last line said is scored. Recall conversations run their facts and fillers as real
turns, export the dialog at each checkpoint and ask every question of a copy of it (an
agent of the same graph with the dialog imported), so the questions do not see each other.
Before a checkpoint a running summary is waited for, as a player reading the replies
gives it time to land.

Measured per model besides the verdicts: first-token and whole-turn latency (the
client's clock: SendMessage sent -> first AnswerText / TurnComplete) and tokens per
second of decoding, from single-line facts and character cases run one at a time after
the scored pass, each on an NPC that has answered once already (its persona's KV
resident, its dialog cleared), and the server's resident memory (VmRSS after the run, VmHWM its peak),
read from /proc.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from benchmarks.npc.cases import Case, Recall, Suite
from benchmarks.npc.score import Outcome, judge
from benchmarks.transport_load import ServerProcess
from tryll_fast import codec
from tryll_fast.client import GraphDescription, TryllClient, TryllError
from tryll_fast.client.agents import python_value
from tryll_fast.models import load_catalog

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS_DIR = os.path.join(ROOT, "build", "models")
SEED = 20261206
# The server's settings for the suite: one KV cache of 8192 cells shared by every
# conversation, room for four workers' tool prompts (about 1000 tokens each) beside a
# recall conversation's 2048-token window and its summary. With 4096 the engine ran out of
# cells while the recall ran and failed a third of the tool cases ("KV cache full"),
# which measured the cache, not the model.
SETTINGS = ("llama.max_n_ctx=8192", "llama.n_slots=8")
_LLM_PARAMS = (codec.GenerateParams, codec.GenerateAndSpeakParams, codec.ToolCallParams,
               codec.SummarizeParams, codec.ClassifyIntentLLMParams,
               codec.ClassifyAttributesLLMParams)


class Server(ServerProcess):
    """The benchmark server (benchmarks.transport_server, the reactor) with the suite's
    settings in a subprocess, and its memory as the kernel counts it."""

    def __init__(self, models_dir: str = MODELS_DIR, settings: Iterable[str] = SETTINGS,
                 log=None) -> None:
        super().__init__("reactor", models_dir=models_dir, settings=tuple(settings),
                         stderr=log)

    def memory_mb(self) -> dict[str, float]:
        out = {}
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(value.split()[0]) / 1024
        return {"rss_mb": round(out.get("VmRSS", 0), 1), "peak_rss_mb": round(out.get("VmHWM", 0), 1)}


def greedy(params):
    """The node's params with greedy sampling and the suite's seed (other fields kept)."""
    if not isinstance(params, _LLM_PARAMS) or not hasattr(params, "sampling"):
        return params
    s = params.sampling or codec.SamplingOverrides()
    fields = {name: getattr(s, name) for name in type(s).FIELDS}
    fields.update(temperature=0.0, seed=SEED)
    return type(params)(**{**{n: getattr(params, n) for n in type(params).FIELDS},
                           "sampling": codec.SamplingOverrides(**fields)})


def graph_for(agent, model: str) -> GraphDescription:
    g = GraphDescription().set_default_model_name(model)
    for node in agent.graph.nodes:
        g.add_node(node.name, greedy(node.params))
    return g.set_start_node(agent.graph.start_node)


@dataclass
class Turn:
    text: str
    texts: dict[str, str]
    events: list
    first_token_s: float | None
    turn_s: float
    tokens: int
    status: int
    errors: list[str]
    debug: dict | None


def say(agent, line: str, timeout: float = 600) -> Turn:
    t0 = time.perf_counter()
    first = None
    stream = agent.send(line, timeout=timeout)
    for _chunk in stream:
        if first is None:
            first = time.perf_counter() - t0
    result = stream.result(timeout)
    turn_s = time.perf_counter() - t0
    # the reply a player sees: the last node that produced text
    texts = {k: v for k, v in result.texts.items() if v}
    text = list(texts.values())[-1] if texts else ""
    debug = json.loads(result.debug_info) if result.debug_info else None
    return Turn(text=text, texts=texts, events=list(result.events), first_token_s=first,
                turn_s=turn_s, tokens=result.tokens_generated, status=result.status,
                errors=[str(e) for e in result.errors], debug=debug)


def _pairs(event) -> dict[str, str]:
    return {p.key: p.value for p in event.kv_pairs}


def outcome_of(case: Case, turn: Turn) -> Outcome:
    out = Outcome(case_id=case.id, category=case.category, text=turn.text,
                  first_token_s=turn.first_token_s, turn_s=turn.turn_s, tokens=turn.tokens)
    if turn.errors:
        out.error = "; ".join(turn.errors)
    elif turn.status != codec.TurnStatus.Success:
        out.error = f"turn status {codec.TurnStatus(turn.status).name}"
    for ev in turn.events:
        pairs = _pairs(ev)
        if ev.event_type == "tool_call":
            try:
                args = json.loads(pairs.get("arguments_json") or "{}")
            except ValueError:
                args = pairs.get("arguments_json")
            out.calls.append({"name": pairs.get("tool_name", ""), "arguments": args})
        elif ev.event_type == "intent_classified":
            out.intent = pairs.get("intent", "") if pairs.get("found") == "true" else ""
        elif ev.event_type == "attributes_classified":
            out.attributes = {k: v for k, v in pairs.items() if not k.endswith(".probability")}
    if case.route is not None and turn.debug:
        for node in turn.debug.get("nodes", []):
            if node.get("type") == "HumanMessageGuardrail":
                out.route = node.get("exit")
                break
    return judge(case, out)


class Runner:
    """The suite for one model on one server."""

    def __init__(self, suite: Suite, model: str, client: TryllClient,
                 progress: Callable[[str], None] = lambda s: None) -> None:
        self.suite = suite
        self.model = model
        self.client = client
        self.progress = progress
        self.pool: dict[tuple, Any] = {}        # (setting, agent, variables) -> Agent

    def setup(self) -> None:
        embedder = next(e.name for e in load_catalog().defaults() if e.role == "embedding")
        for setting in self.suite.settings.values():
            for name, (records, metadata) in setting.storages.items():
                self.client.create_embedded_string_storage(
                    name, strings=list(records), metadata=list(metadata),
                    embedding_model=embedder, timeout=600)

    def agent(self, case_or_recall, variables: dict | None = None, diagnostics=False):
        spec = self.suite.agent(case_or_recall)
        values = {v.name: python_value(v.value) for v in spec.variables}
        values.update(variables or {})
        return self.client.create_agent(graph_for(spec, self.model), variables=values,
                                        enable_diagnostics=diagnostics, timeout=600)

    def case(self, case: Case) -> Outcome:
        """One case on an agent of its graph with an empty dialog and its variables as the
        case gives them. Agents are kept between cases, as a game keeps its NPCs: the next
        case clears the dialog and sets the variables again, and the conversation's KV
        for the system prompt is reused, not decoded again."""
        spec = self.suite.agent(case)
        values = {v.name: python_value(v.value) for v in spec.variables}
        values.update(case.variables)
        key = (case.setting, case.agent, tuple(sorted(case.variables.items())))
        try:
            agent = self.pool.get(key)
            if agent is None:
                agent = self.pool[key] = self.agent(case, dict(case.variables),
                                                    diagnostics=True)
            else:
                agent.remove_interactions_from_end(1 << 30, timeout=600)
                if values:
                    agent.update_variables(values, timeout=600)
        except TryllError as exc:
            return judge(case, Outcome(case.id, case.category, error=f"agent: {exc}"))
        try:
            for line in case.say[:-1]:
                say(agent, line)
            return outcome_of(case, say(agent, case.say[-1]))
        except TryllError as exc:
            return judge(case, Outcome(case.id, case.category, error=str(exc)))

    def close(self) -> None:
        for agent in self.pool.values():
            agent.destroy()
        self.pool.clear()

    def recall(self, recall: Recall) -> list[Outcome]:
        agent = self.agent(recall, diagnostics=True)
        outcomes: list[Outcome] = []
        try:
            said = 0
            last = None
            for line in recall.facts:
                last = say(agent, line)
                said += 1
            filler = 0
            for checkpoint in recall.checkpoints:
                while filler < checkpoint:
                    last = say(agent, recall.filler[filler % len(recall.filler)])
                    filler += 1
                    if filler % 25 == 0:
                        self.progress(f"  {recall.id}: {len(recall.facts) + filler} turns")
                self._settle_summary(agent, last)
                snapshot = agent.export_dialog(timeout=600)
                for case in recall.cases:
                    if case.checkpoint != checkpoint:
                        continue
                    outcomes.append(self._ask(recall, case, snapshot))
        finally:
            agent.destroy()
        return outcomes

    def _ask(self, recall: Recall, case: Case, snapshot: bytes) -> Outcome:
        copy = self.agent(recall)
        try:
            copy.import_dialog(snapshot, timeout=600)
            return outcome_of(case, say(copy, case.say[-1]))
        except TryllError as exc:
            return judge(case, Outcome(case.id, case.category, error=str(exc)))
        finally:
            copy.destroy()

    def _settle_summary(self, agent, last: Turn | None, timeout: float = 300) -> None:
        """A summary the last turn started or found running: wait until it has landed."""
        states = [n.get("summary") for n in (last.debug or {}).get("nodes", [])
                  if n.get("type") == "Summarize"] if last is not None else []
        if not any(s in ("started", "running") for s in states):
            return
        before = _summarized(agent.export_dialog(timeout=600))
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            time.sleep(0.5)
            if _summarized(agent.export_dialog(timeout=600)) > before:
                return


def _summarized(snapshot: bytes) -> int:
    root = codec.decode_root(codec.PersistedDialogSnapshot, bytes(snapshot)).to_dict()
    counts = [c["body"]["PersistedSummary"]["summarized_interaction_count"]
              for i in root["interactions"] for c in i["components"]
              if "PersistedSummary" in c["body"]]
    return counts[-1] if counts else 0


# Cases timed alone after the scored pass: the first per setting of these categories.
LATENCY_CATEGORIES = ("facts", "character")
LATENCY_PER_SETTING = 5


def run_model(suite: Suite, model: str, *, categories: Iterable[str] | None = None,
              limit: int | None = None, progress: Callable[[str], None] = print,
              log=None, settings: tuple[str, ...] = (), parallel: int = 4,
              select: Callable[[Case], bool] | None = None,
              checkpoints: Iterable[int] | None = None) -> dict[str, Any]:
    """Every case of `suite` (or of `categories`, or those `select` keeps; recall
    conversations only up to the largest of `checkpoints`) on `model`: outcomes and
    measurements.

    Scored cases run `parallel` at a time, each worker a connection and session of its own
    (so several agents decode in one batch, as in a game): llama.cpp's greedy output is
    not bit-identical across batch shapes, so a case may answer differently from a run
    with other `parallel`. Latency is measured afterwards, one turn at a time, on the first
    LATENCY_PER_SETTING cases per setting of LATENCY_CATEGORIES."""
    wanted = set(categories) if categories else None
    cases = [c for c in suite.cases if (wanted is None or c.category in wanted)
             and (select is None or select(c))]
    recalls = [r for r in suite.recalls if (wanted is None and limit is None)
               or (wanted is not None and "recall" in wanted)]
    if checkpoints is not None:
        keep = set(checkpoints)
        recalls = [dataclasses.replace(r, checkpoints=tuple(n for n in r.checkpoints
                                                            if n in keep),
                                       cases=tuple(c for c in r.cases if c.checkpoint in keep
                                                   and (select is None or select(c))))
                   for r in recalls]
        recalls = [r for r in recalls if r.cases]
    if limit is not None:
        cases = cases[:limit]
    server = Server(settings=SETTINGS + tuple(settings), log=log)
    t0 = time.monotonic()
    local = threading.local()
    clients: list[TryllClient] = []
    lock = threading.Lock()
    done: list[Outcome] = []

    runners: list[Runner] = []

    def runner() -> Runner:
        r = getattr(local, "runner", None)
        if r is None:
            client = TryllClient("127.0.0.1", server.port, timeout=900).connect()
            client.create_session()
            r = local.runner = Runner(suite, model, client, progress)
            with lock:
                clients.append(client)
                runners.append(r)
            r.setup()
        return r

    def one(case: Case) -> list[Outcome]:
        out = [runner().case(case)]
        with lock:
            done.extend(out)
            if len(done) % 20 == 0:
                progress(f"{model}: {len(done)}/{len(cases)} cases, "
                         f"{sum(o.passed for o in done)} passed")
        return out

    def conversation(recall: Recall) -> list[Outcome]:
        progress(f"{model}: recall {recall.id} ({len(recall.facts)} facts, checkpoints "
                 f"{list(recall.checkpoints)})")
        return runner().recall(recall)

    try:
        first = runner()
        # a first turn loads the model and warms its caches: not scored, not timed
        warm = GraphDescription().add_node("reply", codec.GenerateParams(
            system_prompt="You are a villager.",
            sampling=codec.SamplingOverrides(max_tokens=4))).set_default_model_name(model)
        agent = first.client.create_agent(warm, timeout=600)
        say(agent, "Hello")
        agent.destroy()
        with concurrent.futures.ThreadPoolExecutor(max(1, parallel)) as pool:
            # the long conversations first, so the single cases fill in around them
            jobs = [pool.submit(conversation, r) for r in recalls]
            jobs += [pool.submit(one, c) for c in cases]
            results = [j.result() for j in jobs]
        recall_out = [o for r in results[:len(recalls)] for o in r]
        outcomes = [o for r in results[len(recalls):] for o in r] + recall_out
        for r in runners:                   # free the pooled agents before timing
            r.close()
        timed = []
        per_setting: dict[str, int] = {}
        for case in cases:
            if case.category in LATENCY_CATEGORIES and len(case.say) == 1 and \
                    per_setting.get(case.setting, 0) < LATENCY_PER_SETTING:
                per_setting[case.setting] = per_setting.get(case.setting, 0) + 1
                first.case(case)            # the NPC is up and talking: time its next turn
                timed.append(first.case(case))
        first.close()
        memory = server.memory_mb()
    finally:
        for client in clients:
            client.close()
        server.close()
    return {"model": model, "outcomes": outcomes, "timed": timed, "memory": memory,
            "seconds": round(time.monotonic() - t0, 1), "parallel": parallel}
