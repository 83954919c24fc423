"""Helpers for the model tests: a local HTTP server, wheels built on the spot, catalogs made
from dicts. Nothing here touches the network beyond 127.0.0.1.
"""
from __future__ import annotations

import hashlib
import http.server
import re
import threading
import zipfile
from pathlib import Path

from tryll_fast.models import parse_catalog


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_catalog(*entries: dict):
    return parse_catalog({"format": 1, "model": list(entries)}, "<test catalog>")


def entry(name: str, files: list[dict], **fields) -> dict:
    base = {"name": name, "role": "vad", "engine": "sherpa-onnx", "files": files}
    base.update(fields)
    return base


def file_item(name: str, data: bytes, source) -> dict:
    return {"name": name, "sha256": sha256(data), "size": len(data), "source": source}


class ServedFile:
    def __init__(self, data: bytes, *, status: int = 200, lie: bytes | None = None,
                 ignore_range: bool = False, cut_at: int | None = None) -> None:
        self.data = data
        self.status = status
        self.lie = lie                  # bytes sent instead of data
        self.ignore_range = ignore_range
        self.cut_at = cut_at            # stop sending after this many bytes of the body


class LocalHttpServer:
    """http.server on 127.0.0.1 with Range support and scripted misbehaviour."""

    def __init__(self) -> None:
        self.files: dict[str, ServedFile] = {}
        self.requests: list[tuple[str, str | None]] = []   # (path, Range header)
        self.body_bytes_sent = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                rng = self.headers.get("Range")
                outer.requests.append((self.path, rng))
                served = outer.files.get(self.path)
                if served is None or served.status != 200:
                    status = 404 if served is None else served.status
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = served.lie if served.lie is not None else served.data
                start = 0
                match = re.fullmatch(r"bytes=(\d+)-", rng or "")
                if match and not served.ignore_range:
                    start = int(match[1])
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range",
                                     f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                chunk = body[start:]
                if served.cut_at is not None:
                    # Announce what the cut body holds: the client sees a clean short file.
                    chunk = chunk[:served.cut_at]
                self.send_header("Content-Length", str(len(chunk)))
                self.end_headers()
                self.wfile.write(chunk)
                outer.body_bytes_sent += len(chunk)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,),
                                       daemon=True)

    def url(self, path: str) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}{path}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def make_wheel(directory: Path, dist: str, version: str, members: dict[str, bytes]) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD) that pip accepts from --find-links."""
    norm = re.sub(r"[-_.]+", "_", dist).lower()
    info = f"{norm}-{version}.dist-info"
    files = dict(members)
    files[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {dist}\n"
                                 f"Version: {version}\n").encode()
    files[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: tryll-tests\n"
                              b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"]).encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{norm}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def offline_pip(wheelhouse: Path) -> tuple[str, ...]:
    return ("--no-index", "--find-links", str(wheelhouse), "--no-cache-dir")
