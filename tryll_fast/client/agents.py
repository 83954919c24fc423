"""Agents on the client: the graph builder, variable values, turn streams, agent proxies.

    graph = (GraphDescription()
             .add_node("answer", GenerateParams(system_prompt="You are Brenna, a baker."))
             .set_start_node("answer")
             .set_default_model_name("SmolLM2-135M-Instruct"))
    agent = client.create_agent(graph, variables={"mood": "cheerful"})
    for chunk in agent.send("Hello!"):      # AnswerText frames as they arrive
        print(chunk.text, end="", flush=True)

Turns of one agent are serialised here, as the protocol asks: `send` waits until the agent's
previous turn has completed (TurnComplete) before it sends. A turn's stream yields its
AnswerText chunks; `result()` waits for TurnComplete and returns a TurnResult (with the
turn's speech, when a node spoke: `audio`, `audio_format`, `visemes`, `save_wav()`). A turn that
fails while running (ErrorResponse 4001, then TurnComplete(Error)) does not raise: the
errors are in the result. A request refused outright (3004, 3001, …) raises TryllError.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from tryll_fast import codec
from tryll_fast.client._methods import (
    AgentDialogMethods, AgentVoiceMethods, AsyncAgentDialogMethods, AsyncAgentVoiceMethods,
)
from tryll_fast.client.core import Call
from tryll_fast.client.errors import TryllError
from tryll_fast.errors import ErrorCode

_END = object()
_SPEECH = (codec.TtsAudioFormatFrame, codec.TtsAudioFrame, codec.TtsVisemeFrame)


class GraphDescription:
    """Builds a workflow graph: add_node(name, params) in order, set_start_node,
    set_default_model_name (every call returns the builder). The first node added is the
    start node unless set_start_node says otherwise."""

    def __init__(self) -> None:
        self.nodes: list[tuple[str, Any]] = []
        self.start_node = ""
        self.default_model_name = ""

    def add_node(self, name: str, params) -> "GraphDescription":
        if type(params) not in codec.TABLES or not type(params).__name__.endswith("Params"):
            raise TypeError(f"node params must be a node params table (GenerateParams, …), "
                            f"not {type(params).__name__}")
        self.nodes.append((name, params))
        return self

    def set_start_node(self, name: str) -> "GraphDescription":
        self.start_node = name
        return self

    def set_default_model_name(self, name: str) -> "GraphDescription":
        self.default_model_name = name
        return self

    def to_wire(self):
        start = self.start_node or (self.nodes[0][0] if self.nodes else "")
        return codec.GraphDescription(
            nodes=[codec.NodeDescription(name=n, params=p) for n, p in self.nodes],
            start_node=start)


def variable_value(value: Any):
    """A Python value as its VariableValue member (bool, int, float, str, set of str)."""
    if isinstance(value, bool):
        return codec.VarBool(value=value)
    if isinstance(value, int):
        return codec.VarInt(value=value)
    if isinstance(value, float):
        return codec.VarFloat(value=value)
    if isinstance(value, str):
        return codec.VarString(value=value)
    if isinstance(value, (set, frozenset, list, tuple)) and all(isinstance(v, str) for v in value):
        return codec.VarStringSet(values=sorted(set(value)))
    raise TypeError(f"no VariableValue for {type(value).__name__} (bool, int, float, str or a "
                    "set of str)")


def python_value(value: Any) -> Any:
    if isinstance(value, codec.VarStringSet):
        return set(value.values)
    return value.value


def Assign(name: str, value: Any):
    return codec.VariableUpdate(name=name, op=codec.VariableOp.Assign, value=variable_value(value))


def AddToSet(name: str, item: str):
    return codec.VariableUpdate(name=name, op=codec.VariableOp.AddToSet,
                                value=codec.VarString(value=item))


def RemoveFromSet(name: str, item: str):
    return codec.VariableUpdate(name=name, op=codec.VariableOp.RemoveFromSet,
                                value=codec.VarString(value=item))


def Reset(name: str):
    return codec.VariableUpdate(name=name, op=codec.VariableOp.Reset)


@dataclass
class TurnResult:
    status: int                        # codec.TurnStatus
    texts: dict[str, str]              # node name -> that node's whole text, in order
    tokens_generated: int
    debug_info: str
    errors: list[TryllError] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)
    # the turn's speech: mono int16 little-endian PCM at audio_format.sample_rate
    audio: bytes = b""
    audio_format: Any = None           # codec.WireAudioFormat, None when nothing spoke
    # (sample_offset, codec.Viseme) in time order, offsets counted from the turn's start
    visemes: list[tuple[int, int]] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "\n".join(t for t in self.texts.values() if t)

    @property
    def ok(self) -> bool:
        return self.status == codec.TurnStatus.Success

    @property
    def sample_rate(self) -> int:
        return self.audio_format.sample_rate if self.audio_format is not None else 0

    @property
    def audio_seconds(self) -> float:
        return len(self.audio) / 2 / self.sample_rate if self.sample_rate else 0.0

    def wav_bytes(self) -> bytes:
        """The turn's speech as a .wav file (empty when nothing spoke)."""
        if self.audio_format is None:
            return b""
        import io
        import wave
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(self.audio_format.channels or 1)
            w.setsampwidth(2)
            w.setframerate(self.sample_rate)
            w.writeframes(self.audio)
        return buf.getvalue()

    def save_wav(self, path) -> bool:
        """Write the turn's speech to `path` as a .wav; False when nothing spoke."""
        data = self.wav_bytes()
        if not data:
            return False
        with open(path, "wb") as f:
            f.write(data)
        return True


