"""make eval: the NPC quality suite on each language model, scored, written down.

    python -m benchmarks.npc [--models A,B] [--categories facts,tools] [--limit N]
                             [--results FILE] [--no-docs]

Each model runs on a server process of its own (so its memory is its own). Results merge
into benchmarks/results/npc_quality.json (a model's entry is replaced; entries measured
on another version of the cases are dropped) and docs/npc-quality.md is written from it.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys

from benchmarks.npc import report
from benchmarks.npc.cases import CATEGORIES, load_suite
from benchmarks.npc.run import ROOT, run_model
from benchmarks.npc.score import category_scores, overall, percentile

DEFAULT_MODELS = ("SmolLM2-135M-Instruct", "Qwen2.5-Coder-0.5B-Instruct",
                  "Qwen2.5-Coder-1.5B-Instruct")


def summarise(result: dict) -> dict:
    outs = result["outcomes"]
    timed = [o for o in result["timed"] if o.turn_s is not None and not o.error]
    rates = [o.tokens / (o.turn_s - o.first_token_s) for o in timed
             if o.first_token_s is not None and o.tokens >= 8 and o.turn_s > o.first_token_s]
    first = [o.first_token_s for o in timed]
    whole = [o.turn_s for o in timed]

    def ms(values, q):
        v = percentile(values, q)
        return None if v is None else round(v * 1000, 1)

    return {
        "categories": category_scores(outs, CATEGORIES),
        "overall": overall(outs),
        "latency": {"turns": len(timed), "first_token_ms_p50": ms(first, 50),
                    "first_token_ms_p90": ms(first, 90), "turn_ms_p50": ms(whole, 50),
                    "turn_ms_p90": ms(whole, 90),
                    "tokens_per_s_p50": (round(percentile(rates, 50), 1) if rates else None)},
        "memory": result["memory"],
        "seconds": result["seconds"],
        "parallel": result["parallel"],
        "cases": [o.as_json() for o in outs],
    }


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "tryll_fast",
                                "benchmarks/npc"], cwd=ROOT, capture_output=True,
                               text=True).stdout.strip()
        return out + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.npc", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(DEFAULT_MODELS))
    p.add_argument("--categories", default="", help="comma-separated; default: all")
    p.add_argument("--limit", type=int, help="at most N single-exchange cases (a smoke run)")
    p.add_argument("--results", default=report.RESULTS)
    p.add_argument("--no-docs", action="store_true", help="do not rewrite docs/npc-quality.md")
    p.add_argument("--server-log", help="append the servers' stderr to this file")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a server setting for the runs (recorded with the results)")
    p.add_argument("--label", help="the results' name for this run (default: the model)")
    p.add_argument("--parallel", type=int, default=4,
                   help="cases scored at once, each on a connection of its own (default 4)")
    args = p.parse_args(argv)
    suite = load_suite()
    categories = [c for c in args.categories.split(",") if c] or None
    for c in categories or ():
        if c not in CATEGORIES:
            p.error(f"--categories: {c!r} is not one of {', '.join(CATEGORIES)}")
    print(f"suite: {len(suite.all_cases())} cases ({len(suite.cases)} single, "
          f"{len(suite.recalls)} recall conversations), digest {suite.digest[:12]}", flush=True)
    data = report.load(args.results, suite.digest)
    data.update(commit=_commit(), date=datetime.date.today().isoformat(),
                machine={"cpu": platform.processor() or platform.machine(),
                         "cores": os.cpu_count()},
                suite={"digest": suite.digest, "cases": len(suite.all_cases()),
                       "by_category": {c: sum(1 for x in suite.all_cases() if x.category == c)
                                       for c in CATEGORIES}})
    partial = bool(categories or args.limit)
    log = open(args.server_log, "a") if args.server_log else subprocess.DEVNULL
    for model in [m for m in args.models.split(",") if m]:
        print(f"== {model}", flush=True)
        result = run_model(suite, model, categories=categories, limit=args.limit,
                           progress=lambda s: print(s, flush=True), log=log,
                           settings=tuple(args.set), parallel=args.parallel)
        entry = summarise(result)
        entry.update(partial=partial, model=model, settings=list(args.set))
        name = args.label or model
        data.setdefault("models", {})[name] = entry
        print(report.model_line(name, entry), flush=True)
        report.save(args.results, data)
    if not args.no_docs and not partial:
        report.write_docs(data)
    print(report.table(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
