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


def engine_cases(data):
    """{case: (median seconds, extra_info)} for the engine suite."""
    return {b["extra_info"]["case"]: (b["stats"]["median"], b["extra_info"])
            for b in data["benchmarks"] if b.get("extra_info", {}).get("suite") == "engine"}


def engine_ratio(num, den):
    def measure(data):
        cases = engine_cases(data)
        if num not in cases or den not in cases:
            return float("nan")
        return cases[num][0] / cases[den][0]
    return measure


def kv_sharing_efficiency(data):
    info = engine_cases(data).get("batched", (0, {}))[1]
    if not info.get("kv_used_cells"):
        return float("nan")
    return info["kv_ideal_cells"] / info["kv_used_cells"]


def transport_cases(data):
    """{(case, impl): (median seconds, extra_info)} for the transport suite."""
    return {(b["extra_info"]["case"], b["extra_info"]["impl"]): (b["stats"]["median"],
                                                                  b["extra_info"])
            for b in data["benchmarks"] if b.get("extra_info", {}).get("suite") == "transport"}


def transport_ratio(case):
    """median(uvloop) / median(ours) for the same work."""
    def measure(data):
        cases = transport_cases(data)
        if (case, "ours") not in cases or (case, "uvloop") not in cases:
            return float("nan")
        return cases[(case, "uvloop")][0] / cases[(case, "ours")][0]
    return measure


def workflow_info(data, case):
    for b in data["benchmarks"]:
        info = b.get("extra_info", {})
        if info.get("suite") == "workflow" and info.get("case") == case:
            return info
    return {}


def workflow_value(case, key):
    def measure(data):
        return float(workflow_info(data, case).get(key, float("nan")))
    return measure


# name, how to measure, op, threshold
GATES = [
    ("codec_decode_vs_flatbuffers", lambda d: geomean(codec_ratios(d, "decode").values()),
     ">=", 20.0),
    ("codec_encode_vs_flatbuffers", lambda d: geomean(codec_ratios(d, "encode").values()),
     ">=", 20.0),
    ("engine_batched_vs_serialised", engine_ratio("serialised", "batched"), ">=", 2.5),
    ("engine_batched_vs_prompt_cache", engine_ratio("prompt_cache", "batched"), ">=", 1.5),
    ("engine_restore_vs_reprefill", engine_ratio("reprefill", "restore"), ">=", 50.0),
    ("engine_kv_sharing_efficiency", kv_sharing_efficiency, ">=", 0.95),
    ("transport_rps_vs_uvloop_64conn", transport_ratio("rps_64conn"), ">=", 1.3),
    ("transport_stream_vs_uvloop", transport_ratio("stream_100k"), ">=", 1.5),
    ("workflow_first_token_overhead_ms",
     workflow_value("single_agent", "first_token_overhead_ms_p50"), "<=", 2.0),
    ("workflow_token_overhead_us", workflow_value("single_agent", "token_handoff_us_p50"),
     "<=", 50.0),
]


def report(data):
    """The per-suite tables (for docs/benchmarks.md), then the gates."""
    cases = engine_cases(data)
    if cases:
        print(f"{'engine case':16} {'median s':>9}  details")
        for case, (median, info) in sorted(cases.items()):
            details = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in info.items()
                       if k not in ("suite", "case")}
            print(f"{case:16} {median:9.3f}  {details}")
    for case in ("single_agent", "eight_agents", "resume", "kv_lifecycle",
                 "kv_lifecycle_host_copy"):
        info = workflow_info(data, case)
        if info:
            details = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in info.items()
                       if k not in ("suite", "case")}
            print(f"workflow {case:14} {details}")
    transport = transport_cases(data)
    if transport:
        print(f"{'transport case':16} {'impl':13} {'median s':>9}  details")
        for (case, impl), (median, info) in sorted(transport.items()):
            details = {k: (round(v, 1) if isinstance(v, float) else v) for k, v in info.items()
                       if k not in ("suite", "case", "impl")}
            print(f"{case:16} {impl:13} {median:9.4f}  {details}")
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
