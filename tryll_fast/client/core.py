"""What the blocking and the asyncio client share: request ids, reply matching, routing.

A request gets a fresh request_id (1..2^32-1, wrapping, never 0) and a pending entry.
Incoming frames whose field 0 is a request_id that is pending settle that entry: the reply
resolves it, ErrorResponse fails it with TryllError, DownloadProgress feeds its progress
callback and DownloadComplete ends it. Every other frame is unsolicited (NodeEvent,
AnswerText, TurnComplete, WireTranscriptUpdate, an ErrorResponse of a failing turn, ...) and
goes to the callbacks registered with `on(MessageType, fn)` (and `on_any`).

Agents sit on top of this: frames carrying an agent_id are routed to that agent's proxy
first (its turn stream, paused, tool-call and speech callbacks), and each proxy serialises
its own SendMessage turns. WireTranscriptUpdate frames go to their voice input's handle.
"""
from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from tryll_fast import PROTOCOL_VERSION, codec
from tryll_fast.client.errors import TryllError
from tryll_fast.errors import ErrorCode

log = logging.getLogger("tryll_fast.client")

_MAX_REQUEST_ID = 0xFFFFFFFFFFFFFFFF     # request_id is a uint64 on the wire
# frames a turn streams under its SendMessageRequest's request_id
_TURN_STREAM = (codec.AnswerText, codec.NodeEvent, codec.TtsAudioFormatFrame,
                codec.TtsAudioFrame, codec.TtsVisemeFrame)


def _not_progress(body) -> bool:
    return not isinstance(body, codec.DownloadProgress)


@dataclass
class Pending:
    future: Any
    what: str
    on_progress: Callable[[Any], None] | None = None
    # which frames for this request_id end it (the others go to on_progress)
    is_final: Callable[[Any], bool] = _not_progress


def check_ready(payload: bytes) -> Any:
    """The server's first frame must be ConnectionReady of our protocol version (5004)."""
    msg = codec.decode(payload)
    body = msg.body
    if not isinstance(body, codec.ConnectionReady):
        raise TryllError(ErrorCode.MalformedMessage,
                         f"expected ConnectionReady first, got {type(body).__name__}")
    if body.protocol_version != PROTOCOL_VERSION:
        raise TryllError(ErrorCode.ProtocolVersionMismatch,
                         f"the server speaks protocol version {body.protocol_version}; this "
                         f"client speaks version {PROTOCOL_VERSION}")
    return body


def session_request(rid: int, locale: str, engines: Iterable[tuple[int, int]],
                    placement_hints: Mapping[str, int] | None):
    config = None
    engines = list(engines)
    if engines or placement_hints:
        config = codec.ModelConfig(
            engines=[codec.EngineHint(role=r, engine=e) for r, e in engines],
            placement_hints=[codec.PlacementHint(model_name=n, placement=p)
                             for n, p in (placement_hints or {}).items()])
    return codec.CreateSessionRequest(request_id=rid, locale=locale, model_config=config)


