"""A soak: a mixed, careless workload against one server process, then a check that the
process went back to where it started.

    python -m benchmarks.soak [--minutes 10] [--clients 6] [--margin-mb 40]
    make soak                                  # the same, 10 minutes

The server is a subprocess (benchmarks.transport_server, dev mode) with the real SmolLM2.
`--clients` threads each loop over random actions, each on a connection of its own:
streamed turns, turns cancelled after their first token, turns paused on a tool call (then
resumed with the result, cancelled, or left by a disconnect), dialog export into a new agent,
garbage frames (a length prefix and random bytes), a reader that stops reading in the
middle of a long answer and comes back, and a client that disconnects mid-turn.

Measured from outside the process (/proc and the dev-mode `stats` command, over a fresh
connection): resident memory, open file descriptors, threads, and the engine's KV cells
and conversations, first after one warm-up round of every action with all its sessions
closed (the baseline: models loaded, pools started), then after the soak once its
sessions closed. Exits 1 when memory grew past the margin, any KV cell or conversation is
still held, or the descriptors or threads grew; an action that got an answer it should
not have (a failed turn, no error for garbage) is counted and also fails the run.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import threading
import time
from collections import Counter

from tryll_fast import codec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS_DIR = os.path.join(ROOT, "build", "models")
SMOL = "SmolLM2-135M-Instruct"
SETTINGS = ("llama.max_n_ctx=4096", "llama.n_slots=16", "llama.n_threads=2")
QUESTIONS = ["Who are you?", "What do you sell?", "Tell me about the town.",
             "Is the road north safe?", "What is your favourite bread?"]
SYSTEM = "You are Brenna, the baker of Oakvale. Answer briefly."
WARM_S = 10.0


class Conn:
    """One connection with a session: raw frames, decoded on arrival."""

    def __init__(self, port: int, timeout: float = 120) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.splitter = codec.FrameSplitter()
        self.frames: list = []
        self.rid = 100
        assert isinstance(self.recv(), codec.ConnectionReady)
        assert isinstance(self.request(codec.CreateSessionRequest(request_id=self.next_id())),
                          codec.CreateSessionResponse)

    def next_id(self) -> int:
        self.rid += 1
        return self.rid

    def send(self, body) -> None:
        self.sock.sendall(codec.encode(body))

    def recv(self):
        while not self.frames:
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("closed by the server")
            self.frames.extend(self.splitter.feed(data))
        return codec.decode(self.frames.pop(0)).body

    def request(self, body):
        self.send(body)
        while True:
            reply = self.recv()
            if getattr(reply, "request_id", None) == body.request_id:
                return reply

    def agent(self, max_tokens: int = 24) -> int:
        sampling = codec.SamplingOverrides(temperature=0.0, max_tokens=max_tokens)
        reply = self.request(codec.CreateAgentRequest(
            request_id=self.next_id(), default_model_name=SMOL,
            graph=codec.GraphDescription(start_node="answer", nodes=[codec.NodeDescription(
                name="answer", params=codec.GenerateParams(system_prompt=SYSTEM,
                                                          sampling=sampling))])))
        assert isinstance(reply, codec.CreateAgentResponse), reply
        return reply.agent_id

    def start(self, agent: int, text: str) -> int:
        """Send a message; its request id."""
        rid = self.next_id()
        self.send(codec.SendMessageRequest(request_id=rid, agent_id=agent, text=text))
        return rid

    def until(self, rid: int, first_text: bool = False):
        """Read up to the turn's TurnComplete (returned), or to its first text (None)."""
        while True:
            body = self.recv()
            if first_text and isinstance(body, codec.AnswerText) and body.text:
                return None
            if isinstance(body, codec.TurnComplete) and body.request_id == rid:
                return body

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done: dict[str, int] = {}
        self.bad: list[str] = []

    def record(self, action: str, problem: str | None) -> None:
        with self.lock:
            if problem:
                self.bad.append(f"{action}: {problem}")
            else:
                self.done[action] = self.done.get(action, 0) + 1


def _failed(done) -> str | None:
    return None if done.status == codec.TurnStatus.Success else repr(done)


