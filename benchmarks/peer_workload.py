"""The peer benchmark's workload and its two drivers: our server over TCP, llama.cpp's
own llama-server over HTTP (see benchmarks/test_peer_llama_server.py for the settings).

N NPCs share the town lore of benchmarks/engine_workload.py as their system prompt; each
has its own persona and asks two questions. Both sides are given the same messages in the
same order, the order our projection renders them: the lore (system), the dialog so far,
the persona (a system message right before the player's words), the player's message.
"""
from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import re
import socket
import subprocess
import tempfile
import time

from benchmarks.engine_workload import lore
from benchmarks.transport_load import Client
from tryll_fast import codec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "SmolLM2-135M-Instruct"
N_NPCS = 8
MAX_TOKENS = 64
N_THREADS = 2
N_BATCH = 512

_NPCS = [
    ("Brenna", "the baker"), ("Tamsin", "the blacksmith"), ("Oswin", "the mayor"),
    ("Marla", "the innkeeper"), ("Ysolde", "the miller's daughter"),
    ("Corwin", "the ferryman"), ("Edda", "the temple keeper"), ("Fenn", "the shepherd"),
]
_FIRST = [
    "Good day! Who are you, and what is your work here in Brindlemere?",
    "Hello there. Tell me about yourself and the people you deal with every day.",
    "Greetings. What troubles this town most, in your opinion, and why?",
    "Hi! What is there to eat and drink here, and who should I talk to?",
    "Hello. What do you know about the ruined watchtower on the eastern ridge?",
    "Good evening. How does one cross the river now, and is it dangerous?",
    "Greetings, keeper. Tell me the story of the flame that never goes out.",
    "Hello, shepherd. What happened to the sheep in the high pastures?",
]
_SECOND = [
    "Interesting. Tell me more about that, and what would you advise a stranger to do?",
    "And what should I be careful about while I stay in town?",
    "What would you do about it if the choice were yours alone?",
    "Which of those would you recommend tonight, and what does it cost?",
    "Would you go there yourself? Why or why not?",
    "What else happened since the old bridge collapsed last autumn?",
    "Who looks after it at night, and has anyone ever tried to steal it?",
    "Do you think the wolves will come back, and what can be done?",
]


def system_prompt() -> str:
    """The lore without the trailing newline engine_workload's completion prompts need:
    the chat template puts its own after the message, and a newline of the content's that
    the tokenizer merges with the next piece would keep ours from sharing the lore."""
    return lore().rstrip()


def persona(i: int) -> str:
    name, role = _NPCS[i % len(_NPCS)]
    return (f"You are {name}, {role} of Brindlemere. Stay in character and answer the "
            "traveller in detail, in several full sentences, with what you know of the town.")


def first_message(i: int) -> str:
    return _FIRST[i % len(_FIRST)]


def second_message(i: int) -> str:
    return _SECOND[i % len(_SECOND)]


def messages(i: int, history: list[tuple[str, str]], text: str) -> list[dict]:
    """The chat messages of NPC i's turn, in the order our projection renders them."""
    out = [{"role": "system", "content": system_prompt()}]
    for user, reply in history:
        out += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    out += [{"role": "system", "content": persona(i)}, {"role": "user", "content": text}]
    return out


def model_path(models_dir: str) -> str:
    from tryll_fast.models import ensure_model
    return str(ensure_model(MODEL, models_dir))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- ours -----------------------------------------------------------------------------

class OursDriver:
    """N agents in one session of our server: lore as the system prompt (the shared
    prefix), the persona as the Generate node's template, greedy, max MAX_TOKENS."""

    def __init__(self, port: int, n: int = N_NPCS) -> None:
        self.c = Client(port)
        self.n = n
        self.ids: list[int] = []
        self.rid = 100

    def _request(self, body):
        self.c.sock.sendall(codec.encode(body))
        while True:
            reply = codec.decode(self.c.next_frame()).body
            if getattr(reply, "request_id", None) == body.request_id:
                return reply

    def _create(self, system: str, template: str, max_tokens: int) -> int:
        self.rid += 1
        params = codec.GenerateParams(
            system_prompt=system, template=template,
            placement=codec.Placement.BeforeUserAsSystem,
            # the catalog's default sampling has repeat_penalty 1.1: off, like the peer's;
            # ignore_eos: exactly max_tokens, as llama-server is asked for (equal work)
            sampling=codec.SamplingOverrides(temperature=0, max_tokens=max_tokens,
                                             repeat_penalty=1.0, ignore_eos=True))
        reply = self._request(codec.CreateAgentRequest(
            request_id=self.rid, graph=codec.GraphDescription(
                nodes=[codec.NodeDescription(name="answer", params=params)],
                start_node="answer"),
            default_model_name=MODEL, enable_diagnostics=True,
            kv_cache_initialization=codec.KvCacheInitialization.AllocateOnly))
        assert isinstance(reply, codec.CreateAgentResponse), reply
        return reply.agent_id

    def setup(self) -> None:
        """Load the model and run one unrelated 1-token turn (llama-server warms up its
        graph the same way at start), then create the N agents: nothing of the lore is
        in the KV cache yet."""
        warm = self._create("Warm-up.", "", 1)
        self.round([warm], lambda _i: "Hi")
        self._destroy(warm)
        self.ids = [self._create(system_prompt(), persona(i), MAX_TOKENS) for i in range(self.n)]

    def _destroy(self, aid: int) -> None:
        self.rid += 1
        reply = self._request(codec.DestroyAgentRequest(request_id=self.rid, agent_id=aid))
        assert isinstance(reply, codec.Ack), reply

    def round(self, ids: list[int] | None = None, text=first_message) -> list[dict]:
        """Every agent's turn at once; per agent (in order) the counts its diagnostics
        report and the reply."""
        ids = self.ids if ids is None else ids
        index = {aid: i for i, aid in enumerate(ids)}
        for i, aid in enumerate(ids):
            self.rid += 1
            self.c.sock.sendall(codec.encode(codec.SendMessageRequest(
                request_id=self.rid, agent_id=aid, text=text(i))))
        out: list[dict | None] = [None] * len(ids)
        texts = [[] for _ in ids]
        left = len(ids)
        while left:
            body = codec.decode(self.c.next_frame()).body
            if isinstance(body, codec.AnswerText) and body.agent_id in index:
                texts[index[body.agent_id]].append(body.text)
            elif isinstance(body, codec.TurnComplete):
                assert body.status == codec.TurnStatus.Success, body
                node = json.loads(body.debug_info)["nodes"][0]
                out[index[body.agent_id]] = {
                    "generated": body.tokens_generated, "prompt": node["prompt_tokens"],
                    "prefilled": node["tokens"]["prefilled"],
                    "cached": node["tokens"]["cached"], "node": node}
                left -= 1
            elif isinstance(body, codec.ErrorResponse):
                raise AssertionError(body)
        for o, t in zip(out, texts):
            o["text"] = "".join(t)
        return out

    def close(self) -> None:
        self.c.close()