class _TurnState:
    """Frames of one turn, assembled (shared by the blocking and the asyncio stream)."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}
        self.errors: list[TryllError] = []
        self.events: list[Any] = []
        self.complete = None
        self.audio = bytearray()
        self.audio_format = None
        self.visemes: list[tuple[int, int]] = []

    def take(self, body) -> bool:
        """Record a frame; True if it is a text chunk for the caller."""
        if isinstance(body, codec.AnswerText):
            prior = self.texts.get(body.node_name, "") if body.is_delta else ""
            self.texts[body.node_name] = prior + body.text
            return True
        if isinstance(body, codec.TtsAudioFrame):
            self.audio += body.pcm
        elif isinstance(body, codec.TtsAudioFormatFrame):
            self.audio_format = body.format
        elif isinstance(body, codec.TtsVisemeFrame):
            self.visemes.extend((c.sample_offset, int(c.viseme)) for c in body.visemes)
        elif isinstance(body, codec.ErrorResponse):
            self.errors.append(TryllError(body.code, body.message))
        elif isinstance(body, codec.NodeEvent):
            self.events.append(body)
        return False

    def result(self) -> TurnResult:
        c = self.complete
        return TurnResult(status=c.status, texts=dict(self.texts),
                          tokens_generated=c.tokens_generated, debug_info=c.debug_info,
                          errors=list(self.errors), events=list(self.events),
                          audio=bytes(self.audio), audio_format=self.audio_format,
                          visemes=list(self.visemes))


def _turn_final(body) -> bool:
    # 4001 during a turn comes before its TurnComplete; any other error replaces the turn
    return isinstance(body, codec.TurnComplete) or (
        isinstance(body, codec.ErrorResponse) and body.code != ErrorCode.InferenceFailed)


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def ToolResult(call_id: str, result: str):
    """One result for a pending AwaitResult call (call_id from the tool_call event)."""
    return codec.ToolResult(call_id=call_id, result=result)


def _tool_results(items) -> list:
    out = []
    for item in items:
        if isinstance(item, codec.ToolResult):
            out.append(item)
        elif isinstance(item, Mapping):
            out.append(ToolResult(item["call_id"], item["result"]))
        else:
            call_id, result = item
            out.append(ToolResult(call_id, result))
    return out


class AgentCalls:
    """The agent requests and event callbacks, written once for both proxies (like
    client.core.Calls). Callbacks run on the reader thread (the event loop for the
    asyncio client): use resume_async / cancel_async there, not the blocking forms."""

    def __init__(self, client, agent_id: int) -> None:
        self.client = client
        self.id = agent_id
        self._on_paused: Callable[[str, str], None] | None = None
        self._on_tool_call: Callable[[str, str], None] | None = None
        self._on_tool_call_with_id: Callable[[str, str, str], None] | None = None
        self._on_intent_classified: Callable[[str, str, float, bool], None] | None = None
        self._on_attributes_classified: Callable[[str, dict, bool], None] | None = None
        self._on_summary_started: Callable[[str, int, int, str], None] | None = None
        self._on_audio: Callable[[Any, memoryview, str], None] | None = None
        self._on_visemes: Callable[[list, int, str], None] | None = None
        self._on_tts_audio_format: Callable[[Any], None] | None = None
        self._on_tts_audio: Callable[[memoryview], None] | None = None
        self._audio_format = None

    def set_on_audio(self, callback: Callable[[Any, memoryview, str], None] | None) -> None:
        """callback(format, pcm, node_name) for every chunk of speech as it arrives:
        format is the turn's codec.WireAudioFormat (sample_rate, channels 1, 16 bits), pcm
        a memoryview of int16 little-endian samples (copy it to keep it), node_name the
        speaking node. Chunks are about voice.chunk_ms (40 ms) each, in playback order."""
        self._on_audio = callback

    def set_on_visemes(self, callback: Callable[[list, int, str], None] | None) -> None:
        """callback(cues, sentence_index, node_name) after each spoken sentence's audio
        (voices with emit_visemes): cues are (sample_offset, codec.Viseme) in time order,
        offsets counted from the turn's first sample."""
        self._on_visemes = callback

    def set_on_tts_audio_format(self, callback: Callable[[Any], None] | None) -> None:
        """The original client's form: callback(format) once per spoken turn."""
        self._on_tts_audio_format = callback

    def set_on_tts_audio(self, callback: Callable[[memoryview], None] | None) -> None:
        """The original client's form: callback(pcm) per chunk."""
        self._on_tts_audio = callback

    def _speech(self, body) -> None:
        if isinstance(body, codec.TtsAudioFormatFrame):
            self._audio_format = body.format
            if self._on_tts_audio_format is not None:
                self._on_tts_audio_format(body.format)
        elif isinstance(body, codec.TtsAudioFrame):
            pcm = memoryview(body.pcm)
            if self._on_audio is not None:
                self._on_audio(self._audio_format, pcm, body.node_name)
            if self._on_tts_audio is not None:
                self._on_tts_audio(pcm)
        elif isinstance(body, codec.TtsVisemeFrame) and self._on_visemes is not None:
            self._on_visemes([(c.sample_offset, codec.Viseme(c.viseme)) for c in body.visemes],
                             body.sentence_index, body.node_name)

    def set_on_paused(self, callback: Callable[[str, str], None] | None) -> None:
        """callback(node_name, exit_route) when a turn pauses (exit_route: the node the
        wired exit leads to, "" = the end of the turn)."""
        self._on_paused = callback

    def set_on_tool_call(self, callback: Callable[[str, str], None] | None) -> None:
        """callback(tool_name, arguments_json) for every notified tool call."""
        self._on_tool_call = callback

    def set_on_tool_call_with_id(self,
                                 callback: Callable[[str, str, str], None] | None) -> None:
        """callback(tool_name, arguments_json, call_id): call_id is what an AwaitResult
        resume's tool_results must echo."""
        self._on_tool_call_with_id = callback

    def set_on_intent_classified(
            self, callback: Callable[[str, str, float, bool], None] | None) -> None:
        """callback(node_name, intent, probability, found) for every intent_classified
        event (a classifier node's notify_client: OnFound, or Always)."""
        self._on_intent_classified = callback

    def set_on_attributes_classified(
            self, callback: Callable[[str, dict, bool], None] | None) -> None:
        """callback(node_name, {attribute: value}, all_resolved) for every
        attributes_classified event (ClassifyAttributesLLM's notify_client); an unresolved
        attribute's value is ""."""
        self._on_attributes_classified = callback

    def set_on_summary_started(
            self, callback: Callable[[str, int, int, str], None] | None) -> None:
        """callback(node_name, interactions, folding, trigger) when a Summarize node starts
        a summary in the background: it is to stand for the dialog's first `interactions`
        interactions, `folding` of them new; trigger "turns" or "tokens"."""
        self._on_summary_started = callback

    def _event(self, body) -> None:
        kv = {p.key: p.value for p in body.kv_pairs}
        if body.event_type == "paused" and self._on_paused is not None:
            self._on_paused(body.node_name, kv.get("exit_route", ""))
        elif body.event_type == "tool_call":
            if self._on_tool_call_with_id is not None:
                self._on_tool_call_with_id(kv.get("tool_name", ""), kv.get("arguments_json", ""),
                                           kv.get("call_id", ""))
            if self._on_tool_call is not None:
                self._on_tool_call(kv.get("tool_name", ""), kv.get("arguments_json", ""))
        elif body.event_type == "intent_classified" and self._on_intent_classified is not None:
            try:
                probability = float(kv.get("probability", "0"))
            except ValueError:
                probability = float("nan")
            self._on_intent_classified(body.node_name, kv.get("intent", ""), probability,
                                       kv.get("found") == "true")
        elif (body.event_type == "attributes_classified"
              and self._on_attributes_classified is not None):
            values = {k: v for k, v in kv.items() if not k.endswith(".probability")}
            self._on_attributes_classified(body.node_name, values,
                                           all(v != "" for v in values.values()))
        elif body.event_type == "summary_started" and self._on_summary_started is not None:
            self._on_summary_started(body.node_name, _int(kv.get("interactions")),
                                     _int(kv.get("folding")), kv.get("trigger", ""))

    def _resume(self, resume_node: str, tool_results) -> Call:
        results = _tool_results(tool_results)
        return Call("ResumeAgentRequest", lambda rid: codec.ResumeAgentRequest(
            request_id=rid, agent_id=self.id, resume_node=resume_node, tool_results=results),
            lambda r: None)

    def _cancel(self, mode: int) -> Call:
        return Call("CancelRequest", lambda rid: codec.CancelRequest(
            request_id=rid, agent_id=self.id, mode=mode), lambda r: None)

    def _change_params(self, node_name: str, params) -> Call:
        return Call("ChangeAgentParamRequest", lambda rid: codec.ChangeAgentParamRequest(
            request_id=rid, agent_id=self.id, node_name=node_name, params=params),
            lambda r: None)

    def _update_variables(self, updates) -> Call:
        if isinstance(updates, Mapping):
            updates = [Assign(k, v) for k, v in updates.items()]
        updates = list(updates)
        return Call("UpdateAgentVariablesRequest", lambda rid: codec.UpdateAgentVariablesRequest(
            request_id=rid, agent_id=self.id, updates=updates), lambda r: None)

    def _get_variables(self) -> Call:
        return Call("GetAgentVariablesRequest", lambda rid: codec.GetAgentVariablesRequest(
            request_id=rid, agent_id=self.id),
            lambda r: {v.name: python_value(v.value) for v in r.variables})

    def _destroy(self) -> Call:
        return Call("DestroyAgentRequest", lambda rid: codec.DestroyAgentRequest(
            request_id=rid, agent_id=self.id), lambda r: None)

    def _send(self, text: str, state: _TurnState, on_frame: Callable[[Any], None]) -> Call:
        def done(body):
            state.complete = body
            return state.result()
        return Call("SendMessageRequest", lambda rid: codec.SendMessageRequest(
            request_id=rid, agent_id=self.id, text=text), done, on_progress=on_frame,
            is_final=_turn_final)


