"""A flood: one connection sends a million frames, mutated copies of four valid requests
(a third of them CreateAgentRequest), and reads its replies only when the server stops
taking its frames. Beside it a healthy session streams real turns with SmolLM2.

    python -m benchmarks.flood [--frames 1000000]
    make flood

Measured from outside the server process: its resident memory (sampled every 20 ms: the
peak), the deepest queue of requests behind any session's lane (the dev-mode stats), the
healthy session's first-token time before, during and after the flood, and the footprint
once the flood and the healthy session closed, against the same after a warm-up flood. The
healthy dialog grows during the flood, and a longer dialog costs more per turn with or
without one: "after" is five turns on the grown dialog with the flood gone, and the control
(on by default here, off in the test suite) is as many turns as the flood saw on a new
dialog with no flood, so its medians differ from the flood's by the flood alone. The peak is
taken against the idle size with the healthy session's model loaded (its weights are
mapped into the process while it has an agent), the return against the idle size with
no session at all.

Fails when the queue went past `session.max_queued_requests`, the peak went more than
`--peak-bound-mb` above the loaded idle size, the process did not return within `--margin-mb` of
it, a KV cell or conversation is still held, descriptors or threads grew, or a healthy
turn failed.
"""
from __future__ import annotations

import argparse
import random
import selectors
import socket
import struct
import sys
import threading
import time

from tryll_fast import codec

from benchmarks import soak
from fuzz import corpus

QUEUE_CAP = 1024                # session.max_queued_requests' default, which the server uses
POOL = 4096                     # distinct frames, cycled: mutating a million costs minutes


def four_requests() -> list[bytes]:
    """CreateAgent (twice: a third of the flood once mutated), SendMessage, SetSessionLocale,
    ListModels; as payloads."""
    agent = codec.CreateAgentRequest(
        request_id=7, default_model_name=soak.SMOL,
        graph=codec.GraphDescription(start_node="answer", nodes=[codec.NodeDescription(
            name="answer", params=codec.GenerateParams(
                system_prompt=soak.SYSTEM,
                sampling=codec.SamplingOverrides(temperature=0.0, max_tokens=8)))]))
    bodies = [agent, agent,
              codec.SendMessageRequest(request_id=8, agent_id=1, text="Who are you?"),
              codec.SetSessionLocaleRequest(request_id=9, locale="de"),
              codec.ListModelsRequest(request_id=10)]
    return [codec.encode(b)[4:] for b in bodies]


def frame_pool(rng: random.Random, turns: bool = True) -> list[bytes]:
    """Half valid copies, half mutated; never an empty payload (a
    length of 0 is a framing error the server hangs up on, which would end the flood).
    turns=False: without the frames that decode as a SendMessageRequest, so the flood asks
    for no turn of its own and what it costs the server is overhead alone."""
    seeds = four_requests()
    out = []
    while len(out) < POOL:
        payload = seeds[len(out) % len(seeds)]
        if rng.random() < 0.5:
            payload = corpus.mutate(payload, rng, max_ops=2)
        if payload and not (not turns and _asks_for_a_turn(payload)):
            out.append(struct.pack("<I", len(payload)) + payload)
    return out


def _asks_for_a_turn(payload: bytes) -> bool:
    try:
        return isinstance(codec.decode(payload).body, codec.SendMessageRequest)
    except Exception:  # noqa: BLE001 - a frame the server refuses asks for nothing
        return False