# Each action gets a fresh connection with a session and returns a problem, or None.

def turn(c: Conn, rng: random.Random) -> str | None:
    agent = c.agent()
    for _ in range(rng.randint(1, 3)):
        problem = _failed(c.until(c.start(agent, rng.choice(QUESTIONS))))
        if problem:
            return problem
    return None


def cancel(c: Conn, rng: random.Random) -> str | None:
    agent = c.agent(max_tokens=200)
    rid = c.start(agent, rng.choice(QUESTIONS))
    if c.until(rid, first_text=True) is None:
        c.send(codec.CancelRequest(request_id=c.next_id(), agent_id=agent,
                                   mode=rng.choice(list(codec.CancelMode))))
        c.until(rid)
    return None


def export_import(c: Conn, rng: random.Random) -> str | None:
    agent = c.agent()
    c.until(c.start(agent, rng.choice(QUESTIONS)))
    exported = c.request(codec.ExportDialogRequest(request_id=c.next_id(), agent_id=agent))
    other = c.agent()
    reply = c.request(codec.ImportDialogRequest(
        request_id=c.next_id(), agent_id=other, snapshot=bytes(exported.snapshot)))
    if not isinstance(reply, codec.ImportDialogResponse):
        return repr(reply)
    return _failed(c.until(c.start(other, rng.choice(QUESTIONS))))


def garbage(c: Conn, rng: random.Random) -> str | None:
    try:
        for _ in range(rng.randint(1, 20)):
            n = rng.randint(1, 200)
            c.sock.sendall(n.to_bytes(4, "little") + rng.randbytes(n))
        reply = c.request(codec.DebugCommandRequest(request_id=c.next_id(), command="echo",
                                                    args=["alive"]))   # after the errors
        return None if reply.output == "alive" else repr(reply)
    except ConnectionError:
        return None                                 # a frame the server had to close on


def slow_reader(c: Conn, rng: random.Random) -> str | None:
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    rid = c.start(c.agent(max_tokens=300), "Tell me a long story about the town.")
    time.sleep(rng.uniform(0.5, 3.0))               # not reading
    return _failed(c.until(rid))


TOOLS = [codec.ToolDefinition(name="open_door", description="Open a door of the bakery.",
                              parameters=[codec.ToolParamDefinition(
                                  name="door", type="string", enum_values=["front", "back"])])]


def tool_pause(c: Conn, rng: random.Random) -> str | None:
    """A turn that pauses on a tool call (the game runs the tool), then one of: the result
    sent back (the turn must finish), a cancel, or a disconnect while paused."""
    sampling = codec.SamplingOverrides(temperature=0.0, max_tokens=32)
    reply = c.request(codec.CreateAgentRequest(
        request_id=c.next_id(), default_model_name=SMOL,
        graph=codec.GraphDescription(start_node="detect", nodes=[
            codec.NodeDescription(name="detect", params=codec.ToolCallParams(
                system_prompt=SYSTEM, tools=TOOLS, mode=codec.ToolCallMode.RequireCall,
                disposition=codec.ToolCallDisposition.AwaitResult, sampling=sampling,
                tool_called_exit="answer", no_tool_called_exit="answer")),
            codec.NodeDescription(name="answer", params=codec.GenerateParams(
                system_prompt=SYSTEM, sampling=codec.SamplingOverrides(
                    temperature=0.0, max_tokens=16)))])))
    if not isinstance(reply, codec.CreateAgentResponse):
        return repr(reply)
    agent = reply.agent_id
    rid = c.start(agent, "Please open the front door.")
    calls = []
    while True:
        body = c.recv()
        if isinstance(body, codec.TurnComplete):
            return f"the turn ended before it paused: {body!r}"
        if isinstance(body, codec.NodeEvent) and body.event_type == "tool_call":
            calls.append({p.key: p.value for p in body.kv_pairs}["call_id"])
        if isinstance(body, codec.NodeEvent) and body.event_type == "paused":
            break
    choice = rng.random()
    if choice < 0.5:
        ack = c.request(codec.ResumeAgentRequest(
            request_id=c.next_id(), agent_id=agent,
            tool_results=[codec.ToolResult(call_id=cid, result='{"open": true}')
                          for cid in calls]))
        if not isinstance(ack, codec.Ack):
            return repr(ack)
        return _failed(c.until(rid))
    if choice < 0.75:
        c.send(codec.CancelRequest(request_id=c.next_id(), agent_id=agent))
        c.until(rid)
    return None                                     # < 1: disconnect while paused


