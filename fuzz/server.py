"""Structure-aware fuzzing of a live server: every client request type, mutated, on
throwaway connections beside a healthy session that keeps taking real turns.

    python -m fuzz.server [--frames 200000] [--connections 3] [--seed 1]
    make fuzz-server                            # the same; FUZZ_FRAMES=N to change it

Each frame is one client message type (all of them, from the dispatch table's list) built
from the schema with values chosen to hurt: ids that do and do not exist, empty and
oversized strings, paths that escape the storage root, boundary integers, every enum value,
absent fields, nested tables a few levels deep. Half the frames go out as such (valid
FlatBuffers that reach the handlers); the other half are byte-mutated by the codec fuzzer's
mutator (fuzz/corpus.py), so they exercise the verifier on every message's layout. A few
frames carry a length the server must hang up on. Fuzzing connections read their replies
only now and then, as a careless client does.

Checked: the server process never exits; every frame it sends decodes and is a
server-to-client message; an ErrorResponse carries a known code and a message; every
fuzzing connection answers a final request (no hang); the server closes a connection only
after a fatal length; the healthy session's turns all succeed; and once everything closed,
no operation, session, KV cell or conversation is left.
"""
from __future__ import annotations

import argparse
import math
import os
import random
import socket
import struct
import sys
import tempfile
import threading
import time

from tryll_fast import codec
from tryll_fast.errors import ErrorCode
from tryll_fast.server.dispatch import CLIENT_MESSAGES
from tryll_fast.transport import MAX_FRAME          # past it, the server hangs up

from benchmarks import soak
from fuzz import corpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import fbs  # noqa: E402

SCHEMA = fbs.parse(os.path.join(ROOT, "schema", "messages.fbs"))

# Values that reach a handler's checks: real and missing names, escapes, sizes at the edges.
STRINGS = ("", "answer", "speak", "tools", soak.SMOL, "nope", "en", "de", "pt-BR", "xx-invalid",
           "hello there", "Open the gate!", "../../etc/passwd", "/etc/passwd", "a/../../b",
           "notes.txt", "lore.json", "loc/de/lore.txt", "{\"var\": \"mood\"}",
           "{{player_name}}", "Grüß Gott ☀️", "\u202e\u0000x", "stream", "echo", "stats",
           "help", "3", "0", "-1", "99999999999", "x" * 300, "é" * 2000)
INTS = (0, 1, 2, 3, 7, 100, 255, 4096, 65535)


def _int(rng: random.Random, name: str) -> int:
    lo, hi = fbs.INT_RANGES[name]
    r = rng.random()
    if r < 0.7:
        return min(rng.choice(INTS), hi)
    if r < 0.85:
        return rng.choice((lo, hi))
    return rng.randint(lo, hi)


def _value(t, rng: random.Random, depth: int, nested: str = ""):
    kind = t.kind
    if kind == "scalar":
        if t.name == "bool":
            return rng.random() < 0.5
        if t.name in ("float", "double"):
            return rng.choice((0.0, 0.5, 1.0, 2.0, -1.0, 1e9, math.inf, math.nan))
        return _int(rng, t.name)
    if kind == "enum":
        return rng.choice(t.decl.values)[1]
    if kind == "string":
        return rng.choice(STRINGS)
    if kind in ("table", "struct"):
        return build(t.decl, rng, depth + 1)
    if kind == "union":
        members = [d for d in t.decl.member_decls if d is not None]
        return build(rng.choice(members), rng, depth + 1)
    if kind == "vector":
        elem = t.elem
        if nested:                      # the encoder insists on a valid nested buffer
            return codec.encode_root(build(SCHEMA.decls[nested.strip('"')], rng, depth + 1))
        if elem.kind == "scalar" and elem.name in ("ubyte", "uint8", "byte", "int8"):
            return rng.randbytes(rng.choice((0, 1, 2, 3, 64, 4000)))
        count = rng.choice((0, 1, 1, 2, 3)) if depth < 4 else 0
        return [_value(elem, rng, depth) for _ in range(count)]
    raise AssertionError(f"unknown schema kind {kind}")


def build(decl, rng: random.Random, depth: int = 0, **fixed):
    """One instance of a schema table or struct, fields chosen by `rng` (a table's fields
    are each left absent now and then; a struct's never are) unless given in `fixed`."""
    kwargs = {}
    for f in decl.fields:
        if f.deprecated:
            continue
        if f.name in fixed:
            kwargs[f.name] = fixed[f.name]
        elif isinstance(decl, fbs.Table) and (depth > 5 or rng.random() < 0.2):
            continue
        else:
            kwargs[f.name] = _value(f.type, rng, depth, f.attrs.get("nested_flatbuffer", ""))
    return getattr(codec, decl.name)(**kwargs)


def example(name: str, rng: random.Random):
    """A client message of type `name` as a codec object (its fields from `rng`)."""
    fixed = {}
    if rng.random() < 0.9:
        fixed["request_id"] = rng.randint(1, 1 << 20)   # the real clients' kind of id
    return build(SCHEMA.decls[name], rng, **fixed)