def flood(port: int, total: int, rng: random.Random, turns: bool = True) -> dict:
    """Send `total` frames as fast as the server takes them; read only when it does not."""
    pool = frame_pool(rng, turns)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(codec.encode(codec.CreateSessionRequest(request_id=1)))
    sock.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_WRITE)
    splitter = codec.FrameSplitter()
    sent = replies = reads = 0
    pending = b""
    closed = ""
    t0 = time.monotonic()
    while sent < total or pending:
        if not pending:
            n = min(256, total - sent)
            start = sent % POOL
            chunk = pool[start:start + n]
            if len(chunk) < n:
                chunk += pool[:n - len(chunk)]
            pending = b"".join(chunk)
            sent += n
        try:
            k = sock.send(pending)
            pending = pending[k:]
            continue
        except BlockingIOError:
            pass
        except (BrokenPipeError, ConnectionResetError) as exc:
            closed = repr(exc)
            break
        # the server stopped taking frames: now, and only now, read what it sent
        sel.modify(sock, selectors.EVENT_READ | selectors.EVENT_WRITE)
        sel.select(5.0)
        reads += 1
        try:
            while True:
                data = sock.recv(1 << 20)
                if not data:
                    closed = "the server closed the flooding connection"
                    break
                replies += len(splitter.feed(data))
        except BlockingIOError:
            pass
        sel.modify(sock, selectors.EVENT_WRITE)
        if closed:
            break
    seconds = time.monotonic() - t0
    sock.close()
    return {"frames": sent, "replies": replies, "reads": reads, "seconds": seconds,
            "closed": closed}