class ClientCore:
    """Bookkeeping only: no sockets, no threads. Subclasses provide the futures."""

    def __init__(self) -> None:
        self._pending: dict[int, Pending] = {}
        self._pending_lock = threading.Lock()
        self._next_id = 0
        self._callbacks: dict[type, list[Callable[[Any], None]]] = {}
        # agent_id -> callback for that agent's frames without a request_id (AnswerText,
        # NodeEvent): the running turn's stream
        self._agent_frames: dict[int, Callable[[Any], None]] = {}
        # voice_input_id -> its handle's WireTranscriptUpdate callback
        self._voice_inputs: dict[int, Callable[[Any], None]] = {}
        self._any: list[Callable[[Any], None]] = []
        self._dropped: TryllError | None = None   # set once the connection has ended
        self._closed = False                      # close() was called
        self._disconnect: list[Callable[[TryllError], None]] = []
        self.session_id = 0
        self.server_mode = ""
        self.server_protocol_version = 0

    # ---- subclass hooks ----

    def _new_future(self):
        raise NotImplementedError

    def _resolve(self, future, value) -> None:
        raise NotImplementedError

    def _fail(self, future, exc: BaseException) -> None:
        raise NotImplementedError

    # ---- callbacks ----

    def on(self, message_type: type, callback: Callable[[Any], None]) -> Callable[[], None]:
        """Call `callback(body)` for every unsolicited frame of this type (e.g.
        codec.NodeEvent). Returns a function that unregisters it."""
        if message_type not in codec.TABLES:
            raise TypeError(f"{message_type!r} is not a message table of the schema")
        self._callbacks.setdefault(message_type, []).append(callback)
        return lambda: self._callbacks.get(message_type, []).remove(callback)

    def on_any(self, callback: Callable[[Any], None]) -> Callable[[], None]:
        """Call `callback(body)` for every unsolicited frame."""
        self._any.append(callback)
        return lambda: self._any.remove(callback)

    def on_disconnect(self, callback: Callable[[TryllError], None]) -> None:
        """callback(error) once the connection ends (1002), on the reader thread / loop."""
        self._disconnect.append(callback)

    def _ended(self, exc: BaseException | None) -> None:
        """The read loop is over: fail every pending request (1002) and tell the callbacks."""
        if isinstance(exc, codec.FramingError):
            reason = f"the server sent a bad frame: {exc}"
        elif exc is not None:
            reason = "the client closed the connection" if self._closed else str(exc)
        else:
            reason = "the server closed the connection"
        error = TryllError(ErrorCode.ConnectionDropped, f"connection dropped: {reason}")
        self._fail_all(error)
        for callback in self._disconnect:
            try:
                callback(error)
            except Exception:
                log.exception("disconnect callback failed")

    # ---- requests ----

    def _register(self, what: str, on_progress=None, is_final=_not_progress) -> tuple[int, Any]:
        future = self._new_future()
        with self._pending_lock:
            if self._dropped is not None:
                raise TryllError(self._dropped.code, self._dropped.message)
            while True:
                self._next_id = self._next_id % _MAX_REQUEST_ID + 1
                if self._next_id not in self._pending:
                    break
            rid = self._next_id
            self._pending[rid] = Pending(future, what, on_progress, is_final)
        return rid, future

    def send_frame(self, frame: bytes) -> None:
        raise NotImplementedError

    def set_inference_throttle(self, throttle: float) -> None:
        """Fire-and-forget: 0 = full speed ... 1 = yield as much as possible."""
        self.send_frame(codec.encode(codec.SetInferenceThrottle(throttle=float(throttle))))

    def _send_call(self, call: "Call"):
        """Register a request id for the call and send it; the raw reply future."""
        rid, future = self._register(call.what, call.on_progress, call.is_final)
        try:
            self.send_frame(codec.encode(call.build(rid)))
        except BaseException:
            self._forget(rid)
            raise
        return future

    def _forget(self, rid: int) -> None:
        with self._pending_lock:
            self._pending.pop(rid, None)

    def _fail_all(self, exc: TryllError) -> None:
        with self._pending_lock:
            self._dropped = exc
            pending, self._pending = self._pending, {}
        for entry in pending.values():
            self._fail(entry.future, exc)

    # ---- incoming frames ----

    def _handle_payload(self, payload: bytes) -> None:
        try:
            body = codec.decode(payload).body
        except codec.CodecError as exc:
            log.error("undecodable frame from the server: %s", exc)
            return
        if body is None:
            return
        rid = body.request_id if type(body).FIELDS[:1] == ("request_id",) else 0
        if rid:
            with self._pending_lock:
                entry = self._pending.get(rid)
                final = entry is not None and entry.is_final(body)
                if final:
                    del self._pending[rid]
            if entry is not None:
                # a turn's streamed frames carry its request_id: they reach the turn's
                # progress callback, and the unsolicited callbacks as well
                self._settle(entry, body, final)
                if not isinstance(body, _TURN_STREAM):
                    return
                self._unsolicited(body)
                return
        if isinstance(body, _TURN_STREAM):
            route = self._agent_frames.get(body.agent_id)
            if route is not None:
                try:
                    route(body)
                except Exception:
                    log.exception("agent frame callback failed")
        elif isinstance(body, codec.WireTranscriptUpdate):
            route = self._voice_inputs.get(body.voice_input_id)
            if route is not None:
                try:
                    route(body)
                except Exception:
                    log.exception("voice input callback failed")
        self._unsolicited(body)

    def _settle(self, entry: Pending, body, final: bool) -> None:
        if not final:
            if entry.on_progress is not None:
                try:
                    entry.on_progress(body)
                except Exception:
                    log.exception("%s progress callback failed", entry.what)
        elif isinstance(body, codec.ErrorResponse):
            self._fail(entry.future, TryllError(body.code, body.message))
        elif isinstance(body, codec.DownloadComplete) and not body.success:
            self._fail(entry.future, TryllError(body.error_code, body.error))
        else:
            self._resolve(entry.future, body)

    def _unsolicited(self, body) -> None:
        for callback in list(self._callbacks.get(type(body), ())) + list(self._any):
            try:
                callback(body)
            except Exception:
                log.exception("callback for %s failed", type(body).__name__)


