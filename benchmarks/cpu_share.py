"""Beside a busy game: the NPCs' speed and the game's frames when the two share the CPU.

    python -m benchmarks.cpu_share [--seconds 15] [--set KEY=VALUE ...] [--label NAME]
                                   [--json FILE] [--voice]

The game is benchmarks/game/game.c (compiled here with cc): frames of 16.7 ms of integer
work per thread, its threads joined at the end of each frame. Three games:
  busy1    one thread, uncapped (a frame is 16.7 ms of work, the next starts at once)
  busy2    two threads, uncapped (every core of this machine kept busy)
  capped2  two threads, 10 ms of work each per 16.7 ms frame, then asleep until the next
           frame starts (a game capped at 60 frames a second)
The server is the benchmark server (benchmarks.transport_server) with the default model
and `--set` settings. The NPC: one agent, a Generate node streaming a blacksmith's answer
(128 tokens, greedy) turn after turn; then three GenerateAndSpeak turns (the catalog's
default voice) for the first audio. Measured per game: the game's frame times alone (the
server idle) and beside the NPC; the NPC's decode rate (tokens after the first over the
time after the first), first token and first audio, against the same with no game. A
turn still running when its phase's window ends is cancelled and counted up to there.

`--voice` also measures push-to-talk voice to voice (benchmarks.npc.voice) beside busy1.
Results: printed, and as JSON (`--json`); benchmarks/test_cpu_share.py turns them into
gates.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.npc.run import MODELS_DIR
from benchmarks.npc.score import percentile
from benchmarks.transport_load import ServerProcess
from tryll_fast import codec
from tryll_fast.client import GraphDescription, TryllClient
from tryll_fast.models import ensure_model, load_catalog
from tryll_fast.server.server import default_llm

HERE = os.path.dirname(os.path.abspath(__file__))
GAME_SRC = os.path.join(HERE, "game", "game.c")
FRAME_MS = 1000 / 60
GAMES = {"busy1": (1, FRAME_MS, 0), "busy2": (2, FRAME_MS, 0), "capped2": (2, 10.0, 1)}
PERSONA = ("You are Tomas Reed, the blacksmith of Oakvale, a village on the River Wend. "
           "Your forge is at the east end of the village. You are proud of your work and "
           "talk about it at length.")
QUESTION = "Tell me about your forge, and everything you make there."
SPEAK_LINE = "Good morning, smith! What are you working on today?"
MAX_TOKENS = 128


def build_game(out_dir: str) -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("the CPU-share benchmark needs a C compiler (cc) for its game")
    exe = os.path.join(out_dir, "game")
    subprocess.run([cc, "-O2", "-pthread", "-o", exe, GAME_SRC], check=True)
    return exe


class Game:
    """One run of the synthetic game in a subprocess."""

    def __init__(self, exe: str, units_per_ms: int, kind: str, seconds: float) -> None:
        threads, work_ms, capped = GAMES[kind]
        self.proc = subprocess.Popen(
            [exe, "run", str(threads), str(int(units_per_ms * work_ms)), str(capped),
             str(seconds)], stdout=subprocess.PIPE, text=True)

    def frames_ms(self) -> list[float]:
        out, _ = self.proc.communicate(timeout=600)
        if self.proc.returncode != 0:
            raise RuntimeError(f"the game exited with {self.proc.returncode}")
        return [int(x) / 1000 for x in out.split()]


def frame_stats(frames: list[float]) -> dict:
    frames = frames[5:]                       # the first frames start the threads
    return {"frames": len(frames), "p50_ms": round(percentile(frames, 50), 2),
            "p99_ms": round(percentile(frames, 99), 2),
            "missed": sum(1 for f in frames if f > FRAME_MS * 1.05)}


class Npc:
    """The NPC side: a client with a streaming agent and a speaking one."""

    def __init__(self, port: int, model: str) -> None:
        self.client = TryllClient("127.0.0.1", port, timeout=600).connect()
        self.client.create_session()
        sampling = codec.SamplingOverrides(max_tokens=MAX_TOKENS, temperature=0.0, seed=7)
        self.agent = self.client.create_agent(GraphDescription().add_node(
            "reply", codec.GenerateParams(system_prompt=PERSONA, sampling=sampling,
                                          send=codec.SendMode.Streamed))
            .set_default_model_name(model), timeout=600)
        voice = next(e.name for e in load_catalog().defaults() if e.role == "tts")
        self.speaker = self.client.create_agent(GraphDescription().add_node(
            "reply", codec.GenerateAndSpeakParams(
                system_prompt=PERSONA + " Answer in one or two short sentences.",
                sampling=codec.SamplingOverrides(max_tokens=48, temperature=0.0, seed=7)))
            .set_default_model_name(model), voice=codec.VoiceProfile(model_name=voice),
            timeout=600)
        self.first_audio = threading.Event()
        self.t_audio = [0.0]
        self.speaker.set_on_tts_audio(self._audio)

    def _audio(self, _pcm) -> None:
        if not self.first_audio.is_set():
            self.t_audio[0] = time.perf_counter()
            self.first_audio.set()

    def stream(self, seconds: float) -> dict:
        """Turns back to back for `seconds`; the decode rate and first tokens."""
        end = time.perf_counter() + seconds
        tokens, decode_s, firsts, turns = 0, 0.0, [], 0
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            stream = self.agent.send(QUESTION)
            first = None
            cancel = threading.Timer(max(0.0, end - t0), lambda: self.agent.cancel_async(
                codec.CancelMode.StopAndDiscard))
            cancel.start()
            for _ in stream:
                if first is None:
                    first = time.perf_counter()
            result = stream.result(600)
            cancel.cancel()
            t1 = time.perf_counter()
            turns += 1
            if result.ok:          # every turn asks the same question of the same persona
                self.agent.remove_interactions_from_end(1)
            if first is not None:
                firsts.append((first - t0) * 1000)
                if result.tokens_generated > 1:
                    tokens += result.tokens_generated - 1
                    decode_s += t1 - first
        return {"turns": turns, "tokens": tokens,
                "tokens_per_s": round(tokens / decode_s, 2) if decode_s else 0.0,
                "first_token_ms_p50": round(statistics.median(firsts), 1) if firsts else None}

    def speak(self, rounds: int = 3) -> dict:
        """GenerateAndSpeak turns: SendMessage -> the first TtsAudioFrame."""
        out = []
        for _ in range(rounds):
            self.first_audio.clear()
            t0 = time.perf_counter()
            stream = self.speaker.send(SPEAK_LINE)
            for _ in stream:
                pass
            stream.result(600)
            if self.first_audio.wait(30):
                out.append((self.t_audio[0] - t0) * 1000)
        return {"first_audio_ms_p50": round(statistics.median(out), 1) if out else None}

    def close(self) -> None:
        self.client.close()


def run(seconds: float, settings: tuple[str, ...], voice: bool, log=None) -> dict:
    model = default_llm(load_catalog(), "")
    for name in (model, *(e.name for e in load_catalog().defaults() if e.role == "tts")):
        ensure_model(name, MODELS_DIR)
    tmp = tempfile.mkdtemp(prefix="tryll-cpu-share-")
    exe = build_game(tmp)
    units = int(subprocess.run([exe, "calibrate"], capture_output=True, text=True,
                               check=True).stdout)
    out = {"model": model, "settings": list(settings), "cores": os.cpu_count(),
           "units_per_ms": units, "seconds": seconds, "games": {}}
    server = ServerProcess("reactor", models_dir=MODELS_DIR, settings=settings, stderr=log)
    try:
        npc = Npc(server.port, model)
        npc.stream(3.0)                       # loads the model, warms the prefix cache
        npc.speak(1)
        out["idle"] = {**npc.stream(seconds), **npc.speak()}
        print(f"no game: {out['idle']}", flush=True)
        for kind in GAMES:
            alone = frame_stats(Game(exe, units, kind, seconds).frames_ms())
            game = Game(exe, units, kind, seconds + 0.5)
            time.sleep(0.5)
            beside = npc.stream(seconds)
            shared = frame_stats(game.frames_ms())
            game = Game(exe, units, kind, 600)
            time.sleep(0.5)
            beside.update(npc.speak())
            game.proc.terminate()
            speech = frame_stats(game.frames_ms())
            out["games"][kind] = {"game_alone": alone, "game_beside_npc": shared,
                                  "game_beside_speech": speech, "npc_beside_game": beside}
            print(f"{kind}: game alone {alone}; beside the NPC {shared}; beside its speech "
                  f"{speech}; NPC {beside}", flush=True)
        npc.close()
    finally:
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)
    if voice:
        from benchmarks.npc import voice as v2v
        from tryll_fast.engines.speech.piper import PiperVoice
        ensure_model(v2v.STT, MODELS_DIR)
        tts = PiperVoice(ensure_model(v2v.VOICE, MODELS_DIR), n_threads=2)
        clips = [v2v.speech(tts, line) for line in v2v.LINES]
        tts.close()
        exe = build_game(tmp := tempfile.mkdtemp(prefix="tryll-cpu-share-"))
        game = Game(exe, units, "busy1", 600)
        try:
            out["voice_to_voice_beside_busy1"] = {
                k: v for k, v in v2v.measure(model, clips, 5).items()
                if k in ("p50_ms", "p90_ms", "samples_ms")}
        finally:
            game.proc.kill()
            game.proc.wait()
            shutil.rmtree(tmp, ignore_errors=True)
        print(f"voice to voice beside busy1: {out['voice_to_voice_beside_busy1']}", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.cpu_share", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--voice", action="store_true")
    p.add_argument("--json")
    args = p.parse_args(argv)
    result = run(args.seconds, tuple(args.set), args.voice)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
