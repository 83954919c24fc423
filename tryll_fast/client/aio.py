"""AsyncTryllClient: the asyncio client, with the same methods as TryllClient.

    client = await AsyncTryllClient.open("127.0.0.1", 9100)
    await client.create_session(locale="en")
    models = await client.list_models()
    await client.close()

Every request method is a coroutine; `<method>_async(...)` returns an asyncio.Future
without awaiting it. Callbacks run on the event loop. Use it from one event loop only.
"""
from __future__ import annotations

import asyncio
from typing import Any, Iterable, Mapping

from tryll_fast import codec
from tryll_fast.client.agents import AsyncAgent, GraphDescription, create_agent_call
from tryll_fast.client._methods import AsyncMethods
from tryll_fast.client.core import Call, ClientCore, check_ready
from tryll_fast.client.errors import TryllError
from tryll_fast.client.memory import ensure_mutable_kb_call
from tryll_fast.client.memory_handle import AsyncMutableKb
from tryll_fast.client.voice_input import create_voice_input_call
from tryll_fast.client.voice_input_handle import AsyncVoiceInputHandle
from tryll_fast.client.sync import DEFAULT_TIMEOUT_S, RECV_BYTES
from tryll_fast.errors import ErrorCode


class AsyncTryllClient(AsyncMethods, ClientCore):
    def __init__(self, host: str = "127.0.0.1", port: int = 9100, *,
                 timeout: float | None = DEFAULT_TIMEOUT_S) -> None:
        super().__init__()
        self.host = host
        self.port = port
        self.timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    async def open(cls, host: str = "127.0.0.1", port: int = 9100, **kw) -> "AsyncTryllClient":
        client = cls(host, port, **kw)
        await client.connect()
        return client

    async def connect(self) -> "AsyncTryllClient":
        """Open the connection and read ConnectionReady (5004 on a version mismatch)."""
        self._loop = asyncio.get_running_loop()
        try:
            self._reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port), self.timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise TryllError(ErrorCode.ConnectionFailed,
                             f"cannot connect to {self.host}:{self.port}: {exc!r}") from None
        splitter = codec.FrameSplitter()
        first: list[bytes] = []
        try:
            while not first:
                data = await asyncio.wait_for(self._reader.read(RECV_BYTES), self.timeout)
                if not data:
                    raise TryllError(ErrorCode.ConnectionDropped,
                                     "the server closed the connection before ConnectionReady")
                first = splitter.feed(data)
            ready = check_ready(first[0])
        except asyncio.TimeoutError:
            self._writer.close()
            raise TryllError(ErrorCode.Timeout,
                             f"no ConnectionReady within {self.timeout} s") from None
        except BaseException:
            self._writer.close()
            raise
        self.server_mode = ready.mode
        self.server_protocol_version = ready.protocol_version
        self._task = asyncio.create_task(self._read_loop(splitter, first[1:]))
        return self

    async def close(self) -> None:
        self._closed = True
        if self._writer is not None:
            self._writer.close()
            try:
                await self._writer.wait_closed()
            except OSError:
                pass
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    async def __aenter__(self) -> "AsyncTryllClient":
        if self._writer is None:
            await self.connect()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _read_loop(self, splitter, early: list[bytes]) -> None:
        try:
            for payload in early:
                self._handle_payload(payload)
            while True:
                data = await self._reader.read(RECV_BYTES)
                if not data:
                    break
                for payload in splitter.feed(data):
                    self._handle_payload(payload)
        except (codec.FramingError, OSError) as exc:
            self._ended(exc)
            return
        self._ended(None)

    def send_frame(self, frame: bytes) -> None:
        if self._writer is None or self._closed or self._writer.is_closing():
            raise TryllError(ErrorCode.ConnectionDropped, "the client is not connected")
        self._writer.write(frame)

    def start(self, call: Call) -> asyncio.Future:
        future = self._send_call(call)
        out = self._loop.create_future()

        def done(f: asyncio.Future) -> None:
            if out.done():
                return
            if f.cancelled():
                out.cancel()
            elif f.exception() is not None:
                out.set_exception(f.exception())
            else:
                try:
                    out.set_result(call.result(f.result()))
                except BaseException as e:
                    out.set_exception(e)

        future.add_done_callback(done)
        return out

    async def wait(self, call: Call, timeout: float | None = None) -> Any:
        future = self.start(call)
        limit = self.timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(future, limit)
        except asyncio.TimeoutError:
            raise TryllError(ErrorCode.Timeout,
                             f"{call.what}: no reply within {limit} s") from None

    async def create_agent(self, graph: GraphDescription, *,
                           variables: Mapping[str, Any] | None = None,
                           enable_diagnostics: bool = False,
                           maintain_dialogue_history: bool = True, workload: int = 0,
                           kv_cache_initialization: int = 0, voice=None,
                           timeout: float | None = None) -> AsyncAgent:
        agent_id = await self.wait(create_agent_call(
            graph, variables=variables, enable_diagnostics=enable_diagnostics,
            maintain_dialogue_history=maintain_dialogue_history, workload=int(workload),
            kv_cache_initialization=int(kv_cache_initialization), voice=voice), timeout)
        return AsyncAgent(self, agent_id)

    async def ensure_mutable_kb(self, name: str, *, schema_name: str = "",
                          schema_version: int = 0, embedding_model: str = "",
                          metadata_fields: Iterable[str] = (),
                          timeout: float | None = None) -> AsyncMutableKb:
        """Create or reuse the session's mutable knowledge base `name` (docs/knowledge.md):
        reused when the schema (name, version, embedding model, metadata keys) is equal,
        8102 when it differs. embedding_model "" = the catalog's default one."""
        name, created = await self.wait(ensure_mutable_kb_call(
            name, schema_name, schema_version, embedding_model, metadata_fields), timeout)
        return AsyncMutableKb(self, name, created)

    def mutable_kb(self, name: str) -> AsyncMutableKb:
        """A handle on an existing store (after load_game_memory), without a request."""
        return AsyncMutableKb(self, name)

    async def create_voice_input(self, model_name: str = "whisper-tiny.en", *,
                           sample_rate: int = 16000, channels: int = 1,
                           vad_threshold: float = 0.5, vad_min_silence_ms: int = 1000,
                           vad_speech_pad_ms: int = 250, hotwords_storage_path: str = "",
                           hotwords_score: float = 1.5,
                           timeout: float | None = None) -> AsyncVoiceInputHandle:
        """A voice input handle (docs/voice.md): the speech-to-text model by catalog name,
        the format AudioBuffers will carry (16-bit; resampled server-side), VAD settings,
        hotwords (a storage-root .txt, one phrase a line)."""
        vid = await self.wait(create_voice_input_call(
            model_name, int(sample_rate), int(channels), float(vad_threshold),
            int(vad_min_silence_ms), int(vad_speech_pad_ms), hotwords_storage_path,
            float(hotwords_score)), timeout)
        return AsyncVoiceInputHandle(self, vid)

    def _new_future(self):
        return self._loop.create_future()

    def _resolve(self, future, value) -> None:
        if not future.done():
            future.set_result(value)

    def _fail(self, future, exc: BaseException) -> None:
        if not future.done():
            future.set_exception(exc)