def disconnect(c: Conn, rng: random.Random) -> str | None:
    c.start(c.agent(max_tokens=200), rng.choice(QUESTIONS))
    time.sleep(rng.uniform(0.0, 0.5))
    return None                                     # the close is the point


def perform(action, port: int, rng: random.Random, tally: Tally) -> None:
    try:
        c = Conn(port)
    except (OSError, ConnectionError, AssertionError) as exc:
        tally.record(action.__name__, f"connect: {exc!r}")
        return
    try:
        tally.record(action.__name__, action(c, rng))
    except (OSError, ConnectionError, AssertionError) as exc:
        tally.record(action.__name__, repr(exc))
    finally:
        c.close()


ACTIONS = [turn, turn, cancel, tool_pause, export_import, garbage, slow_reader, disconnect]


TCP_STATES = {"01": "ESTABLISHED", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
              "0A": "LISTEN", "09": "LAST_ACK", "04": "FIN_WAIT1", "05": "FIN_WAIT2"}


def _tcp_sockets(pid: int) -> dict:
    """socket inode -> 'tcp local->remote STATE', from the process's /proc/net/tcp."""
    got = {}
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            local, remote = (int(a.split(":")[1], 16) for a in cols[1:3])
            got[cols[9]] = f"tcp :{local}->:{remote} {TCP_STATES.get(cols[3], cols[3])}"
    return got


def fds_of(pid: int) -> dict:
    """fd number -> what it points at (a file path, anon_inode:[eventfd], or for a TCP
    socket its ports and state), so a leak names itself."""
    got = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            got[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:                             # closed between listdir and readlink
            pass
    if any(t.startswith("socket:") for t in got.values()):
        tcp = _tcp_sockets(pid)
        for n, t in got.items():
            if t.startswith("socket:["):
                got[n] = tcp.get(t[8:-1], t)
    return got


def probe(pid: int, port: int) -> dict:
    """The server's footprint, read from outside it (and from its dev-mode stats)."""
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":", 1) for line in f)
    c = Conn(port)
    try:
        stats = json.loads(c.request(codec.DebugCommandRequest(
            request_id=c.next_id(), command="stats")).output)
        mine = f"->:{c.sock.getsockname()[1]} "
        fd_targets = {n: t for n, t in fds_of(pid).items() if mine not in t}
    finally:
        c.close()
    cells = convs = 0
    for mem in (stats.get("engines") or {}).values():
        for ctx in [mem, *mem.get("lanes", ())] if mem else ():
            cells += ctx["context"]["kv_cells_used"]
            convs += len(ctx["sequences"])
    return {"rss_mb": int(status["VmRSS"].split()[0]) / 1024,
            "fds": len(fd_targets), "fd_targets": fd_targets,
            "threads": int(status["Threads"]), "thread_names": stats["python_threads"],
            "kv_cells": cells, "conversations": convs,
            "models": len(stats["models_loaded"]), "sessions": stats["sessions"],
            "operations": stats["operations"], "lane_high_water": stats["lane_high_water"],
            "lanes_paced": stats["lanes_paced"], "lanes_paced_s": stats["lanes_paced_s"]}


def settle(pid: int, port: int, seconds: float = 30) -> dict:
    """Probe until the closed sessions' teardown has finished: no session but the probe's,
    no conversation, no model loaded (nothing pins one here). Then once more after a pause,
    so the heap trim that follows the last teardown is in the figure."""
    deadline = time.monotonic() + seconds
    while True:
        got = probe(pid, port)
        idle = got["conversations"] == 0 and got["models"] == 0 and got["sessions"] == 1
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    time.sleep(1.0)
    return probe(pid, port)


