"""The `tryll-fast` command line: `models list`, `models fetch` (and later `serve`).

Each top-level command registers itself with `_add_<command>(subparsers)` and sets a
handler `(args) -> exit code`, so the server issue adds `serve` beside `models` without
touching the rest.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence, TextIO

from tryll_fast.models import (
    CatalogError, ModelDownloadError, ModelStore, load_catalog,
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
    _add_models(commands)
    return parser


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
        bar = None if args.quiet else ProgressBar(sys.stderr, name)
        try:
            path = store.fetch(name, progress=bar)
        except ModelDownloadError as exc:
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
        except ModelDownloadError as exc:
            print(f"tryll-fast: {exc}", file=sys.stderr)
            status = EXIT_FAILED
            continue
        print(f"{name}: {'deleted' if removed else 'was not downloaded'}")
    return status


# ----- progress -----

class ProgressBar:
    """A one-line bar on a terminal, or a line per 10 % when output is a file or pipe.

    Used as the fetch progress callback: (bytes_done, bytes_total, current_file).
    """

    WIDTH = 28
    MIN_INTERVAL_S = 0.1  # redraw at most ten times a second

    def __init__(self, stream: TextIO, title: str) -> None:
        self.stream = stream
        self.title = title
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.started = time.monotonic()
        self.last_draw = 0.0
        self.last_decile = -1
        self.drawn = False

    def __call__(self, done: int, total: int, current_file: str) -> None:
        now = time.monotonic()
        fraction = min(max(done / total, 0.0), 1.0) if total > 0 else 0.0
        if self.tty:
            if now - self.last_draw < self.MIN_INTERVAL_S and done < total:
                return
            self.last_draw = now
            filled = int(fraction * self.WIDTH)
            rate = done / max(now - self.started, 1e-6)
            line = (f"\r{self.title} [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
                    f"{fraction * 100:5.1f}% {format_bytes(done)}/{format_bytes(total)} "
                    f"{format_bytes(rate)}/s {current_file}")
            self.stream.write(line[:160] + "\x1b[K")
            self.drawn = True
        else:
            decile = int(fraction * 10)
            if decile == self.last_decile:
                return
            self.last_decile = decile
            self.stream.write(f"{self.title}: {decile * 10}% of {format_bytes(total)} "
                              f"({current_file})\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError  # unreachable


if __name__ == "__main__":
    sys.exit(main())
