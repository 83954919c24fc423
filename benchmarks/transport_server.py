"""Run one benchmark server in this process until stdin closes.

    python -m benchmarks.transport_server --impl reactor|uvloop [--direct-send 0|1]
        [--models-dir DIR] [--set key=value ...] [--pipeline-config FILE]

Prints `PORT <n>` once listening (and `PIPELINE <n>`, the pipeline transport's port, when
given a pipeline config; reactor only). Both implementations are the same Server (sessions,
codec, handlers, dev mode, no models); only the transport differs.
"""
import argparse
import sys
import tempfile

from tryll_fast.server import Server, load_config


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--impl", choices=("reactor", "uvloop"), required=True)
    parser.add_argument("--direct-send", type=int, default=1)
    parser.add_argument("--models-dir", help="models (default: an empty scratch dir)")
    parser.add_argument("--set", action="append", default=[], help="more config overrides")
    parser.add_argument("--pipeline-config", help="also serve these pipeline agents")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="tryll-bench-")
    config = load_config(environ={}, flags={
        "port": 0, "dev": True, "models_dir": args.models_dir or f"{scratch}/models",
        "storage_root": f"{scratch}/storage", "log_level": "warning"},
        overrides=[f"transport.direct_send={args.direct_send}", *args.set])
    if args.impl == "reactor":
        server = Server(config)
    else:
        from benchmarks.uvloop_server import UvloopServer
        server = UvloopServer(config)
    _, port = server.start()
    print(f"PORT {port}", flush=True)
    if args.pipeline_config:
        from tryll_fast.gateway import Gateway, load_pipeline_config
        gateway = Gateway(server, load_pipeline_config(args.pipeline_config), port=0)
        print(f"PIPELINE {gateway.start()[1]}", flush=True)
    sys.stdin.read()          # the benchmark closes our stdin when it is done
    server.shutdown(1.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