@dataclass
class Call:
    """One request: how to build it for a request_id, and what the caller gets back."""
    what: str
    build: Callable[[int], Any]
    result: Callable[[Any], Any] = lambda reply: reply
    on_progress: Callable[[Any], None] | None = None
    is_final: Callable[[Any], bool] = _not_progress


def _none(reply) -> None:
    return None


class Calls:
    """The request methods, described once: tools/gen_client.py writes each out for
    TryllClient (blocking) and AsyncTryllClient (awaited) in _methods.py, with the same
    names and arguments on both."""

    def create_session(self, locale: str = "", engines: Iterable[tuple[int, int]] = (),
                       placement_hints: Mapping[str, int] | None = None) -> Call:
        """Create this connection's session (once). engines: (ModelRole, InferenceEngine) pairs
        the session expects to use; placement_hints: model name -> MemoryPlacement.
        Returns the session id."""
        def result(reply) -> int:
            self.session_id = reply.session_id
            return reply.session_id
        return Call("CreateSessionRequest",
                    lambda rid: session_request(rid, locale, engines, placement_hints), result)

    def set_session_locale(self, locale: str) -> Call:
        """Change the session's BCP-47 locale ("" clears it)."""
        return Call("SetSessionLocaleRequest",
                    lambda rid: codec.SetSessionLocaleRequest(request_id=rid, locale=locale),
                    _none)

    def list_models(self) -> Call:
        """Every non-hidden catalog model (ModelInfo views)."""
        return Call("ListModelsRequest", lambda rid: codec.ListModelsRequest(request_id=rid),
                    lambda reply: list(reply.models))

    def download_model(self, name: str, on_progress: Callable[[Any], None] | None = None
                       ) -> Call:
        """Download a catalog model; on_progress(DownloadProgress) runs on the reader
        thread (the event loop for the asyncio client). Raises TryllError (6xxx) on failure."""
        return Call("DownloadModelRequest",
                    lambda rid: codec.DownloadModelRequest(request_id=rid, model_name=name),
                    _none, on_progress)

    def load_model(self, name: str, placement: int = 0) -> Call:
        """Load and pin a model; returns the LoadModelResponse (what actually happened)."""
        return Call("LoadModelRequest",
                    lambda rid: codec.LoadModelRequest(request_id=rid, model_name=name,
                                                       placement=placement))

    def unload_model(self, name: str) -> Call:
        """Unpin a model this session loaded; returns the Ack's warning ("" normally)."""
        return Call("UnloadModelRequest",
                    lambda rid: codec.UnloadModelRequest(request_id=rid, model_name=name),
                    lambda reply: reply.warning)

    def delete_model(self, name: str) -> Call:
        """Delete a downloaded model's files; returns the Ack's warning."""
        return Call("DeleteModelRequest",
                    lambda rid: codec.DeleteModelRequest(request_id=rid, model_name=name),
                    lambda reply: reply.warning)

    def create_string_storage(self, name: str, strings: Iterable[str] = (),
                              keys: Iterable[str] = (), file_path: str = "",
                              kind: int = 0) -> Call:
        """Pin a named string storage into the session: inline `strings` (with parallel
        `keys` for a Map or Multimap) or a `file_path` under the server's storage root
        (.txt List, .json Map, .mm.json Multimap). kind: StringStorageKind (0 List, 1 Map,
        2 Multimap). Returns the number of entries loaded."""
        return Call("CreateStringStorageRequest",
                    lambda rid: codec.CreateStringStorageRequest(
                        request_id=rid, name=name, kind=kind, strings=list(strings),
                        keys=list(keys), file_path=file_path),
                    lambda reply: reply.entry_count)

    def destroy_string_storage(self, name: str) -> Call:
        """Unpin a string storage (agents that linked it keep their copy)."""
        return Call("DestroyStringStorageRequest",
                    lambda rid: codec.DestroyStringStorageRequest(request_id=rid, name=name),
                    _none)

    def create_embedded_string_storage(self, name: str, config_path: str = "",
                                       strings: Iterable[str] = (),
                                       embedding_model: str = "",
                                       metadata: Iterable[Any] = ()) -> Call:
        """Pin a named embedded string storage (records with embeddings in a vector index):
        a KB `config_path` under the server's storage root, or inline `strings` embedded
        with the catalog `embedding_model`, each with an optional metadata dict (or JSON
        text) in `metadata`. Returns (record_count, embedding_dim)."""
        meta = [m if isinstance(m, str) else json.dumps(m) for m in metadata]
        return Call("CreateEmbeddedStringStorageRequest",
                    lambda rid: codec.CreateEmbeddedStringStorageRequest(
                        request_id=rid, name=name, config_path=config_path,
                        strings=list(strings), embedding_model=embedding_model,
                        metadata_json=meta),
                    lambda reply: (reply.record_count, reply.embedding_dim))

    def destroy_embedded_string_storage(self, name: str) -> Call:
        """Unpin an embedded string storage (agents that linked it keep it)."""
        return Call("DestroyEmbeddedStringStorageRequest",
                    lambda rid: codec.DestroyEmbeddedStringStorageRequest(request_id=rid,
                                                                          name=name),
                    _none)

    def enumerate_mutable_kbs(self) -> Call:
        """The session's mutable knowledge bases: [(name, live record count)]."""
        return Call("EnumerateMutableKbsRequest",
                    lambda rid: codec.EnumerateMutableKbsRequest(request_id=rid),
                    lambda reply: [(s.store_name, s.live_count) for s in reply.stores])

    def import_mutable_kb(self, snapshot: bytes, store_name: str = "") -> Call:
        """Import an exported store (replacing a same-named one); store_name renames it.
        Returns (store_name, record_count, warnings)."""
        return Call("ImportMutableKbRequest",
                    lambda rid: codec.ImportMutableKbRequest(request_id=rid,
                                                            snapshot=bytes(snapshot),
                                                            store_name=store_name),
                    lambda r: (r.store_name, r.record_count, list(r.warnings)))

    def save_game_memory(self, save_id: str) -> Call:
        """Write every mutable KB of the session to the game-memory file `save_id`
        (atomically). Returns how many stores it holds."""
        return Call("SaveGameMemoryRequest",
                    lambda rid: codec.SaveGameMemoryRequest(request_id=rid, save_id=save_id),
                    lambda reply: reply.store_count)

    def load_game_memory(self, save_id: str, lazy: bool = False) -> Call:
        """Replace the session's mutable KBs with the file's. lazy: records are embedded
        when a store is first searched instead of before the reply. Returns (store_count,
        warnings)."""
        timing = codec.EmbedTiming.Lazy if lazy else codec.EmbedTiming.Now
        return Call("LoadGameMemoryRequest",
                    lambda rid: codec.LoadGameMemoryRequest(request_id=rid, save_id=save_id,
                                                            embed_timing=timing),
                    lambda reply: (reply.store_count, list(reply.warnings)))

    def get_memory_consumption(self) -> Call:
        """The server-wide memory snapshot (GetMemoryConsumptionResponse)."""
        return Call("GetMemoryConsumptionRequest",
                    lambda rid: codec.GetMemoryConsumptionRequest(request_id=rid))

    def debug_command(self, command: str, *args: str) -> Call:
        """A development-only command (servers started with --dev); returns its output."""
        return Call("DebugCommandRequest",
                    lambda rid: codec.DebugCommandRequest(request_id=rid, command=command,
                                                          args=[str(a) for a in args]),
                    lambda reply: reply.output)

