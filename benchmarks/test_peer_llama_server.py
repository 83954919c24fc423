"""Peer: our server next to llama.cpp's own llama-server, on the same workload.

Workload: 8 NPCs, each with the same ~420-token town lore (benchmarks/engine_workload.py)
as its system prompt plus its own persona, talk to a traveller at the same moment, greedy,
SmolLM2-135M-Instruct, 2 threads. Two cases, wall time for all 8 turns:
  first_contact  each NPC's first user message, nothing of it in any cache yet;
  warm           each NPC's second message, with round 1 (its own reply included) as
                 history: what is cached from round 1 is reused.

Our side: one session over TCP with 8 agents; each agent a single Generate node with the
lore as its system prompt (the shared prefix) and the persona as its template (the default
placement: a system message right before the player's words), temperature 0,
repeat_penalty 1, max 64 tokens. The server keeps the dialog itself.

The peer: llama-server built from the vendor/llama.cpp of the llama-cpp-python sdist we
pin (`make llama-server`, the same AMX-off flags, so both sides run the same kernels):
  llama-server -m <gguf> --host 127.0.0.1 --port <free> -np 8 --kv-unified -c 8192
               -t 2 -tb 2 -b 512 -ub 512 --jinja --no-webui
8 slots (one per NPC) over one unified KV pool, the same threads and batch size as ours
(llama.n_batch 512 is our n_batch and n_ubatch), the GGUF's own chat template (--jinja; the
rendered prompt is checked to be the very text ours renders). 8 concurrent
/v1/chat/completions requests, one thread per NPC, non-streamed (its
cheapest mode; ours streams every token), temperature 0 and top_k 1 (greedy),
cache_prompt, each NPC pinned to its own slot (id_slot) so its round-1 KV is there for its
round 2. The client sends the same messages ours projects, the history holding the reply
llama-server itself gave.

Equal work: both sides generate exactly 64 tokens per NPC with end-of-generation ignored
(our SamplingOverrides.ignore_eos, llama-server's ignore_eos), and every round asserts both
sides' reported counts, so the wall times compare the same number of generated tokens.
(A greedy reply's length is not a constant of the prompt: batched with others, its floats
differ a little and greedy follows them, so a reply left to stop by itself ended at 53
tokens in one round and 64 in the next.)

Cold means cold: every round starts a fresh process on both sides (untimed), so the first
contact finds no lore in any cache, ours' prefix cache included (restarting llama-server
also empties its RAM prompt cache, --cache-ram). Within a round the lore may legitimately
be shared between NPCs: our shared prefix does that; llama-server's slots each decode their
own prompt when the requests arrive together (cache_prompt reuses a slot's own KV, the
unified pool only lets the slots take what they need). Each fresh process gets one untimed
warm-up decode before the round (llama-server does it at start; ours runs a 1-token turn of
an unrelated agent). llama-server's other defaults stay (flash attention auto like ours,
--cache-idle-slots: with a unified KV an idle slot is copied to the RAM prompt cache when
another starts a task, and restored from there by its own next task).

Gates (benchmarks/gates.py): median(llama_server) / median(ours) per case.
"""
import os
import statistics

import pytest

from benchmarks import peer_workload as pw
from benchmarks.transport_load import ServerProcess

MODELS_DIR = os.path.join(pw.ROOT, "build", "models")
# 8 conversations + the warm-up agent fit without eviction; 8192 cells hold 8 dialogs
# of two turns even if every NPC decoded the lore itself
SETTINGS = (f"llama.n_threads={pw.N_THREADS}", "llama.n_slots=12", "llama.max_n_ctx=8192",
            f"llama.n_batch={pw.N_BATCH}")
ROUNDS = 2


class Rig:
    """The processes of the current round; each restart closes the previous ones, close()
    ends whatever is left (also when a round fails)."""

    def __init__(self, gguf: str) -> None:
        self.gguf = gguf
        self.closers: list = []

    def _close_all(self) -> None:
        while self.closers:
            self.closers.pop()()

    def ours(self) -> pw.OursDriver:
        self._close_all()
        proc = ServerProcess("reactor", models_dir=MODELS_DIR, settings=SETTINGS)
        self.closers.append(proc.close)
        driver = pw.OursDriver(proc.port)
        self.closers.append(driver.close)
        driver.setup()
        return driver

    def llama_server(self) -> pw.LlamaServerDriver:
        self._close_all()
        binary = pw.llama_server_binary()
        if not os.path.exists(binary):
            pytest.fail(f"no llama-server at {binary}: run `make llama-server`")
        server = pw.LlamaServer(binary, self.gguf)
        self.closers.append(server.close)
        driver = pw.LlamaServerDriver(server)
        self.closers.append(driver.close)
        return driver

    close = _close_all


@pytest.fixture(scope="module")
def gguf():
    return pw.model_path(MODELS_DIR)


@pytest.fixture
def rig(gguf):
    r = Rig(gguf)
    try:
        yield r
    finally:
        r.close()


# Ours' rendered round-1 prompts: the ours tests run first (file order) and the llama-server
# test checks its template renders the same text.
_OURS: dict[str, list] = {}
EXPECTED = [pw.MAX_TOKENS] * pw.N_NPCS      # every NPC, every round, both sides


def _measure(benchmark, setup, run, case: str, impl: str, expected: list[int]):
    results = []

    def target(driver):
        results.append(run(driver))

    benchmark.pedantic(target, setup=lambda: ((setup(),), {}), rounds=ROUNDS, iterations=1)
    last = results[-1]
    for res in results:
        assert [x["generated"] for x in res] == expected, (impl, case, res)
    generated = sum(x["generated"] for x in last)
    benchmark.group = f"peer_{case}"
    benchmark.extra_info.update(
        suite="peer", case=case, impl=impl, npcs=pw.N_NPCS, max_tokens=pw.MAX_TOKENS,
        tokens_generated=generated,
        prompt_tokens=sum(x["prompt"] for x in last),
        prompt_tokens_decoded=sum(x["prefilled"] or 0 for x in last),
        tokens_per_s=generated / statistics.median(benchmark.stats.stats.data))
    print(f"\n{impl} {case}: rounds {[round(t, 3) for t in benchmark.stats.stats.data]} s, "
          f"generated {[x['generated'] for x in last]} "
          f"prompt {[x['prompt'] for x in last]} decoded {[x['prefilled'] for x in last]}")
    return last


def test_first_contact_ours(benchmark, rig):
    last = _measure(benchmark, rig.ours, lambda d: d.round(), "first_contact", "ours",
                    EXPECTED)
    _OURS["prompts"] = [x["node"]["prompt"] for x in last]


def test_warm_ours(benchmark, rig):
    def setup():
        d = rig.ours()
        d.round()
        return d

    _measure(benchmark, setup, lambda d: d.round(text=pw.second_message), "warm", "ours",
             EXPECTED)


def test_first_contact_llama_server(benchmark, rig):
    def setup():
        d = rig.llama_server()
        for i, want in enumerate(_OURS.get("prompts", [])):
            status, out = d.server.request("POST", "/apply-template", {
                "messages": pw.messages(i, [], pw.first_message(i))})
            assert status == 200 and out["prompt"] == want, (out, want)
        return d

    _measure(benchmark, setup, lambda d: d.round(pw.first_message, EXPECTED), "first_contact",
             "llama_server", EXPECTED)


def test_warm_llama_server(benchmark, rig):
    def setup():
        d = rig.llama_server()
        d.round(pw.first_message, EXPECTED)
        return d

    _measure(benchmark, setup, lambda d: d.round(pw.second_message, EXPECTED), "warm",
             "llama_server", EXPECTED)
