"""TryllClient: the blocking client, with one reader thread per connection.

    with TryllClient("127.0.0.1", 9100) as client:      # connects, checks the version
        client.create_session(locale="en")
        for model in client.list_models():
            print(model.name, model.status)

Every request method blocks until its reply (or raises TryllError); `<method>_async(...)`
returns a concurrent.futures.Future instead. Callbacks (`on`, `on_any`, download progress)
run on the reader thread, so they must not block on a reply: a blocking call made there
raises ReaderThreadError instead of deadlocking; use the `_async` variant.
"""
from __future__ import annotations

import concurrent.futures
import socket
import threading
from typing import Any, Iterable, Mapping

from tryll_fast import codec
from tryll_fast.client.agents import Agent, GraphDescription, create_agent_call
from tryll_fast.client._methods import SyncMethods
from tryll_fast.client.core import Call, ClientCore, check_ready
from tryll_fast.client.errors import ReaderThreadError, TryllError
from tryll_fast.client.memory import ensure_mutable_kb_call
from tryll_fast.client.memory_handle import MutableKb
from tryll_fast.client.voice_input import create_voice_input_call
from tryll_fast.client.voice_input_handle import VoiceInputHandle
from tryll_fast.errors import ErrorCode

DEFAULT_TIMEOUT_S = 30.0
RECV_BYTES = 256 * 1024