def encode(body) -> bytes:
    """The payload (no length prefix); bodies the encoder refuses (a value out of a
    field's range) are not frames a client could send, so they come back as None."""
    try:
        return codec.encode(body)[4:]
    except (ValueError, OverflowError, TypeError):
        return None


def frames(rng: random.Random):
    """Endless (type name, payload) pairs over every client message type in turn."""
    seeds = [p for n, p in corpus.named_seeds() if n in CLIENT_MESSAGES]
    while True:
        order = list(CLIENT_MESSAGES)
        rng.shuffle(order)
        for name in order:
            payload = None
            while payload is None:
                payload = encode(example(name, rng))
            if rng.random() < 0.5:
                payload = corpus.mutate(payload if rng.random() < 0.8 else rng.choice(seeds),
                                        rng)
            yield name, payload


class Problems:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[str] = []

    def append(self, text: str) -> None:
        with self.lock:
            if len(self.items) < 50:
                self.items.append(text)


KNOWN_CODES = {int(c) for c in ErrorCode}
SERVER_TYPES = {getattr(codec, m.name) for m in codec.MessageBody
                if m.value and m.name not in CLIENT_MESSAGES}


class Fuzzer:
    """One throwaway connection: sends mutated frames, checks every frame it gets back."""

    def __init__(self, port: int, rng: random.Random, problems: Problems, tally: dict) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.splitter = codec.FrameSplitter()
        self.rng, self.problems, self.tally = rng, problems, tally
        self.closed_by_server = False
        self.expect_close = False
        self.replies = 0
        if rng.random() < 0.9:                  # a few never create a session
            self.sock.sendall(codec.encode(codec.CreateSessionRequest(request_id=1)))

    def check(self, payload: bytes) -> object:
        try:
            body = codec.decode(payload).body
        except codec.CodecError as exc:
            self.problems.append(f"the server sent a frame that does not decode: {exc}")
            return None
        if type(body) not in SERVER_TYPES:
            self.problems.append(f"the server sent a client message: {type(body).__name__}")
        if isinstance(body, codec.ErrorResponse):
            if body.code not in KNOWN_CODES or not body.message:
                self.problems.append(f"an error with an unknown code or no message: {body!r}")
            key = f"error {body.code}"
        else:
            key = type(body).__name__
        self.tally[key] = self.tally.get(key, 0) + 1
        self.replies += 1
        return body

    def drain(self, timeout: float) -> list:
        """Whatever has arrived within `timeout`, checked."""
        got = []
        self.sock.settimeout(timeout)
        try:
            while True:
                data = self.sock.recv(1 << 16)
                if not data:
                    self._closed()
                    break
                for payload in self.splitter.feed(data):
                    got.append(self.check(payload))
                self.sock.settimeout(0)
        except (BlockingIOError, socket.timeout, TimeoutError):
            pass
        except ConnectionResetError:
            self._closed()
        return got

    def _closed(self) -> None:
        if not self.closed_by_server and not self.expect_close:
            self.problems.append("the server closed a connection that sent no fatal frame")
        self.closed_by_server = True

    def send(self, payload: bytes) -> bool:
        try:
            self.sock.sendall(struct.pack("<I", len(payload)) + payload)
            return True
        except (BrokenPipeError, ConnectionResetError):
            self._closed()
            return False

    def send_fatal(self) -> None:
        self.expect_close = True
        try:
            self.sock.sendall(struct.pack("<I", self.rng.choice((0, MAX_FRAME + 1))))
        except (BrokenPipeError, ConnectionResetError):
            pass

    def finish(self, sentinel: int, timeout: float = 60) -> None:
        """The connection must still answer: a request sent last gets its reply."""
        if self.closed_by_server:
            return
        probe = codec.ListModelsRequest(request_id=sentinel)
        try:
            self.sock.sendall(codec.encode(probe))
        except (BrokenPipeError, ConnectionResetError):
            self._closed()
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.closed_by_server:
            for body in self.drain(1.0):
                if getattr(body, "request_id", None) == sentinel:
                    return
        if not self.closed_by_server:
            self.problems.append(f"a fuzzing connection did not answer in {timeout:.0f} s "
                              f"(a hang): {self.replies} replies so far")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def healthy_turns(port: int, ready: threading.Event, stop: threading.Event,
                  problems: Problems, report: dict) -> None:
    """Real turns on their own session: one before `ready` is set, then until `stop`, then
    one more; every one must succeed."""
    c = None
    try:
        c = soak.Conn(port)
        agent = c.agent(max_tokens=16)
        timed = (c, agent, report["healthy_first_token_s"], report["healthy_turn_s"], problems)
        if soak.timed_turns(*timed, count=1):
            ready.set()
            if soak.timed_turns(*timed, stop=stop):
                soak.timed_turns(*timed, count=1)       # one after the fuzzing
    except (OSError, ConnectionError, AssertionError) as exc:
        problems.append(f"the healthy session broke: {exc!r}")
    finally:
        ready.set()
        if c is not None:
            c.close()


