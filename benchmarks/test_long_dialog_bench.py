"""A 300-turn conversation with and without a Summarize node, over TCP against a server
process with the real SmolLM2 (greedy; Generate with the model's whole 8192-token window,
32 tokens a reply).

Gate (python -m benchmarks.gates):
  long_dialog_first_token_flat   first-token latency at turns 296-300 over turns 8-12 of
                                 the same conversation with Summarize on (p50 of each five;
                                 the client's clock: SendMessage about to be sent -> first
                                 AnswerText received)                                 <= 1.5
Reported, not gated: the same ratio without Summarize (the prompt grows to the window),
whether the reply at turn 300 knows what the player said at turn 5 (their name), both
ways, and whether the running summary at turn 300 still holds it.

Most turns are scripted (AppendInteractions); the real ones are turn 5 (the fact), 8-12,
296-300 and, with Summarize on, one closing each block of 35 scripted turns (the last one is
turn 295), which starts a summary that is waited for before the next block (a player reads
the replies: a summary has the time to land). Without Summarize those turns are scripted
too, and the Generate node's window is all the dialog that fits.
"""
import json
import statistics
import time

import pytest

from benchmarks.test_workflow_bench import SMOL, _drain_turn, _request, smol_server
from benchmarks.transport_load import Client
from tryll_fast import codec
from tryll_fast.workflow.projection import SUMMARY_LABEL

SYSTEM = ("You are Brenna, the baker of Oakvale, a quiet village by the river. You sell "
          "bread, pies and cakes, and you know every villager by name. Answer the traveller "
          "in one or two short sentences.")
FACT = "Hello! My name is Aldric and I am on a quest to find the silver key of Greyfen."
QUESTION = "What is my name, and what is my quest?"
TOPICS = ["the weather", "the price of bread", "the old mill", "the river fish",
          "the harvest festival", "the blacksmith", "the village well", "the night watch",
          "the herb garden", "the tavern songs", "the market day", "the church bells",
          "the apple orchard", "the fishing boats", "the town guard", "the spring fair"]
MAX_TOKENS = 32
SAMPLES = 5                                    # turns 8-12 and 296-300
SETTINGS = ("llama.max_n_ctx=8192", "llama.n_slots=4", "llama.n_batch=512")


@pytest.fixture(scope="module")
def server():
    proc = smol_server(SETTINGS)
    yield proc
    proc.close()


def graph(summarize: bool) -> codec.GraphDescription:
    nodes = [codec.NodeDescription(name="answer", params=codec.GenerateParams(
        system_prompt=SYSTEM, default_exit="remember" if summarize else "",
        sampling=codec.SamplingOverrides(temperature=0, max_tokens=MAX_TOKENS)))]
    if summarize:
        nodes.append(codec.NodeDescription(name="remember", params=codec.SummarizeParams(
            context_size=2048, max_summary_tokens=64)))
    return codec.GraphDescription(nodes=nodes, start_node="answer")


def scripted(start: int, n: int) -> list:
    return [codec.DialogInteraction(
        user_message=f"What do you think about {TOPICS[i % len(TOPICS)]}?",
        assistant_message=f"Ah, {TOPICS[i % len(TOPICS)]}! Everyone in Oakvale talks about "
                          f"{TOPICS[i % len(TOPICS)]} these days.")
        for i in range(start, start + n)]