# --- llama-server ---------------------------------------------------------------------

def llama_server_binary() -> str:
    """The binary `make llama-server` builds (make bench exports its path); found the same
    way when pytest runs alone: the cache dir named after the Makefile's pinned version."""
    if os.environ.get("TRYLL_LLAMA_SERVER"):
        return os.environ["TRYLL_LLAMA_SERVER"]
    with open(os.path.join(ROOT, "Makefile")) as f:
        version = re.search(r"^LLAMA_CPP_VERSION\s*:=\s*(\S+)", f.read(), re.M).group(1)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "tryll_fast", f"llama-server-{version}-noamx", "llama-server")


class LlamaServer:
    """llama-server in a subprocess, killed on close (also when start-up fails)."""

    def __init__(self, binary: str, gguf: str, *, n_ctx_per_slot: int = 1024,
                 n: int = N_NPCS) -> None:
        self.port = free_port()
        self.argv = [
            binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port),
            "-np", str(n), "--kv-unified", "-c", str(n * n_ctx_per_slot),
            "-t", str(N_THREADS), "-tb", str(N_THREADS),
            "-b", str(N_BATCH), "-ub", str(N_BATCH), "--jinja", "--no-webui"]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(self.argv, stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self._wait_healthy(60.0)
        except BaseException:
            self.close()
            raise

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {self.proc.returncode}:\n"
                                   + self.log_tail())
            try:
                status, _ = self.request("GET", "/health")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("llama-server not healthy in time:\n" + self.log_tail())

    def log_tail(self, n: int = 4000) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-n:]

    def request(self, method: str, path: str, body: dict | None = None,
                conn: http.client.HTTPConnection | None = None):
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, (json.loads(data) if data else None)
        finally:
            if own:
                conn.close()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


class LlamaServerDriver:
    """N concurrent chat completions, one thread per NPC,
    each NPC pinned to its own slot (its KV stays there for the next turn)."""

    def __init__(self, server: LlamaServer, n: int = N_NPCS) -> None:
        self.server = server
        self.n = n
        self.history: list[list[tuple[str, str]]] = [[] for _ in range(n)]
        self.pool = concurrent.futures.ThreadPoolExecutor(n)

    def body(self, i: int, text: str, n_predict: int) -> dict:
        return {"messages": messages(i, self.history[i], text), "max_tokens": n_predict,
                "temperature": 0.0, "top_k": 1, "cache_prompt": True,
                "ignore_eos": True, "id_slot": i}

    def _one(self, i: int, text: str, n_predict: int) -> dict:
        # a connection per request: llama-server (cpp-httplib) drops keep-alive connections
        # idle for 5 s, and a loopback connect costs microseconds next to a turn
        status, reply = self.server.request("POST", "/v1/chat/completions",
                                            self.body(i, text, n_predict))
        assert status == 200, reply
        return reply

    def round(self, text, n_predict: list[int]) -> list[dict]:
        """Every NPC's turn at once (n_predict: tokens each generates); appends each reply
        to its NPC's history."""
        futures = [self.pool.submit(self._one, i, text(i), n_predict[i])
                   for i in range(self.n)]
        replies = [f.result() for f in futures]
        out = []
        for i, r in enumerate(replies):
            reply = r["choices"][0]["message"]["content"]
            self.history[i].append((text(i), reply))
            out.append({"generated": r["usage"]["completion_tokens"],
                        "prompt": r["usage"]["prompt_tokens"],
                        "prefilled": r.get("timings", {}).get("prompt_n"),
                        "cached": r.get("timings", {}).get("cache_n"), "text": reply})
        return out

    def close(self) -> None:
        # no wait: after a failure, in-flight requests end when the server is killed next
        self.pool.shutdown(wait=False, cancel_futures=True)
