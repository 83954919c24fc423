"""Turn the latest benchmark results into gates.

    python -m benchmarks.gates [results.json]

Prints one line per gate, `GATE <name> <measured> <op> <threshold> PASS|FAIL`,
then exits 1 if any gate failed (or could not be measured). Gates are ratios
between implementations measured in the same run, so a noisy shared machine
shifts both sides together."""
import glob
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def latest_results():
    files = sorted(glob.glob(os.path.join(RESULTS, "*.json")), key=os.path.getmtime)
    if not files:
        raise SystemExit("no benchmark results under benchmarks/results/: run `make bench`")
    return files[-1]


def medians(data, suite):
    """{(op, msg, impl): median seconds} for one suite."""
    out = {}
    for b in data["benchmarks"]:
        info = b.get("extra_info", {})
        if info.get("suite") == suite:
            out[(info["op"], info["msg"], info["impl"])] = b["stats"]["median"]
    return out


def codec_ratios(data, op):
    """Per message: median(official) / median(ours)."""
    m = medians(data, "codec")
    msgs = sorted({k[1] for k in m if k[0] == op})
    return {msg: m[(op, msg, "flatbuffers")] / m[(op, msg, "ours")]
            for msg in msgs if (op, msg, "flatbuffers") in m and (op, msg, "ours") in m}


def geomean(values):
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


# name, how to measure, op, threshold
GATES = [
    ("codec_decode_vs_flatbuffers", lambda d: geomean(codec_ratios(d, "decode").values()),
     ">=", 20.0),
    ("codec_encode_vs_flatbuffers", lambda d: geomean(codec_ratios(d, "encode").values()),
     ">=", 20.0),
]


def report(data):
    """The per-message table (for docs/benchmarks.md), then the gates."""
    m = medians(data, "codec")
    if m:
        print(f"{'message':24} {'op':6} {'ours µs':>9} {'official µs':>12} {'ratio':>7}")
        for op in ("decode", "encode"):
            for msg, r in codec_ratios(data, op).items():
                print(f"{msg:24} {op:6} {m[(op, msg, 'ours')] * 1e6:9.2f} "
                      f"{m[(op, msg, 'flatbuffers')] * 1e6:12.2f} {r:7.1f}")


def main(argv):
    path = argv[1] if len(argv) > 1 else latest_results()
    with open(path) as f:
        data = json.load(f)
    report(data)
    failed = False
    for name, measure, op, threshold in GATES:
        value = measure(data)
        ok = (not math.isnan(value)) and (value >= threshold if op == ">=" else value <= threshold)
        failed |= not ok
        print(f"GATE {name} {value:.2f} {op} {threshold:g} {'PASS' if ok else 'FAIL'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