FRAMES_PER_CONNECTION = 200


def unhandled(log: str) -> list[str]:
    """One problem per distinct exception the server's log shows a traceback of: bad input
    must end in a protocol error, never in an exception a handler did not expect."""
    seen: dict[str, int] = {}
    for block in log.split("Traceback (most recent call last):")[1:]:
        lines = [ln for ln in block.splitlines() if ln.strip()]
        where = [ln.strip() for ln in lines if ln.lstrip().startswith("File ")]
        last = next((ln for ln in lines if not ln.startswith((" ", "\t"))), "?")
        key = f"{last[:200]} at {where[-1] if where else '?'}"
        seen[key] = seen.get(key, 0) + 1
    return [f"the server logged an unhandled {k} ({n}x)" for k, n in seen.items()]


def fuzz_connections(port: int, total: int, connections: int, rng: random.Random,
                     problems: Problems, report: dict) -> None:
    """`connections` throwaway connections at a time until `total` frames were sent."""
    gen = frames(rng)
    sent_lock = threading.Lock()
    sentinel = [1 << 62]

    def take(n: int) -> list:
        with sent_lock:
            n = min(n, total - report["frames"])
            report["frames"] += n
            batch = [next(gen) for _ in range(n)]
            sentinel[0] += 1
            return batch, sentinel[0], random.Random(rng.random())

    def worker() -> None:
        while True:
            batch, sentinel_id, crng = take(FRAMES_PER_CONNECTION)
            if not batch:
                return
            f = Fuzzer(port, crng, problems, report["replies"])
            try:
                for name, payload in batch:
                    report["types"][name] = report["types"].get(name, 0) + 1
                    if not payload or crng.random() < 0.005:
                        f.send_fatal()              # an empty payload is a length of 0
                        report["fatal"] += 1
                        break
                    if not f.send(payload):
                        break
                    if crng.random() < 0.05:
                        f.drain(0.001)
                f.finish(sentinel_id)
            finally:
                f.close()

    threads = [threading.Thread(target=worker) for _ in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def run(total: int, connections: int = 3, seed: int = 1, out=sys.stdout) -> dict:
    from benchmarks.transport_load import ServerProcess
    from tryll_fast.models import ensure_model
    ensure_model(soak.SMOL, soak.MODELS_DIR)
    log = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")
    server = ServerProcess("reactor", models_dir=soak.MODELS_DIR, settings=soak.SETTINGS,
                           stderr=log)
    problems = Problems()
    report = {"frames": 0, "fatal": 0, "types": {}, "replies": {},
              "healthy_first_token_s": [], "healthy_turn_s": []}
    rng = random.Random(seed)
    ready, stop = threading.Event(), threading.Event()
    started = time.monotonic()
    try:
        healthy = threading.Thread(target=healthy_turns,
                                   args=(server.port, ready, stop, problems, report))
        healthy.start()
        ready.wait(300)
        try:
            fuzz_connections(server.port, total, connections, rng, problems, report)
        finally:
            stop.set()
            healthy.join(300)
        if server.proc.poll() is not None:
            problems.append(f"the server exited with {server.proc.returncode}")
        else:
            after = soak.settle(server.proc.pid, server.port)
            for key in ("operations", "kv_cells", "conversations"):
                if after[key]:
                    problems.append(f"{after[key]} {key} still held after every connection closed")
            if after["sessions"] != 1:
                problems.append(f"{after['sessions'] - 1} sessions left behind")
            report["after"] = after
    finally:
        server.close()
        log.seek(0)
        for problem in unhandled(log.read()):
            problems.append(problem)
        log.close()
    report["seconds"] = time.monotonic() - started
    report["healthy_turns"] = len(report["healthy_turn_s"])
    report["problems"] = list(problems.items)
    missing = sorted(set(CLIENT_MESSAGES) - set(report["types"]))
    print(f"fuzz-server: {report['frames']} frames ({report['fatal']} fatal lengths) of "
          f"{len(report['types'])}/{len(CLIENT_MESSAGES)} request types in "
          f"{report['seconds']:.0f} s; {sum(report['replies'].values())} replies; "
          f"{report['healthy_turns']} healthy turns", file=out)
    if report["healthy_turn_s"]:
        ft, turn = (soak.spread_ms(report[k]) for k in ("healthy_first_token_s",
                                                        "healthy_turn_s"))
        print(f"healthy turns: first token median {ft['median']:.0f} ms, max "
              f"{ft['max']:.0f} ms, whole turn median {turn['median']:.0f} ms, max "
              f"{turn['max']:.0f} ms", file=out)
    print("replies: " + ", ".join(f"{k} {v}" for k, v in sorted(report["replies"].items())),
          file=out)
    if missing and report["frames"] >= len(CLIENT_MESSAGES):
        report["problems"].append(f"request types never sent: {missing}")
    soak.verdict("fuzz-server", report["problems"], out)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--connections", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    report = run(args.frames, args.connections, args.seed)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