def create_agent_call(graph: GraphDescription, *, variables: Mapping[str, Any] | None,
                      enable_diagnostics: bool, maintain_dialogue_history: bool, workload: int,
                      kv_cache_initialization: int, voice) -> Call:
    wire_graph = graph.to_wire()
    decls = [codec.AgentVariable(name=k, value=variable_value(v))
             for k, v in (variables or {}).items()]
    return Call("CreateAgentRequest", lambda rid: codec.CreateAgentRequest(
        request_id=rid, graph=wire_graph, default_model_name=graph.default_model_name,
        enable_diagnostics=enable_diagnostics, maintain_dialogue_history=maintain_dialogue_history,
        variables=decls, kv_cache_initialization=kv_cache_initialization, workload=workload,
        voice=voice), lambda r: r.agent_id)


# --------------------------------------------------------------------------- blocking


class TurnStream:
    """Iterate for the turn's AnswerText chunks; result() for the TurnResult."""

    def __init__(self, agent: "Agent") -> None:
        self.agent = agent
        self.state = _TurnState()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self.future = None

    def _frame(self, body) -> None:                 # reader thread
        if self.state.take(body):
            self._queue.put(body)
        elif isinstance(body, codec.NodeEvent):
            self.agent._event(body)
        elif isinstance(body, _SPEECH):
            self.agent._speech(body)

    def _done(self, _future) -> None:
        self._queue.put(_END)

    def __iter__(self):
        while True:
            item = self._queue.get()
            if item is _END:
                self.future.result()                # raises a refused turn's TryllError
                return
            yield item

    def result(self, timeout: float | None = None) -> TurnResult:
        self.agent.client._check_thread("TurnStream.result")
        limit = self.agent.client.timeout if timeout is None else timeout
        try:
            return self.future.result(limit)
        except TimeoutError:
            raise TryllError(ErrorCode.Timeout, f"turn of agent {self.agent.id}: no "
                                                f"TurnComplete within {limit} s") from None


