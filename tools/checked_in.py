"""The command line every generator of checked-in code shares: write the files, or with
--check exit 1 (naming them) when what is checked in differs from what would be written."""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Iterable


def _read(path: str) -> str | None:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def run(description: str, render: Callable[[], Iterable[tuple[str, str]]],
        argv=None) -> int:
    """render() -> [(path, text)]; the generator's main()."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check", action="store_true", help="fail if the output is stale")
    args = ap.parse_args(argv)
    outputs = list(render())
    if args.check:
        stale = [path for path, text in outputs if _read(path) != text]
        if stale:
            print(f"stale generated files (run {os.path.basename(sys.argv[0])}): "
                  + ", ".join(stale), file=sys.stderr)
            return 1
        return 0
    for path, text in outputs:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {path} ({text.count(chr(10))} lines)")
    return 0