class TryllClient(SyncMethods, ClientCore):
    def __init__(self, host: str = "127.0.0.1", port: int = 9100, *,
                 timeout: float | None = DEFAULT_TIMEOUT_S) -> None:
        super().__init__()
        self.host = host
        self.port = port
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._reader: threading.Thread | None = None
        self._send_lock = threading.Lock()

    # ---- connection ----

    def connect(self) -> "TryllClient":
        """Open the socket and read ConnectionReady (5004 on a version mismatch)."""
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
        except OSError as exc:
            raise TryllError(ErrorCode.ConnectionFailed,
                             f"cannot connect to {self.host}:{self.port}: {exc}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        splitter = codec.FrameSplitter()
        try:
            first: list[bytes] = []
            while not first:
                data = sock.recv(RECV_BYTES)
                if not data:
                    raise TryllError(ErrorCode.ConnectionDropped,
                                     "the server closed the connection before ConnectionReady")
                first = splitter.feed(data)
            ready = check_ready(first[0])
        except socket.timeout:
            sock.close()
            raise TryllError(ErrorCode.Timeout,
                             f"no ConnectionReady within {self.timeout} s") from None
        except BaseException:
            sock.close()
            raise
        self.server_mode = ready.mode
        self.server_protocol_version = ready.protocol_version
        sock.settimeout(None)
        self._sock = sock
        self._reader = threading.Thread(target=self._read_loop, args=(splitter, first[1:]),
                                        name=f"tryll-client-{self.port}", daemon=True)
        self._reader.start()
        return self

    def close(self) -> None:
        self._closed = True
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        if self._reader is not None and threading.current_thread() is not self._reader:
            self._reader.join(5)

    def __enter__(self) -> "TryllClient":
        if self._sock is None:
            self.connect()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def connected(self) -> bool:
        return self._sock is not None and not self._closed and (
            self._reader is not None and self._reader.is_alive())

    def _read_loop(self, splitter, early: list[bytes]) -> None:
        sock = self._sock
        try:
            for payload in early:
                self._handle_payload(payload)
            while True:
                data = sock.recv(RECV_BYTES)
                if not data:
                    break
                for payload in splitter.feed(data):
                    self._handle_payload(payload)
        except (codec.FramingError, OSError) as exc:
            self._ended(exc)
            return
        self._ended(None)

    # ---- sending ----

    def send_frame(self, frame: bytes) -> None:
        """Send one encoded frame (thread-safe)."""
        sock = self._sock
        if sock is None or self._closed:
            raise TryllError(ErrorCode.ConnectionDropped, "the client is not connected")
        try:
            with self._send_lock:
                sock.sendall(frame)
        except OSError as exc:
            raise TryllError(ErrorCode.ConnectionDropped, f"send failed: {exc}") from None

    def start(self, call: Call) -> concurrent.futures.Future:
        """Send a Call; its future resolves to the call's result."""
        future = self._send_call(call)
        out: concurrent.futures.Future = concurrent.futures.Future()

        def done(f: concurrent.futures.Future) -> None:
            exc = f.exception()
            if exc is not None:
                out.set_exception(exc)
                return
            try:
                out.set_result(call.result(f.result()))
            except BaseException as e:
                out.set_exception(e)

        future.add_done_callback(done)
        return out

    def _check_thread(self, what: str) -> None:
        if self._reader is not None and threading.current_thread() is self._reader:
            raise ReaderThreadError(
                f"{what}: a blocking call on the client's reader thread (inside a callback) "
                "would wait forever for a reply that thread must read; use the _async "
                "variant")

    def wait(self, call: Call, timeout: float | None = None) -> Any:
        self._check_thread(call.what)
        future = self.start(call)
        limit = self.timeout if timeout is None else timeout
        try:
            return future.result(limit)
        except concurrent.futures.TimeoutError:
            raise TryllError(ErrorCode.Timeout,
                             f"{call.what}: no reply within {limit} s") from None

    # ---- agents ----

    def create_agent(self, graph: GraphDescription, *, variables: Mapping[str, Any] | None = None,
                     enable_diagnostics: bool = False, maintain_dialogue_history: bool = True,
                     workload: int = 0, kv_cache_initialization: int = 0, voice=None,
                     timeout: float | None = None) -> Agent:
        """Create an agent from a graph (agents.GraphDescription); variables: name ->
        initial value (its Python type fixes the variable's type)."""
        agent_id = self.wait(create_agent_call(
            graph, variables=variables, enable_diagnostics=enable_diagnostics,
            maintain_dialogue_history=maintain_dialogue_history, workload=int(workload),
            kv_cache_initialization=int(kv_cache_initialization), voice=voice), timeout)
        return Agent(self, agent_id)

    def ensure_mutable_kb(self, name: str, *, schema_name: str = "",
                          schema_version: int = 0, embedding_model: str = "",
                          metadata_fields: Iterable[str] = (),
                          timeout: float | None = None) -> MutableKb:
        """Create or reuse the session's mutable knowledge base `name` (docs/knowledge.md):
        reused when the schema (name, version, embedding model, metadata keys) is equal,
        8102 when it differs. embedding_model "" = the catalog's default one."""
        name, created = self.wait(ensure_mutable_kb_call(
            name, schema_name, schema_version, embedding_model, metadata_fields), timeout)
        return MutableKb(self, name, created)

    def mutable_kb(self, name: str) -> MutableKb:
        """A handle on an existing store (after load_game_memory), without a request."""
        return MutableKb(self, name)

    # ---- ClientCore futures ----

    def create_voice_input(self, model_name: str = "whisper-tiny.en", *,
                           sample_rate: int = 16000, channels: int = 1,
                           vad_threshold: float = 0.5, vad_min_silence_ms: int = 1000,
                           vad_speech_pad_ms: int = 250, hotwords_storage_path: str = "",
                           hotwords_score: float = 1.5,
                           timeout: float | None = None) -> VoiceInputHandle:
        """A voice input handle (docs/voice.md): the speech-to-text model by catalog name,
        the format AudioBuffers will carry (16-bit; resampled server-side), VAD settings,
        hotwords (a storage-root .txt, one phrase a line)."""
        vid = self.wait(create_voice_input_call(
            model_name, int(sample_rate), int(channels), float(vad_threshold),
            int(vad_min_silence_ms), int(vad_speech_pad_ms), hotwords_storage_path,
            float(hotwords_score)), timeout)
        return VoiceInputHandle(self, vid)

    def _new_future(self):
        return concurrent.futures.Future()

    def _resolve(self, future, value) -> None:
        future.set_result(value)

    def _fail(self, future, exc: BaseException) -> None:
        future.set_exception(exc)