def timed_turns(c: Conn, agent: int, first_token: list, whole: list, problems, *,
                stop: threading.Event | None = None, count: int | None = None) -> bool:
    """Streamed turns on `agent` until `stop` is set or `count` of them ran, each one's
    first-token and whole time (seconds) appended; False after a failed turn, whose problem
    is appended to `problems`."""
    done = 0
    while not (stop is not None and stop.is_set()) and (count is None or done < count):
        t0 = time.monotonic()
        rid = c.start(agent, "Who are you?")
        c.until(rid, first_text=True)
        first_token.append(time.monotonic() - t0)
        end = c.until(rid)
        if end.status != codec.TurnStatus.Success:
            problems.append(f"a healthy turn failed: {end!r}")
            return False
        whole.append(time.monotonic() - t0)
        done += 1
    return True


def spread_ms(seconds: list[float]) -> dict:
    """{median, max, n} in milliseconds; {} for no values."""
    ms = sorted(v * 1000 for v in seconds)
    return {"median": ms[len(ms) // 2], "max": ms[-1], "n": len(ms)} if ms else {}


def verdict(name: str, problems: list[str], out) -> None:
    """The last lines of a soak, flood or fuzzing run: each problem, then PASS or FAIL."""
    for p in problems:
        print(f"PROBLEM {p}", file=out)
    print(f"{name}: " + ("FAIL" if problems else "PASS"), file=out)


def growth(before: dict, after: dict) -> list[str]:
    """Descriptors or threads the process has more of after than before, named."""
    problems = []
    if after["fds"] > before["fds"]:
        new = {n: t for n, t in after["fd_targets"].items()
               if before["fd_targets"].get(n) != t}
        problems.append(f"descriptors grew from {before['fds']} to {after['fds']}; opened "
                        f"since and still open: {new}")
    if after["threads"] > before["threads"]:
        new = list((Counter(after["thread_names"]) - Counter(before["thread_names"])).elements())
        problems.append(f"threads grew from {before['threads']} to {after['threads']} "
                        f"(Python threads new since: {new or 'none, a native one'})")
    return problems


def run(seconds: float, clients: int = 6, margin_mb: float = 40, seed: int = 1,
        out=sys.stdout) -> dict:
    from benchmarks.transport_load import ServerProcess
    from tryll_fast.models import ensure_model
    ensure_model(SMOL, MODELS_DIR)
    server = ServerProcess("reactor", models_dir=MODELS_DIR, settings=SETTINGS)
    pid, port = server.proc.pid, server.port
    tally = Tally()

    def phase(duration: float, salt: int) -> None:
        stop = time.monotonic() + duration

        def worker(i: int) -> None:
            rng = random.Random(seed * 1000 + salt * 100 + i)
            while time.monotonic() < stop:
                perform(rng.choice(ACTIONS), port, rng, tally)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    try:
        warm = random.Random(seed)
        for action in dict.fromkeys(ACTIONS):      # warm-up: each action once, then the
            perform(action, port, warm, tally)     # whole load briefly, so the thread
        phase(WARM_S, 0)                           # pools reach their working size
        before = settle(pid, port)
        phase(seconds, 1)
        after = settle(pid, port)
    finally:
        server.close()
    problems = list(tally.bad)
    if after["rss_mb"] - before["rss_mb"] > margin_mb:
        problems.append(f"resident memory grew {after['rss_mb'] - before['rss_mb']:.1f} MB "
                        f"(margin {margin_mb} MB)")
    for key in ("kv_cells", "conversations"):
        if after[key]:
            problems.append(f"{after[key]} {key} still held")
    problems += growth(before, after)

    report = {"seconds": seconds, "clients": clients, "actions": tally.done,
              "before": before, "after": after, "problems": problems}
    print(f"soak: {seconds:.0f} s, {clients} clients, actions {tally.done}", file=out)
    print(f"{'':14}{'before':>10}{'after':>10}", file=out)
    for key in ("rss_mb", "fds", "threads", "kv_cells", "conversations", "models", "sessions",
                "operations"):
        print(f"{key:14}{before[key]:>10.1f}{after[key]:>10.1f}", file=out)
    verdict("soak", problems, out)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--margin-mb", type=float, default=40.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    report = run(args.minutes * 60, args.clients, args.margin_mb, args.seed)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
