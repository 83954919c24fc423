"""The game's side of SetInferenceThrottle: a game's frames on the device the NPCs run on,
alone and beside the engine at several throttles, on each llama.cpp build this machine has.

    python -m benchmarks.share [--builds cpu,vulkan] [--seconds 20] [--throttles 0,0.5,0.8,0.95]
                               [--npcs 8] [--npc-tokens 64] [--json results.json]

The NPCs: the engine benchmark's villagers (benchmarks/engine_workload.py: Gemma 3 270M,
the shared lore, 2 threads) asking their questions over and over, 64 greedy tokens a turn,
with the engine's throttle set as SetInferenceThrottle sets it for every engine. The game:
a separate process that, every frame, runs a fixed piece of work on the same device, a
4-token decode of SmolLM2 through llama-cpp-python (one thread, as a game's render thread;
every layer on the GPU in the Vulkan build), then sleeps until its next frame. Its frame
period is twice its median work time alone, so a frame whose work takes longer than the
period is a frame the game missed. Each phase prints the game's work time (p50, p95) and
missed frames, and the NPCs' generated tokens a second over the same window.

Reported, not gated: what a throttle is worth is the trade the game's author chooses (the
game and the server are separate processes sharing one GPU). With no GPU the Vulkan device is lavapipe,
the same CPU cores behind a software driver, so its figures show the path works, not what
a card would do; the same command runs unchanged on a machine with one.

Each side runs in its own process (a game is one; a venv holds one llama-cpp-python), both
from the build's venv; they talk over stdin/stdout lines.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.backends import ROOT, venvs, write_json

GAME_MODEL = "SmolLM2-135M-Instruct"
GAME_TOKENS = 4
NPC_TOKENS = 64
WARM_FRAMES = 5


# -- the NPCs' process ----------------------------------------------------------------------

def npcs_worker(throttle: float, n: int, max_tokens: int) -> int:
    from benchmarks.engine_workload import FLASH_ATTN, N_THREADS, model_path, prompts
    from tryll_fast.engines.llama import LlamaEngine
    base, texts = prompts(n)
    lock = threading.Lock()
    current: list = []             # this round's handles, counted live
    done = [0]                     # tokens of the rounds that finished
    ready = threading.Event()
    stop = threading.Event()
    failed: list[BaseException] = []
    with LlamaEngine(model_path(), n_ctx=4096, n_slots=n, n_prefix_slots=2, n_batch=512,
                     n_threads=N_THREADS, n_threads_batch=N_THREADS,
                     flash_attn_type=FLASH_ATTN) as eng:
        shared = len(eng.tokenize(base))

        def talk():
            try:
                while not stop.is_set():
                    for i in range(n):
                        eng.release(("npc", i))
                    batch = [eng.submit(p, key=("npc", i), shared_prefix_len=shared,
                                        max_tokens=max_tokens, ignore_eos=True)
                             for i, p in enumerate(texts)]
                    with lock:
                        current[:] = batch
                    for h in batch:
                        h.result(3600)
                    with lock:
                        done[0] += sum(h.stats.tokens_generated for h in batch)
                        current.clear()
                    ready.set()
            except BaseException as exc:       # reported by the main thread, not lost
                failed.append(exc)
                ready.set()

        def generated() -> int:
            with lock:
                return done[0] + sum(h.stats.tokens_generated for h in current)

        talker = threading.Thread(target=talk, daemon=True)
        talker.start()
        ready.wait()                    # one round done: lore cached, kernels warm
        if failed:
            raise failed[0]
        # the warm-up runs flat out; at 0.95 its pauses alone would take minutes
        eng.set_throttle(throttle)
        print("ready", flush=True)
        t0 = n0 = None
        for line in sys.stdin:
            if line.strip() == "start":
                t0, n0 = time.perf_counter(), generated()
                at_start = eng.status()
            elif line.strip() == "stop":
                tokens, dt = generated() - n0, time.perf_counter() - t0
                place = eng.model.placement_info()
                st = eng.status()
                print(json.dumps({"tokens": tokens, "seconds": dt,
                                  "tokens_per_s": tokens / dt,
                                  # this phase's decode steps and the pauses after them
                                  "steps": st["steps"] - at_start["steps"],
                                  "throttle_pauses": (st["throttle_pauses"]
                                                      - at_start["throttle_pauses"]),
                                  "placement": place["placement"],
                                  "device": place["device"]}), flush=True)
                break
        stop.set()
        with lock:
            for h in current:
                h.cancel()
        talker.join()
    return 0


# -- the game's process ---------------------------------------------------------------------

def game_worker(on_device: bool) -> int:
    import llama_cpp
    from llama_cpp import Llama

    from tryll_fast.models import ensure_model
    path = str(ensure_model(GAME_MODEL, os.path.join(ROOT, "build", "models")))
    llm = Llama(path, n_ctx=256, n_batch=GAME_TOKENS, n_threads=1, n_threads_batch=1,
                n_gpu_layers=-1 if on_device else 0, verbose=False)
    tokens = llm.tokenize(b"The innkeeper wipes the counter and looks up at the door.",
                          add_bos=True)[:GAME_TOKENS]

    def frame() -> float:
        t = time.perf_counter()
        llm.reset()
        llm.eval(tokens)
        # a GPU backend returns from eval with the work still queued on the device; a
        # game's frame ends when its device work has (its fence, its present)
        llama_cpp.llama_synchronize(llm._ctx.ctx)
        return time.perf_counter() - t

    alone = [frame() for _ in range(WARM_FRAMES)]
    print(f"ready {statistics.median(alone[1:])}", flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd and cmd[0] == "go":
            period, seconds = float(cmd[1]), float(cmd[2])
            work = []
            start = next_at = time.perf_counter()
            while next_at - start < seconds:
                work.append(frame())
                next_at += period
                now = time.perf_counter()
                if next_at > now:
                    time.sleep(next_at - now)
                else:
                    next_at = now   # a late frame starts the next one at once
            print(json.dumps({"work_s": work}), flush=True)
            break
    llm.close()
    return 0


# -- the orchestration ----------------------------------------------------------------------

def _spawn(py: str, env: dict, *args: str) -> subprocess.Popen:
    # llama.cpp's load chatter goes to a file, shown only if the worker fails
    log = tempfile.TemporaryFile(mode="w+")
    proc = subprocess.Popen([py, "-m", "benchmarks.share", *args], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                            env={**os.environ, **env})
    proc.log = log
    return proc


def _expect(proc: subprocess.Popen, what: str) -> str:
    line = proc.stdout.readline()
    if not line.startswith(what):
        proc.kill()
        code = proc.wait()
        proc.log.seek(0)
        tail = proc.log.read()[-2000:]
        raise RuntimeError(f"{proc.args[3]} exited (code {code}) instead of saying "
                           f"{what!r}; its stderr ends:\n{tail}")
    return line


def _send(proc: subprocess.Popen, line: str) -> None:
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def run_build(label: str, py: str, env: dict, *, seconds: float, throttles: list[float],
              npcs: int, npc_tokens: int, out=sys.stdout) -> dict:
    on_device = env.get("TRYLL_LLAMA_PLACEMENT") == "vram"
    phases = [None, *throttles]
    period = None
    report = {"phases": []}
    for throttle in phases:
        game = _spawn(py, env, "--game-worker", *(["--on-device"] if on_device else []))
        alone_s = float(_expect(game, "ready").split()[1])
        if period is None:
            period = 2 * alone_s    # fixed by the first phase (alone) for every phase
            report["period_s"] = period
        talk = None
        if throttle is not None:
            talk = _spawn(py, env, "--npcs-worker", "--throttle", str(throttle),
                          "--npcs", str(npcs), "--npc-tokens", str(npc_tokens))
            _expect(talk, "ready")
            _send(talk, "start")
        _send(game, f"go {period} {seconds}")
        work = json.loads(_expect(game, "{"))["work_s"]
        game.wait()
        npc = None
        if talk is not None:
            _send(talk, "stop")
            npc = json.loads(_expect(talk, "{"))
            talk.stdin.close()
            talk.wait()
        q = statistics.quantiles(work, n=20)
        row = {"throttle": throttle, "frames": len(work),
               "work_p50_ms": 1000 * statistics.median(work), "work_p95_ms": 1000 * q[18],
               "missed": sum(w > period for w in work) / len(work),
               "npc_tokens_per_s": npc["tokens_per_s"] if npc else None,
               "npc_throttle_pauses": npc["throttle_pauses"] if npc else None,
               "npc_steps": npc["steps"] if npc else None,
               "npc_device": (npc["device"] or "host") if npc else None}
        report["phases"].append(row)
        who = "game alone" if throttle is None else f"throttle {throttle:g}"
        npc_txt = (f"; NPCs {row['npc_tokens_per_s']:.1f} tokens/s on {row['npc_device']}"
                   if npc else "")
        print(f"{label:7s} {who:12s} frame work p50 {row['work_p50_ms']:7.1f} ms, "
              f"p95 {row['work_p95_ms']:7.1f} ms, missed {100 * row['missed']:5.1f} % "
              f"of {row['frames']} frames (period {1000 * period:.1f} ms){npc_txt}",
              file=out, flush=True)
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--builds", default="cpu,vulkan",
                    help="which of the builds to run (a missing venv is skipped)")
    ap.add_argument("--seconds", type=float, default=20.0, help="each phase's length")
    ap.add_argument("--throttles", default="0,0.5,0.8,0.95")
    ap.add_argument("--npcs", type=int, default=8)
    ap.add_argument("--npc-tokens", type=int, default=NPC_TOKENS,
                    help="tokens an NPC generates a turn (fewer on a software device)")
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--npcs-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--game-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--on-device", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--throttle", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.npcs_worker:
        return npcs_worker(args.throttle, args.npcs, args.npc_tokens)
    if args.game_worker:
        return game_worker(args.on_device)
    throttles = [float(t) for t in args.throttles.split(",")]
    results = {label: run_build(label, py, env, seconds=args.seconds, throttles=throttles,
                                npcs=args.npcs, npc_tokens=args.npc_tokens)
               for label, py, env in venvs(args.builds.split(","))}
    write_json(args.json, results)
    return 0

if __name__ == "__main__":
    sys.exit(main())