class Agent(AgentDialogMethods, AgentVoiceMethods, AgentCalls):
    """An agent of a TryllClient. Methods block for their Ack; send() returns a stream."""

    def __init__(self, client, agent_id: int) -> None:
        super().__init__(client, agent_id)
        self._turn_slot = threading.Lock()
        self.last_turn: TurnStream | None = None

    def send(self, text: str, timeout: float | None = None) -> TurnStream:
        """Start a turn (after the previous one completed)."""
        client = self.client
        limit = client.timeout if timeout is None else timeout
        if not self._turn_slot.acquire(blocking=False):
            client._check_thread("Agent.send while a turn runs")
            if not self._turn_slot.acquire(timeout=-1 if limit is None else limit):
                raise TryllError(ErrorCode.Timeout, f"agent {self.id}: the previous turn did "
                                                    f"not complete within {limit} s")
        stream = TurnStream(self)
        client._agent_frames[self.id] = stream._frame
        try:
            stream.future = client.start(self._send(text, stream.state, stream._frame))
        except BaseException:
            self._turn_slot.release()
            raise
        stream.future.add_done_callback(lambda f: (self._turn_slot.release(), stream._done(f)))
        self.last_turn = stream
        return stream

    def cancel(self, mode: int = codec.CancelMode.StopAndKeep, timeout=None) -> None:
        self.client.wait(self._cancel(int(mode)), timeout)

    def cancel_async(self, mode: int = codec.CancelMode.StopAndKeep):
        return self.client.start(self._cancel(int(mode)))

    def change_params(self, node_name: str, params, timeout=None) -> None:
        self.client.wait(self._change_params(node_name, params), timeout)

    def change_params_async(self, node_name: str, params):
        return self.client.start(self._change_params(node_name, params))

    def resume(self, resume_node: str = "", tool_results=(), timeout=None) -> None:
        """Resume a paused turn: continue via its exit ("") or jump to resume_node;
        tool_results answers pending AwaitResult calls ([(call_id, result)] or ToolResult).
        Blocks for the Ack; raises TryllError (3012, 3005, 3016) and, on the reader thread
        (inside a callback), ReaderThreadError: use resume_async there."""
        self.client.wait(self._resume(resume_node, tool_results), timeout)

    def resume_async(self, resume_node: str = "", tool_results=()):
        """resume() returning a concurrent.futures.Future: usable from callbacks."""
        return self.client.start(self._resume(resume_node, tool_results))

    def update_variables(self, updates, timeout=None) -> None:
        """updates: VariableUpdate values (Assign / AddToSet / RemoveFromSet / Reset) or a
        {name: value} dict of assignments."""
        self.client.wait(self._update_variables(updates), timeout)

    def get_variables(self, timeout=None) -> dict[str, Any]:
        return self.client.wait(self._get_variables(), timeout)

    def destroy(self, timeout=None) -> None:
        self.client.wait(self._destroy(), timeout)
        self.client._agent_frames.pop(self.id, None)


