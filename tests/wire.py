"""Test helpers that speak the protocol over a real socket on 127.0.0.1.

`Wire` is deliberately not the product's client: it sends whatever bytes a test wants
(broken frames included) and hands back every decoded frame, so the tests check the
server's rules directly. `start_server()` runs a real Server on a free port.
"""
from __future__ import annotations

import collections
import os
import socket
import struct
import tempfile
import time
from pathlib import Path

from tryll_fast import codec

HERE = Path(__file__).resolve().parent
MODELS_DIR = HERE.parent / "build" / "models"


def make_config(tmp: str | os.PathLike | None = None, *, dev: bool = True,
                models_dir: str | os.PathLike | None = None, catalog=None,
                overrides=(), **flags):
    from tryll_fast.server import load_config
    tmp = Path(tmp or tempfile.mkdtemp(prefix="tryll-test-"))
    base = {"port": 0, "dev": dev, "storage_root": str(tmp / "storage"),
            "models_dir": str(models_dir or tmp / "models"), "log_level": "warning"}
    if catalog is not None:
        base["catalog"] = str(catalog)
    base.update(flags)
    return load_config(environ={}, flags=base, overrides=list(overrides))


def start_server(tmp=None, *, cls=None, **kw):
    from tryll_fast.server import Server
    server = (cls or Server)(make_config(tmp, **kw))
    server.start()
    return server


class Wire:
    def __init__(self, address, timeout: float = 15.0, *, read_ready: bool = True,
                 rcvbuf: int | None = None) -> None:
        """rcvbuf (set before connecting) keeps the TCP window small, so a client that does
        not read fills the server's queue quickly."""
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(tuple(address))
        except OSError:
            self.sock.close()
            raise
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.splitter = codec.FrameSplitter()
        self.frames: collections.deque[bytes] = collections.deque()
        self.eof = False
        self._rid = 1000
        self.ready = self.recv() if read_ready else None

    # ---- sending ----

    def send(self, body) -> None:
        self.sock.sendall(codec.encode(body))

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_payload(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack("<I", len(payload)) + payload)

    def rid(self) -> int:
        self._rid += 1
        return self._rid

    # ---- receiving ----

    def _fill(self, timeout: float) -> bool:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(1 << 18)
        except socket.timeout:
            return False
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            return False
        self.frames.extend(self.splitter.feed(data))
        return True

    def recv_payload(self, timeout: float | None = None) -> bytes:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while not self.frames:
            left = deadline - time.monotonic()
            if self.eof or left <= 0 or not self._fill(left):
                if self.frames:
                    break
                raise TimeoutError("no frame" + (" (connection closed)" if self.eof else ""))
        return self.frames.popleft()

    def recv(self, timeout: float | None = None):
        return codec.decode(self.recv_payload(timeout)).body

    def recv_until(self, cls, timeout: float | None = None) -> list:
        """Every frame up to and including the first instance of cls."""
        out = []
        while True:
            body = self.recv(timeout)
            out.append(body)
            if isinstance(body, cls):
                return out

    def request(self, body, timeout: float | None = None):
        """Send, then return the first frame echoing its request_id (others are kept in
        `self.other`)."""
        self.send(body)
        rid = body.request_id
        self.other = []
        while True:
            reply = self.recv(timeout)
            if type(reply).FIELDS[:1] == ("request_id",) and reply.request_id == rid:
                return reply
            self.other.append(reply)

    def expect_error(self, body, code: int, timeout: float | None = None):
        reply = self.request(body, timeout)
        assert isinstance(reply, codec.ErrorResponse), reply
        assert reply.code == code, (reply.code, reply.message)
        return reply

    def nothing(self, within: float = 0.3) -> None:
        """Assert that no frame arrives for `within` seconds."""
        try:
            body = self.recv(within)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected frame {body!r}")

    def wait_closed(self, timeout: float = 5.0) -> bool:
        """True once the server closed the connection (frames before EOF are kept)."""
        deadline = time.monotonic() + timeout
        while not self.eof and time.monotonic() < deadline:
            self._fill(max(0.0, deadline - time.monotonic()))
        return self.eof

    def create_session(self, locale: str = "", **kw):
        reply = self.request(codec.CreateSessionRequest(request_id=self.rid(), locale=locale,
                                                        **kw))
        assert isinstance(reply, codec.CreateSessionResponse), reply
        return reply.session_id

    def close(self) -> None:
        self.sock.close()

    def reset(self) -> None:
        """Abrupt disconnect: RST instead of FIN."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
