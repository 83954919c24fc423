"""One pipeline connection (WebSocket or Socket.IO): the Connection its Session sends frames
to, and the element logic around one agent (docs/pipeline.md).

The gateway does not run turns itself. Each connection is a client of the server's own
Session, on the gateway's loop thread as the reactor's connections are on the reactor
thread: it creates a session and an agent from its pipeline agent's spec, and starts turns
with SendMessageRequest, all as frames through `Session.frame_received`, so the same
handlers, admission rules, engine and voice serve both front doors. What the session sends
back (from the engines' threads, the orchestrator, the workers) arrives through `send()`
as frames, which this class turns into output elements.

Threads: `send()` (and the voice's `speech_sentence()` hook) may be called from any thread;
they only append to one queue (gateway/_outbox.pyx, compiled: a streamed turn calls send()
per token), in call order, and wake the pump. Everything else runs on
the gateway loop: the pump decodes the frames, keeps the turn state, encodes elements in
the connection's output format and writes them to the channel. So elements leave in the
order their frames were sent, and one thread owns the state.

Backpressure as on the reactor: at `transport.send_queue_high_bytes` queued the connection
is paused (the engine leaves this agent out of its steps, the voice holds its next
sentence); below the low mark it resumes. A connection paused for
`transport.stall_timeout_ms` is closed (the gateway's watchdog calls `stalled()`).

Raw audio goes to a voice input of the session, made on the first audio (the agent's
`listen` table names the model): AudioBuffers, utterances opened and ended as the commit
mode says, and the transcript updates turned into transcript elements and turns; the
player's voice over a speaking agent is a barge-in (docs/pipeline.md, "Audio in").
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import itertools
import json
import logging
import time
from typing import Any

from tryll_fast import codec
from tryll_fast.gateway._outbox import Outbox
from tryll_fast.errors import ErrorCode
from tryll_fast.gateway import elements as el
from tryll_fast.gateway.audio import audio_format, mulaw_to_pcm16
from tryll_fast.gateway.config import SENSORY_VARIABLES
from tryll_fast.gateway.params import ConnectionParams
from tryll_fast.server.logs import fields

log = logging.getLogger("tryll_fast.gateway")

MAX_PENDING_TURNS = 8           # commits and actions waiting behind the running turn
MAX_INPUT_CHARS = 65536         # text accumulated for the next turn
MAX_HELD_AUDIO = 2 << 20        # audio bytes held while the voice input is made or finishing
# What an element made here (an error, a command) counts toward the pause: a client that
# floods bad input and reads nothing fills its queue with errors, and must pause and stall.
LOCAL_ELEMENT_BYTES = 256
# Text frames of one turn already queued behind each other go out as one token element, up
# to this many characters: a client that reads slower than the agent streams gets fewer,
# larger messages instead of falling further behind; one that keeps up gets every token.
MAX_COALESCED_CHARS = 16384
_ids = itertools.count(1)
_CLOSE = "close"                # a queue item: (_CLOSE, code, reason)
_SPEECH = "speech"              # a queue item: (_SPEECH, text, n_samples, voice)
_END = "end"                    # in the held audio: a push-to-talk commit
_TURN_ERRORS = (ErrorCode.InferenceFailed, ErrorCode.InferenceTimeout)  # then TurnComplete


_SOURCES = ((2000, "Server"), (3000, "Agent"), (4000, "LanguageModel"),
            (4100, "SpeechRecognition"), (4200, "Server"), (5000, "Protocol"), (6000, "Models"),
            (7000, "Knowledge"))


def error_source(code: int) -> str:
    """The component an ErrorResponse code comes from (the error element's `source`): the
    last family whose first code is at most `code`."""
    source = "Server"
    for first, name in _SOURCES:
        if code >= first:
            source = name
    return source


def error_type(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"Error{code}"


class _Turn:
    __slots__ = ("request_id", "turn_id", "text", "mapper", "interrupted")

    def __init__(self, request_id: int, text: str, mapper) -> None:
        self.request_id = request_id
        self.turn_id = str(request_id)
        self.text = text
        self.mapper = mapper
        self.interrupted = False        # barged in: cancelled, its audio no longer sent


class PipelineConnection:
    """See the module docstring. `channel` sends strings / bytes to the client and closes
    (gateway/app.py has the WebSocket and Socket.IO ones). The Connection surface it offers
    the session: id, peer, send(), paused, queued_bytes, closing, close(), and
    wait_writable(), which the dev-mode debug streams use."""

    def __init__(self, gateway, channel, params: ConnectionParams, peer: str) -> None:
        self.gateway = gateway
        self.server = gateway.server
        self.loop = gateway.loop
        self.channel = channel
        self.params = params
        self.agent_spec = params.agent
        self.id = f"{channel.kind}-{next(_ids)}"
        self.peer = peer
        cfg = self.server.config
        # ---- the Connection surface (any thread) ----
        self.closed = False
        self._closing = False
        self._outbox = Outbox(cfg.transport_send_queue_high_bytes,
                              cfg.transport_send_queue_low_bytes, self._wake_pump)
        # the session's send() goes straight into the compiled queue
        self.send = self._outbox.send
        self.wait_writable = self._outbox.wait_writable
        self._wake = None                # asyncio.Event, made on the loop
        self._pump_task = None
        # ---- loop state ----
        self.session = None
        self.session_id: str | None = None
        self.agent_id = 0
        self._rids = itertools.count(1)
        self._requests: dict[int, Any] = {}      # request_id -> "session" | "agent" | ...
        self._input: list[str] = []
        self._input_chars = 0
        self._pending: collections.deque[_Turn] = collections.deque()
        self._turn: _Turn | None = None
        self._sensory: dict[str, str] = {}       # variable -> value, not yet applied
        self._lost = False
        self._close_reason = ""                  # why this side closed the channel
        # speech of the running turn
        self._sample_rate = 0
        self._sentence_left = 0                  # samples of the sentence still to come
        self._sentence_base = -1                 # its first sample's offset in the turn
        self._held: el.Element | None = None     # a sentence's last item, awaiting visemes
        self._speaking_turn: str | None = None   # the last turn that sent audio
        self._speaking_until = 0.0               # when the client will have played it
        # raw audio in: the voice input and its utterance
        self._vid = 0
        self._audio_format: tuple[int, int] | None = None    # (rate, channels), first audio
        self._utterance = "none"     # none | creating | idle | open | ending | failed
        self._held_audio: collections.deque = collections.deque()   # bytes and _END
        self._held_audio_bytes = 0
        self._commit_after_utterance = False
        self._audio_refused = False              # the one error for unusable audio is sent

    # ---- the Connection surface the Session, the engines and the voice use ----

    @property
    def closing(self) -> bool:
        return self._closing or self.closed

    @property
    def queued_bytes(self) -> int:
        return self._outbox.queued

    @property
    def paused(self) -> bool:
        """At the high mark until drained to the low one (the engine's gate reads it)."""
        return self._outbox.paused

    @property
    def paused_at(self) -> float:
        """Monotonic time of the last pause (the gateway's stall watchdog)."""
        return self._outbox.paused_at

    # send(frame) and wait_writable(timeout) are the Outbox's own (set in __init__): a frame
    # from the session (any thread), queued for the pump in call order; a producer thread
    # waiting while the connection is paused.

    def speech_sentence(self, text: str, n_samples: int, voice: str) -> None:
        """The voice's hook (workflow/speech.py): a sentence is about to be sent, `n_samples`
        long; `voice` names what besides the text decides its audio."""
        if not (self.closed or self._closing):
            self._put((_SPEECH, text, n_samples, voice), 0)

    def close(self) -> None:
        """Graceful close (any thread; the server's shutdown): `exit`, then the channel
        closes once what is queued is written."""
        if self._closing or self.closed:
            return
        self._closing = True
        self._outbox.shut = True             # the session's frames stop here
        self.loop.call_soon_threadsafe(self._close_with_exit)

    def _put(self, item, nbytes: int) -> None:
        """An item of the connection's own, queued even while closing (the goodbye)."""
        if not self._lost:
            self._outbox.put(item, nbytes, True)

    def _wake_pump(self) -> None:
        if self.gateway.in_loop():
            self._wake.set()
        else:
            self.loop.call_soon_threadsafe(self._wake.set)

    # ---- lifecycle (loop) ----

    def start(self) -> None:
        self._wake = asyncio.Event()
        self._pump_task = asyncio.get_running_loop().create_task(self._pump())
        self.session = self.server.connection_made(self)     # queues ConnectionReady
        self._dispatch(lambda rid: codec.CreateSessionRequest(
            request_id=rid, game_name="pipeline", locale=self.gateway.config.locale),
            "session")
        self.session_id = str(self.session.id) if self.session.id else None
        self._dispatch(self.agent_spec.create_request, "agent")
        log.info("pipeline connection", extra=fields(
            connection=self.id, peer=self.peer, session=self.session.id,
            agent=self.agent_spec.name, input=self.params.input_format,
            output=self.params.output_format, protocol=self.params.protocol_version))

    def lost(self, reason: str) -> None:
        """The channel is gone (loop): the session tears down its agent and turn."""
        if self._lost:
            return
        self._lost = True
        self.closed = True
        self._outbox.shut = True
        self._outbox.clear()
        if self._pump_task is not None:
            self._pump_task.cancel()
        if self.session is not None:
            self.session.connection_lost(self._close_reason or reason)
        self.gateway.connection_closed(self)

    def stalled(self, seconds: float) -> None:
        """Paused longer than the stall limit (loop): the client stopped reading. Nothing
        more can reach it, so the channel is aborted, not closed politely."""
        if self._lost:
            return
        log.warning("closing a stalled pipeline connection", extra=fields(
            connection=self.id, session=self.session.id if self.session else 0,
            paused_s=round(seconds, 1), queued_bytes=self._outbox.queued))
        self._close_reason = (f"stalled: paused {seconds:.1f} s with {self._outbox.queued} "
                              "bytes queued")
        self.channel.abort()
        self.lost(self._close_reason)

    def _close_with_exit(self) -> None:
        self._emit_local(self._out("command", None, name="exit", parameters={}))
        self._put((_CLOSE, 1001, "the server is shutting down"), 0)

    def fail(self, code: int, reason: str) -> None:
        """Close after what is queued (loop); the error element is already queued."""
        if self._closing:
            return
        self._closing = True
        self._outbox.shut = True
        self._put((_CLOSE, code, reason), 0)

    # ---- input (loop) ----

    def received(self, data: str | bytes, binary: bool = False) -> None:
        """One WebSocket frame / Socket.IO event from the client."""
        if self.closed or self._closing:
            return
        fmt = self.params.input_format
        try:
            if binary and fmt != el.MSGPACK:
                element = el.Element("binary", {"bytes": bytes(data)})   # raw audio
            else:
                element = el.decode_input(data, fmt)
        except el.ElementError as exc:
            self.error("Socket", exc.kind, exc.message)
            return
        handler = getattr(self, "_on_" + element.type.replace("-", "_"))
        handler(element.fields)

    def _on_token(self, f: dict) -> None:
        text = f["text"]
        if text.startswith("#"):
            self._trigger(text)
        elif self.params.commit_mode == "token":
            if text.strip():
                self._queue_turn(text)
        else:
            self._add_input(text)

    def _on_transcript(self, f: dict) -> None:
        if f["text"].strip():
            self._barge_in()         # the player speaks over the agent
        if f.get("isInterim"):
            return                   # what the player is saying so far: not input yet
        self._final_transcript(f["text"])

    def _final_transcript(self, text: str) -> None:
        text = el.with_sentence_separator(text)
        if not text:
            return
        if self._input and not self._input[-1][-1:].isspace():
            text = " " + text
        self._add_input(text)
        if self.params.commit_mode != "manual":
            self._commit()

    def _on_commit(self, f: dict) -> None:
        if self.params.commit_mode == "manual" and self._utterance not in ("none", "failed"):
            # push to talk: the turn waits for the utterance's last words
            self._held_audio.append(_END)
            self._release_audio()
            return
        self._commit()

    def _on_action(self, f: dict) -> None:
        if f["name"] == "debug" and not f.get("text"):
            self._debug(f.get("parameters") or {})
            return
        text = f.get("text") or ""
        if text:
            self._queue_turn(text)
            return
        params = {str(k): el.text_value(v) for k, v in (f.get("parameters") or {}).items()}
        name = f["name"].lstrip("#")
        self._trigger("#" + name + (":" + el.format_params(params) if params else ""))

    def _debug(self, params: dict) -> None:
        """The action `debug` {command, args}: a DebugCommand on this connection's session
        (served by a server started with --dev only; its answer is the command `debug`,
        a debug stream's frames are token elements). For benchmarks and diagnosis."""
        command, args = params.get("command"), params.get("args") or []
        if not isinstance(command, str) or not isinstance(args, list):
            self.error("Socket", "InvalidField", "action debug: parameters.command is a "
                                                 "string and parameters.args a list")
            return
        self._dispatch(lambda rid: codec.DebugCommandRequest(
            request_id=rid, command=command, args=[el.text_value(a) for a in args]), "debug")

    def _on_sensory(self, f: dict) -> None:
        for key, variable in SENSORY_VARIABLES.items():
            if key in f:
                value = f[key]
                self._sensory[variable] = value if isinstance(value, str) else (
                    el.text_value(value))
        if self._turn is None and self.agent_id:
            self._apply_sensory()

    def _on_binary(self, f: dict) -> None:
        content_type = (f.get("contentType") or "audio/raw").lower()
        if content_type.startswith("image/"):
            self.error("Pipeline", "UnsupportedInput",
                       f"binary {content_type}: agent {self.agent_spec.name}'s model cannot "
                       "take images (its language models read text only)")
        elif content_type.startswith("audio/"):
            self._audio(f["bytes"], content_type)
        else:
            self.error("Pipeline", "UnsupportedInput",
                       f"binary {content_type}: the pipeline takes raw audio (audio/raw, "
                       "audio/pcm, audio/basic) or images (image/*)")

    def _on_url(self, f: dict) -> None:
        self.error("Pipeline", "UnsupportedInput",
                   f"url {f['url'][:200]!r}: a URL input is an image for a realtime model "
                   f"that takes images; agent {self.agent_spec.name}'s model cannot take "
                   "images")

    # ---- raw audio in (loop) ----

    def _audio(self, data: bytes, content_type: str) -> None:
        listen = self.agent_spec.listen
        if listen is None:
            self._refuse_audio(f"agent {self.agent_spec.name} does not listen: its pipeline "
                               "config has no `listen` table (a speech-to-text model); send "
                               "transcript elements or text tokens")
            return
        if self._utterance == "failed":
            return                   # its error was sent once
        try:
            encoding, rate, channels = audio_format(content_type,
                                                    self.params.audio_sample_rate)
        except el.ElementError as exc:
            self.error("Pipeline", exc.kind, exc.message)
            return
        if self._audio_format is None:
            self._audio_format = (rate, channels)
            self._utterance = "creating"
            self._dispatch(lambda rid: listen.create_request(rid, rate, channels),
                           "voice_input")
        elif self._audio_format != (rate, channels):
            have = self._audio_format
            self.error("Pipeline", "UnsupportedInput",
                       f"binary {content_type}: {rate} Hz, {channels} channel(s); this "
                       f"connection's audio is {have[0]} Hz, {have[1]} channel(s), set by its "
                       "first audio: one format per connection")
            return
        if encoding == "mulaw":
            data = mulaw_to_pcm16(data)
        if not data:
            return
        if self._held_audio_bytes + len(data) > MAX_HELD_AUDIO:
            self._refuse_audio(f"more than {MAX_HELD_AUDIO} bytes of audio arrived while the "
                               "voice input was being made or an utterance was finishing; "
                               "audio is dropped until it catches up")
            return
        self._held_audio.append(data)
        self._held_audio_bytes += len(data)
        self._release_audio()

    def _refuse_audio(self, message: str) -> None:
        """Audio that cannot be heard: one error, then it is dropped without another (a
        microphone sends fifty buffers a second)."""
        if not self._audio_refused:
            self._audio_refused = True
            self.error("Pipeline", "UnsupportedInput", message)

    def _release_audio(self) -> None:
        """Feed the held audio and push-to-talk ends, in order, while the voice input can
        take them: an utterance opens at the first audio and stays open (the VAD closes
        segments), except that a push-to-talk commit ends it and waits for its final."""
        held = self._held_audio
        while held and self._utterance in ("idle", "open"):
            item = held.popleft()
            if item is _END:
                if self._utterance == "open":
                    self._utterance = "ending"
                    self._commit_after_utterance = True
                    self._dispatch(lambda rid: codec.EndUtteranceRequest(
                        request_id=rid, voice_input_id=self._vid), "utterance")
                else:
                    self._commit()
                continue
            self._held_audio_bytes -= len(item)
            if self._utterance == "idle":
                self._utterance = "open"
                self._audio_refused = False
                self._dispatch(lambda rid: codec.BeginUtteranceRequest(
                    request_id=rid, voice_input_id=self._vid, auto_finish_on_silence=False,
                    max_utterance_ms=self.agent_spec.listen.max_utterance_ms), "utterance")
            self.session.frame_received(codec.encode(codec.AudioBuffer(
                voice_input_id=self._vid, pcm=item))[4:])

    def _voice_input_failed(self) -> None:
        self._utterance = "failed"
        ends = sum(1 for item in self._held_audio if item is _END)
        self._held_audio.clear()
        self._held_audio_bytes = 0
        if ends and self._input:
            self._commit()           # what was typed still makes its turn

    def _transcript_update(self, body) -> el.Element | None:
        kind = body.kind
        text = body.text
        turn_id = self._turn_id()
        if kind == _SPEECH_START:
            self._barge_in()
            return None
        if kind == _UTTERANCE_FINAL:
            self._utterance = "idle"
            if self._commit_after_utterance:
                self._commit_after_utterance = False
                self._commit()
            self._release_audio()
            return None
        if not text.strip():
            return None              # a heartbeat, or a segment that was only noise
        interim = kind == _PARTIAL
        if interim and self.params.protocol_version == 1:
            self._emit_local(self._out("command", turn_id, name="transcript",
                                       parameters={"text": text, "isInterim": True}))
        element = self._out("transcript", turn_id, text=text, isInterim=interim,
                            isSynthetic=False, isAsynchronous=False,
                            provider=self.agent_spec.listen.model_name)
        if interim:
            return element
        self._emit_local(element)
        self._final_transcript(text)
        return None

    def _barge_in(self) -> None:
        """The player speaks over the agent: the running turn is cancelled (what it said
        stays in the dialog) and sends no more audio, and the client is told to stop
        playing it (`bargeIn`). A turn that is over but whose audio the client is still
        playing, by the clock, gets the command alone."""
        if not self.params.barge_in:
            return
        turn = self._turn
        if turn is not None and not turn.interrupted:
            turn.interrupted = True
            self._held = None
            self._sentence_left = 0
            target = turn.turn_id
            self._dispatch(lambda rid: codec.CancelRequest(
                request_id=rid, agent_id=self.agent_id, mode=codec.CancelMode.StopAndKeep),
                "cancel")
        elif self._speaking_turn is not None and time.monotonic() < self._speaking_until:
            target = self._speaking_turn
        else:
            return
        self._speaking_turn, self._speaking_until = None, 0.0
        self._emit_local(self._out("command", target, name="bargeIn",
                                   parameters={"turnId": target}))

    def _add_input(self, text: str) -> None:
        if self._input_chars + len(text) > MAX_INPUT_CHARS:
            self.error("Pipeline", "InputTooLong",
                       f"the input of the next turn would exceed {MAX_INPUT_CHARS} characters; "
                       "this text was dropped: send #commit first")
            return
        self._input.append(text)
        self._input_chars += len(text)

    def _commit(self) -> None:
        text = "".join(self._input).strip()
        self._input.clear()
        self._input_chars = 0
        if not text:
            self.error("Pipeline", "EmptyInput", "commit with no input: no token or final "
                                                 "transcript arrived since the last turn")
            return
        self._queue_turn(text)

    def _trigger(self, text: str) -> None:
        mapper, params, key = self.gateway.config.resolve(self.agent_spec, text)
        if mapper is None:
            known = sorted(set(self.agent_spec.actions) | set(self.gateway.config.actions))
            self.error("Pipeline", "UnknownAction",
                       f"{text[:200]!r}: no action mapper for #{key} (agent "
                       f"{self.agent_spec.name} and the project map: "
                       f"{', '.join('#' + k for k in known) or 'nothing'})")
            return
        self._queue_turn(mapper.wording(params), mapper)

    # ---- turns (loop) ----

    def _queue_turn(self, text: str, mapper=None) -> None:
        if len(self._pending) >= MAX_PENDING_TURNS:
            self.error("Pipeline", "TooManyPendingTurns",
                       f"{MAX_PENDING_TURNS} turns already wait behind the running one; this "
                       "input was dropped")
            return
        self._pending.append(_Turn(next(self._rids), text, mapper))
        self._next_turn()

    def _next_turn(self) -> None:
        if self._turn is not None or not self.agent_id or not self._pending or self._closing:
            return
        turn = self._turn = self._pending.popleft()
        self._apply_sensory()
        if turn.mapper is not None and turn.mapper.interaction is not None:
            self._emit_local(self._out("multimodal-interaction", turn.turn_id,
                                       interaction=turn.mapper.interaction))
        self._requests[turn.request_id] = turn
        self.session.frame_received(codec.encode(codec.SendMessageRequest(
            request_id=turn.request_id, agent_id=self.agent_id, text=turn.text))[4:])

    def _flush_held(self) -> None:
        if self._held is not None:
            self._emit_local(self._held)
            self._held = None

    def _turn_over(self, turn: _Turn) -> None:
        self._requests.pop(turn.request_id, None)
        self._flush_held()
        self._sentence_left, self._sentence_base, self._sample_rate = 0, -1, 0
        if self._turn is turn:
            self._turn = None
        self._next_turn()

    def _apply_sensory(self) -> None:
        if not self._sensory or not self.agent_id:
            return
        updates = [codec.VariableUpdate(name=n, op=codec.VariableOp.Assign,
                                        value=codec.VarString(value=v))
                   for n, v in self._sensory.items()]
        self._sensory = {}
        self._dispatch(lambda rid: codec.UpdateAgentVariablesRequest(
            request_id=rid, agent_id=self.agent_id, updates=updates), "variables")

    def _dispatch(self, make, purpose) -> None:
        rid = next(self._rids)
        self._requests[rid] = purpose
        self.session.frame_received(codec.encode(make(rid))[4:])

    # ---- output (loop) ----

    def _out(self, kind: str, turn_id: str | None, **own: Any) -> el.Element:
        return el.output(kind, self.session_id, turn_id, **own)

    def error(self, source: str, kind: str, message: str, description: str = "",
              recoverable: bool = True, turn_id: str | None = None) -> None:
        self._emit_local(self._out("error", turn_id, source=source, type=kind, message=message,
                                   description=description or _DESCRIPTIONS.get(kind, ""),
                                   isRecoverable=recoverable))

    def _emit_local(self, element: el.Element) -> None:
        """An element made on the loop, queued behind the frames already queued."""
        self._put(element, LOCAL_ELEMENT_BYTES)

    async def _pump(self) -> None:
        fmt, version = self.params.output_format, self.params.protocol_version
        channel = self.channel
        outbox = self._outbox
        while True:
            await self._wake.wait()
            self._wake.clear()
            outbox.woken()
            while True:
                item = outbox.take()
                if item is None:
                    break
                if type(item) is tuple and item[0] == _CLOSE:
                    self._close_reason = item[2]
                    await channel.close(item[1], item[2])
                    return
                try:
                    out = self._element(item)
                    if out is None:
                        continue
                    data = el.encode(out, fmt, version)
                except Exception as exc:         # a bug: reported, the connection carries on
                    log.exception("pipeline connection %s: output failed", self.id)
                    data = el.encode(self._out(
                        "error", None, source="Pipeline", type="InternalError",
                        message=f"internal error while sending an element: {exc!r}",
                        description="A bug, logged by the server.", isRecoverable=True),
                        fmt, version)
                try:
                    await channel.send(data)
                except Exception as exc:         # the peer went away mid-write
                    self.lost(f"write failed: {exc}")
                    return

    def _element(self, item) -> el.Element | None:
        """A queue item -> the element to send (None: nothing for the client)."""
        if type(item) is bytes:
            self._released(len(item))
            return self._translate(item)
        if type(item) is el.Element:
            self._released(LOCAL_ELEMENT_BYTES)
            return item
        return self._sentence(*item[1:])                 # (_SPEECH, …)

    def _released(self, nbytes: int) -> None:
        if self._outbox.release(nbytes) and self.session is not None:
            self.session.writing_resumed()

    def _translate(self, frame: bytes) -> el.Element | None:
        """One frame from the session -> the element it becomes (None: nothing to show)."""
        answer = codec.answer_text_of(frame)     # the common case, read without a view
        if answer is not None:
            request_id, text = answer
            if not text:
                return None
            if type(self._outbox.head()) is bytes:
                text, resumed = self._outbox.take_text_run(request_id, text,
                                                           MAX_COALESCED_CHARS)
                if resumed and self.session is not None:
                    self.session.writing_resumed()
            return self._out("token", str(request_id), text=text)
        body = codec.decode_frame(frame).body
        kind = type(body)
        if kind is codec.TtsAudioFrame:
            return None if self._interrupted() else self._speech_item(body)
        if kind is codec.TtsVisemeFrame:
            return None if self._interrupted() else self._visemes(body)
        if kind is codec.WireTranscriptUpdate:
            return self._transcript_update(body)
        if kind is codec.CreateVoiceInputResponse:
            self._requests.pop(body.request_id, None)
            self._vid = body.voice_input_id
            self._utterance = "idle"
            self._release_audio()
            return None
        if kind is codec.TtsAudioFormatFrame:
            self._sample_rate = body.format.sample_rate
            return None
        if kind is codec.TurnComplete:
            return self._turn_complete(body)
        if kind is codec.ErrorResponse:
            return self._error_response(body)
        if kind is codec.NodeEvent:
            return self._node_event(body)
        if kind is codec.CreateAgentResponse:
            self._requests.pop(body.request_id, None)
            self.agent_id = body.agent_id
            self._emit_local(self._out("command", None, name="ready",
                                       parameters={"agent": self.agent_spec.name}))
            self._apply_sensory()
            self._next_turn()           # input that arrived while the agent was being built
            return None
        if kind is codec.DebugCommandResponse:
            self._requests.pop(body.request_id, None)
            return self._out("command", None, name="debug", parameters={"output": body.output})
        if kind is codec.Ack or kind is codec.CreateSessionResponse:
            self._requests.pop(body.request_id, None)
        return None                # ConnectionReady and the rest: nothing for the client

    def _turn_complete(self, body) -> el.Element | None:
        turn = self._requests.get(body.request_id)
        if not isinstance(turn, _Turn):
            return None
        status = codec.TurnStatus(body.status).name if body.status in _STATUSES else \
            str(body.status)
        self._flush_held()                 # the last sentence's item, before the end
        parameters = {"status": status, "tokensGenerated": body.tokens_generated}
        if body.debug_info:              # the agent's enable_diagnostics: the turn's timings
            try:
                parameters["diagnostics"] = json.loads(body.debug_info)
            except ValueError:
                parameters["diagnostics"] = body.debug_info
        self._emit_local(self._out("command", turn.turn_id, name="turnComplete",
                                   parameters=parameters))
        if turn.mapper is not None and turn.mapper.end_session:
            self._emit_local(self._out("command", turn.turn_id, name="sessionShouldEnd",
                                       parameters={"action": turn.mapper.key}))
        self._turn_over(turn)
        return None

    def _error_response(self, body) -> el.Element | None:
        purpose = self._requests.get(body.request_id)
        code = int(body.code)
        source, kind = error_source(code), error_type(code)
        description = f"Tryll error {code} ({kind}); docs/errors.md lists every code"
        if purpose == "cancel":        # a barge-in's cancel: the turn had already ended
            self._requests.pop(body.request_id, None)
            return None
        if purpose == "voice_input":
            self._requests.pop(body.request_id, None)
            self._voice_input_failed()
            self.error(source, kind, f"agent {self.agent_spec.name} cannot listen: {body.message}"
                       "; its audio is dropped (text and transcript elements still work)",
                       description)
            return None
        if purpose == "agent":
            self._requests.pop(body.request_id, None)
            self.error(source, kind, f"agent {self.agent_spec.name} could not be created: "
                                     f"{body.message}", description, recoverable=False)
            self.fail(1011, "the agent could not be created")
            return None
        if isinstance(purpose, _Turn):
            if code not in _TURN_ERRORS:     # refused: no turn ran, no TurnComplete follows
                self.error(source, kind, body.message, description, turn_id=purpose.turn_id)
                self._turn_over(purpose)
                return None
            return self._out("error", purpose.turn_id, source=source, type=kind,
                             message=body.message, description=description,
                             isRecoverable=True)
        self._requests.pop(body.request_id, None)
        return self._out("error", None, source=source, type=kind, message=body.message,
                         description=description, isRecoverable=True)

    def _node_event(self, body) -> el.Element | None:
        if body.event_type == "attributes_classified":
            return self._visual_state(body)
        if body.event_type != "tool_call":
            return None
        pairs = {p.key: p.value for p in body.kv_pairs}
        try:
            arguments = json.loads(pairs.get("arguments_json") or "{}")
        except ValueError:
            arguments = {"arguments": pairs.get("arguments_json", "")}
        if not isinstance(arguments, dict):
            arguments = {"arguments": arguments}
        name = pairs.get("tool_name", "")
        kind = self.agent_spec.tool_elements.get(name, "command")
        turn_id = str(body.request_id)
        if kind == "navigation-specification":
            return self._out(kind, turn_id, specification={"name": name,
                                                           "parameters": arguments})
        if kind == "multimodal-interaction":
            return self._out(kind, turn_id, interaction={"name": name, "parameters": arguments})
        return self._out("command", turn_id, name=name, parameters=arguments)

    def _visual_state(self, body) -> el.Element | None:
        """A ClassifyAttributesLLM node's result (its notify_client on) as what the client
        renders: the attributes the agent's `visual_state` names as emotions and reflective
        states, the rest as signals; unresolved ones (empty) are left out."""
        spec = self.agent_spec.visual_state
        if spec is None:
            return None
        values = {p.key: p.value for p in body.kv_pairs
                  if not p.key.endswith(".probability") and p.value}
        return self._out("visual-state", str(body.request_id), state={
            "emotions": [values[n] for n in spec.emotions if n in values],
            "reflectiveStates": [values[n] for n in spec.reflective_states if n in values],
            "signals": {k: v for k, v in values.items()
                        if k not in spec.emotions and k not in spec.reflective_states}})

    # ---- speech (loop) ----

    def _interrupted(self) -> bool:
        return self._turn is not None and self._turn.interrupted

    def _sentence(self, text: str, n_samples: int, voice: str) -> el.Element | None:
        if self._interrupted():
            return None
        self._flush_held()                # the previous sentence's visemes never came
        self._sentence_left = n_samples
        self._sentence_base = -1
        digest = hashlib.blake2b(f"{voice}\n{text}".encode(), digest_size=8).hexdigest()
        return self._out("speech", self._turn_id(), hash=digest, text=text)

    def _speech_item(self, body) -> el.Element | None:
        pcm = bytes(body.pcm)
        if self._sentence_base < 0:
            self._sentence_base = body.sample_offset
        self._sentence_left -= len(pcm) // 2
        last = self._sentence_left <= 0
        if self._sample_rate:
            now = time.monotonic()
            self._speaking_turn = str(body.request_id)
            self._speaking_until = (max(now, self._speaking_until)
                                    + len(pcm) / 2 / self._sample_rate)
        item = self._out("speech-item", str(body.request_id), item={
            "provider": self.agent_spec.voice_model, "sampleRate": self._sample_rate,
            "frameRate": 0, "isLast": last, "bytes": pcm, "isRawAudio": True,
            "created": el.now_ms(), "visemes": [], "blendShapeWeights": []})
        if last and self.agent_spec.emits_visemes:
            self._held = item              # its sentence's viseme cues follow at once
            return None
        return item

    def _visemes(self, body) -> el.Element | None:
        held, self._held = self._held, None
        if held is None:
            return None
        base = self._sentence_base if self._sentence_base >= 0 else 0
        held.fields["item"]["visemes"] = [
            {"sampleOffset": c.sample_offset - base, "viseme": _VISEMES.get(c.viseme, "")}
            for c in body.visemes]
        return held

    def _turn_id(self) -> str | None:
        return self._turn.turn_id if self._turn is not None else None


_STATUSES = {int(s) for s in codec.TurnStatus}
_SPEECH_START = codec.TranscriptUpdateKind.SpeechStart
_PARTIAL = codec.TranscriptUpdateKind.Partial
_UTTERANCE_FINAL = codec.TranscriptUpdateKind.UtteranceFinal
_VISEMES = {int(v): v.name for v in codec.Viseme}
_DESCRIPTIONS = {
    "MalformedElement": "The message could not be read as an element in this connection's "
                        "inputFormat; the connection stays open.",
    "UnknownElementType": "The element's type is not one the pipeline knows.",
    "NotAnInputElement": "The element type is one the pipeline sends, not one it receives.",
    "InvalidField": "A field of the element is missing or has the wrong type.",
    "UnsupportedInput": "This input is understood but not supported by this server yet.",
    "UnknownAction": "A token starting with '#' is an action trigger; no mapper of the agent "
                     "or the project maps this one (pipeline config, [actions]).",
    "EmptyInput": "A turn needs text: tokens or a final transcript before the commit.",
    "TooManyPendingTurns": "Turns run one at a time per connection.",
    "InputTooLong": "The text accumulated for one turn has a limit.",
    "InvalidConnectionParameter": "A connection parameter has a value the pipeline does not "
                                  "accept; the connection closes.",
}