# --------------------------------------------------------------------------- asyncio


class AsyncTurnStream:
    """`async for chunk in stream`; `await stream.result()`."""

    def __init__(self, agent: "AsyncAgent") -> None:
        self.agent = agent
        self.state = _TurnState()
        self._queue: asyncio.Queue = asyncio.Queue()
        self.future = None

    def _frame(self, body) -> None:
        if self.state.take(body):
            self._queue.put_nowait(body)
        elif isinstance(body, codec.NodeEvent):
            self.agent._event(body)
        elif isinstance(body, _SPEECH):
            self.agent._speech(body)

    def _done(self, _future) -> None:
        self._queue.put_nowait(_END)

    def __aiter__(self):
        return self._chunks()

    async def _chunks(self):
        while True:
            item = await self._queue.get()
            if item is _END:
                await self.future
                return
            yield item

    async def result(self, timeout: float | None = None) -> TurnResult:
        limit = self.agent.client.timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(asyncio.shield(self.future), limit)
        except asyncio.TimeoutError:
            raise TryllError(ErrorCode.Timeout, f"turn of agent {self.agent.id}: no "
                                                f"TurnComplete within {limit} s") from None


class AsyncAgent(AsyncAgentDialogMethods, AsyncAgentVoiceMethods, AgentCalls):
    def __init__(self, client, agent_id: int) -> None:
        super().__init__(client, agent_id)
        self._turn_slot = asyncio.Lock()

    async def send(self, text: str) -> AsyncTurnStream:
        await self._turn_slot.acquire()
        stream = AsyncTurnStream(self)
        self.client._agent_frames[self.id] = stream._frame
        try:
            stream.future = self.client.start(self._send(text, stream.state, stream._frame))
        except BaseException:
            self._turn_slot.release()
            raise
        stream.future.add_done_callback(lambda f: (self._turn_slot.release(), stream._done(f)))
        return stream

    async def cancel(self, mode: int = codec.CancelMode.StopAndKeep, timeout=None) -> None:
        await self.client.wait(self._cancel(int(mode)), timeout)

    async def change_params(self, node_name: str, params, timeout=None) -> None:
        await self.client.wait(self._change_params(node_name, params), timeout)

    async def resume(self, resume_node: str = "", tool_results=(), timeout=None) -> None:
        await self.client.wait(self._resume(resume_node, tool_results), timeout)

    def resume_async(self, resume_node: str = "", tool_results=()):
        """An asyncio.Future for the Ack (callbacks can call it without awaiting)."""
        return self.client.start(self._resume(resume_node, tool_results))

    async def update_variables(self, updates, timeout=None) -> None:
        await self.client.wait(self._update_variables(updates), timeout)

    async def get_variables(self, timeout=None) -> dict[str, Any]:
        return await self.client.wait(self._get_variables(), timeout)

    async def destroy(self, timeout=None) -> None:
        await self.client.wait(self._destroy(), timeout)
        self.client._agent_frames.pop(self.id, None)