class Conversation:
    def __init__(self, c: Client, summarize: bool) -> None:
        self.c = c
        self.summarize = summarize
        reply = _request(c, codec.CreateAgentRequest(
            request_id=2, graph=graph(summarize), default_model_name=SMOL,
            enable_diagnostics=True))
        assert isinstance(reply, codec.CreateAgentResponse), reply
        self.aid = reply.agent_id
        self.at = 0                            # turns so far
        self.summarized = 0
        self.waits: list[float] = []

    def append(self, n: int) -> None:
        reply = _request(self.c, codec.AppendInteractionsRequest(
            request_id=11, agent_id=self.aid, interactions=scripted(self.at, n)))
        assert reply.appended_count == n, reply
        self.at += n

    def turn(self, text: str | None = None) -> dict:
        """One real turn: seconds to its first AnswerText (the client's clock), the reply,
        the Generate node's diagnostics, whether Summarize started a summary."""
        self.at += 1
        text = text or f"What do you think about {TOPICS[self.at % len(TOPICS)]}?"
        frame = codec.encode(codec.SendMessageRequest(request_id=3, agent_id=self.aid,
                                                      text=text))
        t0 = time.perf_counter()
        self.c.sock.sendall(frame)
        first, complete = _drain_turn(self.c, t0)
        nodes = json.loads(complete.debug_info)["nodes"]
        started = any(n.get("summary") == "started" for n in nodes)
        return {"first_ms": first * 1000, "node": nodes[0], "started": started}

    def wait_for_summary(self, timeout: float = 600.0) -> None:
        """Until a summary standing for more interactions than the last one has landed."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            snap = _request(self.c, codec.ExportDialogRequest(request_id=12,
                                                              agent_id=self.aid)).snapshot
            root = codec.decode_root(codec.PersistedDialogSnapshot, bytes(snap)).to_dict()
            counts = [c["body"]["PersistedSummary"]["summarized_interaction_count"]
                      for i in root["interactions"] for c in i["components"]
                      if "PersistedSummary" in c["body"]]
            if counts and counts[-1] > self.summarized:
                self.summarized = counts[-1]
                self.waits.append(time.monotonic() - t0)
                return
            time.sleep(0.2)
        raise AssertionError(f"no new summary after {timeout} s")

    def run(self) -> dict:
        self.append(4)
        self.turn(FACT)                                            # turn 5
        self.append(2)
        early = [self.turn() for _ in range(SAMPLES)]              # turns 8-12
        # with Summarize, a real turn closes each block, the last one right before the
        # samples, so no summary starts among them (the one of turn 295 lands first)
        for close in range(300 - SAMPLES - 36 * ((300 - SAMPLES - 13) // 36), 296, 36):
            self.append(close - 1 - self.at)
            if not self.summarize:
                self.append(1)
            elif self.turn()["started"]:
                self.wait_for_summary()
        self.append(300 - SAMPLES - self.at)
        late = [self.turn() for _ in range(SAMPLES - 1)] + [self.turn(QUESTION)]
        assert self.at == 300
        prompt = late[-1]["node"]["prompt"]
        at = prompt.find(SUMMARY_LABEL)
        summary = prompt[at:prompt.index("<|im_end|>", at)] if at >= 0 else ""
        return {"early": early, "late": late, "answer": self.reply_at_300(),
                "summary": summary, "summarized": late[-1]["node"]["summarized_interactions"]}

    def reply_at_300(self) -> str:
        """Diagnostics carry the prompt, not the reply: read it from the dialog."""
        snap = _request(self.c, codec.ExportDialogRequest(request_id=13,
                                                          agent_id=self.aid)).snapshot
        root = codec.decode_root(codec.PersistedDialogSnapshot, bytes(snap)).to_dict()
        return "".join(c["body"]["PersistedAssistantMessage"]["text"]
                       for c in root["interactions"][-1]["components"]
                       if "PersistedAssistantMessage" in c["body"])


def test_long_dialog_first_token(benchmark, server):
    c = Client(server.port)
    try:
        warm = Conversation(c, summarize=False)
        warm.turn("Hi")                                            # model loaded, caches hot
        _request(c, codec.DestroyAgentRequest(request_id=4, agent_id=warm.aid))

        def both():
            out = {}
            for name, summarize in (("summarize", True), ("plain", False)):
                conv = Conversation(c, summarize)
                out[name] = conv.run()
                out[name]["waits"] = conv.waits
                _request(c, codec.DestroyAgentRequest(request_id=4, agent_id=conv.aid))
            return out

        runs = benchmark.pedantic(both, rounds=1, iterations=1)
    finally:
        c.close()
    info = {"suite": "workflow", "case": "long_dialog", "turns": 300, "samples": SAMPLES,
            "settings": list(SETTINGS)}
    for name, r in runs.items():
        early = statistics.median(t["first_ms"] for t in r["early"])
        late = statistics.median(t["first_ms"] for t in r["late"])
        info.update({
            f"{name}_first_token_ms_t10": early, f"{name}_first_token_ms_t300": late,
            f"{name}_ratio": late / early,
            f"{name}_first_token_ms_samples": [round(t["first_ms"], 1)
                                               for t in r["early"] + r["late"]],
            f"{name}_prompt_tokens_t300": r["late"][-1]["node"]["prompt_tokens"],
            f"{name}_knows_fact": "Aldric" in r["answer"],
            f"{name}_answer_t300": r["answer"]})
    on = runs["summarize"]
    info.update(summaries_waited_s=[round(s, 1) for s in on["waits"]],
                summary_interactions_t300=on["summarized"],
                summary_has_fact="Aldric" in on["summary"], summary_t300=on["summary"])
    benchmark.group = "workflow"
    benchmark.extra_info.update(info)