class Sampler:
    """The process's peak resident memory, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_mb = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _rss_mb(self) -> float:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def _run(self) -> None:
        while not self.stop.wait(0.02):
            self.peak_mb = max(self.peak_mb, self._rss_mb())

    def __enter__(self) -> "Sampler":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def flood_beside_turns(port: int, frames: int, rng: random.Random, c: soak.Conn, agent: int,
                       first_token: list, whole: list, problems: list,
                       turns: bool = True) -> dict:
    """flood() while the healthy session `c` takes turns on `agent` (soak.timed_turns)."""
    stop = threading.Event()
    beside = threading.Thread(target=soak.timed_turns,
                              args=(c, agent, first_token, whole, problems),
                              kwargs={"stop": stop})
    beside.start()
    try:
        return flood(port, frames, rng, turns)
    finally:
        stop.set()
        beside.join(120)


def run(frames: int = 1_000_000, peak_bound_mb: float = 200, margin_mb: float = 40,
        seed: int = 1, out=sys.stdout, settings: tuple[str, ...] = (),
        control: bool = False, turns: bool = True) -> dict:
    from benchmarks.transport_load import ServerProcess
    from tryll_fast.models import ensure_model
    ensure_model(soak.SMOL, soak.MODELS_DIR)
    server = ServerProcess("reactor", models_dir=soak.MODELS_DIR,
                           settings=(*soak.SETTINGS, *settings))
    pid, port = server.proc.pid, server.port
    rng = random.Random(seed)
    problems: list[str] = []
    idle_ft: list[float] = []
    flood_ft: list[float] = []
    idle_turn: list[float] = []
    flood_turn: list[float] = []
    after_ft: list[float] = []
    after_turn: list[float] = []
    control_ft: list[float] = []
    control_turn: list[float] = []
    try:
        # warm-up: the same as below, shorter, then everything closed, so the baseline has
        # the model's pages and the thread pools at their working size
        warm = soak.Conn(port)
        warm_agent = warm.agent(max_tokens=16)
        soak.timed_turns(warm, warm_agent, [], [], problems, count=2)
        flood_beside_turns(port, 50_000, rng, warm, warm_agent, [], [], problems)
        warm.close()
        before = soak.settle(pid, port)

        c = soak.Conn(port)
        agent = c.agent(max_tokens=16)
        soak.timed_turns(c, agent, idle_ft, idle_turn, problems, count=5)
        loaded = soak.probe(pid, port)          # idle, with the healthy session's model
        with Sampler(pid) as sampler:
            got = flood_beside_turns(port, frames, rng, c, agent, flood_ft, flood_turn,
                                     problems, turns)
        # the same turns once the flooding session is gone, on the dialog the flood's turns
        # grew: what a turn of that length costs on an idle server
        quiet_by = time.monotonic() + 30
        while soak.probe(pid, port)["sessions"] > 2 and time.monotonic() < quiet_by:
            time.sleep(0.1)
        soak.timed_turns(c, agent, after_ft, after_turn, problems, count=5)
        c.close()
        if control:
            # as many turns as the flood saw, on a new dialog and no flood: the same
            # dialog lengths, so the medians compare the flood's effect and nothing else
            c = soak.Conn(port)
            soak.timed_turns(c, c.agent(max_tokens=16), control_ft, control_turn, problems,
                             count=len(flood_ft))
            c.close()
        after = soak.settle(pid, port)
    finally:
        server.close()
    cap_seen = after["lane_high_water"]
    if got["closed"]:
        problems.append(f"the flood ended early: {got['closed']}")
    if cap_seen > QUEUE_CAP:
        problems.append(f"{cap_seen} requests waited behind one lane (cap {QUEUE_CAP})")
    if sampler.peak_mb - loaded["rss_mb"] > peak_bound_mb:
        problems.append(f"peak resident memory {sampler.peak_mb:.0f} MB is more than "
                        f"{peak_bound_mb} MB above idle with the model loaded "
                        f"({loaded['rss_mb']:.0f} MB)")
    if after["rss_mb"] - before["rss_mb"] > margin_mb:
        problems.append(f"resident memory after the flood {after['rss_mb']:.0f} MB is more "
                        f"than {margin_mb} MB above idle ({before['rss_mb']:.0f} MB)")
    for key in ("kv_cells", "conversations", "operations"):
        if after[key]:
            problems.append(f"{after[key]} {key} still held")
    problems += soak.growth(before, after)
    if not flood_ft:
        problems.append("no healthy turn completed during the flood")
    report = {"flood": got, "before": before, "loaded": loaded, "after": after,
              "peak_mb": sampler.peak_mb,
              "lane_high_water": cap_seen, "first_token_idle_ms": soak.spread_ms(idle_ft),
              "first_token_flood_ms": soak.spread_ms(flood_ft),
              "turn_idle_ms": soak.spread_ms(idle_turn),
              "turn_flood_ms": soak.spread_ms(flood_turn),
              "first_token_after_ms": soak.spread_ms(after_ft),
              "turn_after_ms": soak.spread_ms(after_turn),
              "first_token_control_ms": soak.spread_ms(control_ft),
              "turn_control_ms": soak.spread_ms(control_turn), "problems": problems}
    print(f"flood{'' if turns else ' (no SendMessage frames)'}: {got['frames']} frames in "
          f"{got['seconds']:.1f} s "
          f"({got['frames'] / got['seconds']:.0f}/s), {got['replies']} replies read in "
          f"{got['reads']} reads", file=out)
    print(f"resident memory: idle {before['rss_mb']:.1f} MB (no session), "
          f"{loaded['rss_mb']:.1f} MB (the healthy session's model loaded), flood peak "
          f"{sampler.peak_mb:.1f} MB, after {after['rss_mb']:.1f} MB (no session)", file=out)
    print(f"deepest lane queue: {cap_seen} (cap {QUEUE_CAP}); lanes paced "
          f"{after['lanes_paced']} times, {after['lanes_paced_s']:.1f} s in all", file=out)
    for name, ft, turn in (
            ("idle", report["first_token_idle_ms"], report["turn_idle_ms"]),
            ("during the flood", report["first_token_flood_ms"], report["turn_flood_ms"]),
            ("idle again, on the dialog the flood's turns grew", report["first_token_after_ms"],
             report["turn_after_ms"]),
            ("with no flood, as many on a new dialog", report["first_token_control_ms"],
             report["turn_control_ms"])):
        if ft:
            print(f"healthy turns {name}: first token median {ft['median']:.0f} ms, "
                  f"max {ft['max']:.0f} ms; whole turn (16 tokens) median "
                  f"{turn['median']:.0f} ms; {ft['n']} turns", file=out)
    soak.verdict("flood", problems, out)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--peak-bound-mb", type=float, default=200)
    parser.add_argument("--margin-mb", type=float, default=40)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-control", dest="control", action="store_false",
                        help="skip the control: as many healthy turns again, with no flood")
    parser.add_argument("--no-turns", dest="turns", action="store_false",
                        help="leave out the frames that decode as SendMessageRequest: the "
                             "flood's overhead without the turns it asks for")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a server setting (e.g. session.lane_cpu_share=0)")
    args = parser.parse_args(argv)
    report = run(args.frames, args.peak_bound_mb, args.margin_mb, args.seed,
                 settings=tuple(args.set), control=args.control, turns=args.turns)
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
