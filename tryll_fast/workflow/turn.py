"""The turn executor: one SendMessage walked through the graph (docs/workflow.md).

From the start node, each node runs and names its exit; the exit's target runs next; an
empty exit ends the turn. More than `max_steps_per_turn` node runs: ErrorResponse 4001
"Max steps per turn (N) exceeded", then TurnComplete(Error).

Frames (docs/workflow.md): every text-producing node sends exactly one is_final chunk (Streamed:
deltas then an empty terminator; Whole: one chunk). A turn in which no node sent one ends
with an empty final chunk (is_delta = false, is_final = true) from its last node. Then
exactly one TurnComplete {request_id, agent_id, status, debug_info, tokens_generated}.

Outcomes: a node failure sends ErrorResponse 4001 with the reason, then TurnComplete(Error);
the interaction is dropped from the dialog (the dialog is as before the turn) and the agent
is idle again. Cancel: the engine stops before its next token, a streaming node still sends
its terminator, TurnComplete(Cancelled); StopAndKeep keeps the partial reply, StopAndDiscard
drops the interaction. Stateless agents clear the dialog after every turn.

Pauses (docs/workflow.md): a node may ask to pause after it (a Pause node always; a ToolCall with a
pausing disposition when it detected a call). The agent is then paused: NodeEvent "paused"
{exit_route, cause, timeout_ms}; the turn waits for ResumeAgentRequest (continue via the
exit, or jump to a node), CancelRequest, or its timeout (the Pause node's timeout_exit, else
TurnComplete(PauseTimedOut); the interaction is kept).
"""
from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from tryll_fast import codec
from tryll_fast.engines.errors import EngineError
from tryll_fast.engines.roles import Priority, SamplingParams
from tryll_fast.errors import ErrorCode
from tryll_fast.prompting.character import framed
from tryll_fast.prompting.tools import split_reasoning
from tryll_fast.workflow import kv, templates
from tryll_fast.workflow._stream import AnswerStream
from tryll_fast.workflow.agent import Agent
from tryll_fast.workflow.dialog import USER_SLOT, Component
from tryll_fast.workflow.projection import ProjectionError
from tryll_fast.workflow.sentences import ThoughtFilter, TailGuard, complete_sentences
from tryll_fast.workflow.speech import SpeechStrand, TurnAudio

log = logging.getLogger("tryll_fast.workflow")

Status = codec.TurnStatus
Send = codec.SendMode
_P = codec.Placement
# where a node's template message stood in its prompt, and in which role (dialog.py)
_TEMPLATE_PLACE = {_P.BeforeUserAsUser: ("before", "user"),
                   _P.BeforeUserAsSystem: ("before", "system"),
                   _P.AfterUserAsUser: ("after", "user"),
                   _P.AfterUserAsSystem: ("after", "system"),
                   _P.InPlaceOfUser: ("instead", "user")}


class TurnFailure(Exception):
    """A node failed: the turn ends with 4001 and TurnComplete(Error)."""


class TurnCancelled(Exception):
    pass


class TurnOverTime(TurnFailure):
    """The turn outlived workflow.turn_timeout_ms: it ends with 4002 InferenceTimeout."""


class TurnTimedOut(Exception):
    """A pause outlived its timeout with no timeout exit: TurnComplete(PauseTimedOut)."""


@dataclass
class Paused:
    """A turn waiting between nodes for ResumeAgentRequest (docs/workflow.md)."""
    node: Any
    exit_name: str
    cause: str                      # tool_call | pause_node
    await_calls: list               # the AwaitResult tool_call components awaiting results
    wake: Any                       # asyncio.Future: ("resume", node) | ("timeout",) | ("cancel",)
    loop: Any


def start(agent: Agent, request_id: int, user_text: str,
          open_operation: Callable[[Callable[[], None]], Any]) -> "Turn":
    """SendMessage: admit a turn on the idle agent, open its operation and run it on the
    agent's runtime. Raises TryllError (AgentBusy, ...) when the agent cannot take one."""
    with agent.lock:
        agent.admit("SendMessageRequest", "one turn at a time; wait for its TurnComplete")
        turn = Turn(agent, request_id, user_text, open_operation)
        agent.begin_turn(turn)
    agent.runtime.spawn(turn.run())
    return turn


class Turn:
    def __init__(self, agent: Agent, request_id: int, user_text: str,
                 open_operation: Callable[[Callable[[], None]], Any]) -> None:
        """`open_operation(cancel)` opens the session's record of this turn, whose cancel
        (a closing session) stops it; it is called last, with the turn whole."""
        self.agent = agent
        self.session = agent.session
        self.conn = agent.session.conn
        self.request_id = request_id
        self.user_text = user_text
        self.interaction = agent.dialog.begin(user_text)
        self.instructions: list[tuple[str, str]] = []
        self.knowledge: list[dict[str, Any]] = []   # Retrieve blocks of this turn (templates)
        self.attributes: dict[str, str] = {}        # ClassifyAttributesLLM values (templates)
        self.intent: str | None = None      # the last classifier's choice this turn
        self.steps = 0
        self.tokens_generated = 0
        self.finals = 0
        self.cancelled = False
        self.cancel_mode = codec.CancelMode.StopAndKeep
        self._handles: set = set()
        self._last_node = ""
        self._nodes_diag: list[dict[str, Any]] = []
        self._diag: dict[str, Any] | None = None
        self._pause_request = None
        self._kv_restore: dict | None = None
        self.paused: Paused | None = None
        self.regex_timeout_s = agent.runtime.limits.regex_timeout_s
        self.audio: TurnAudio | None = None      # the turn's speech, once a node speaks
        self._strands: list[SpeechStrand] = []
        self.t_start = time.perf_counter()
        self.t_start_mono = time.monotonic()
        # workflow.turn_timeout_ms: when the turn's own work must end (pauses, which wait
        # for the client, move it on; None = no limit)
        limit_ms = agent.runtime.limits.turn_timeout_ms
        self.deadline = self.t_start + limit_ms / 1000.0 if limit_ms > 0 else None
        self.operation = open_operation(lambda: self.cancel(codec.CancelMode.StopAndDiscard))

    # ---- control (any thread) ----

    def cancel(self, mode) -> None:
        self.cancel_mode = mode
        self.cancelled = True
        for handle in list(self._handles):
            handle.cancel()
        for strand in list(self._strands):
            strand.cancel()
        paused = self.paused
        if paused is not None:
            paused.loop.call_soon_threadsafe(_settle, paused.wake, ("cancel",))

    # ---- the walk (orchestrator) ----

    async def run(self) -> None:
        agent = self.agent
        limit = agent.runtime.limits.max_steps_per_turn
        status = Status.Success
        try:
            if agent.kv_evicted:
                await self._restore_kv()
            agent.kv_synced()                   # this turn's requests sync the KV
            node = agent.graph.nodes[agent.graph.start]
            while node is not None:
                if self.cancelled:
                    raise TurnCancelled()
                self.steps += 1
                if self.steps > limit:
                    raise TurnFailure(f"Max steps per turn ({limit}) exceeded")
                self._check_time(node.name)
                self._last_node = node.name
                self._begin_node(node)
                exit_name = await node.type.run(self, node)
                self._end_node(exit_name)
                if self._pause_request is not None:
                    node = await self._pause(node, exit_name)
                else:
                    node = agent.graph.next(node, exit_name)
            if self.cancelled:
                raise TurnCancelled()
        except TurnCancelled:
            status = Status.Cancelled
        except TurnTimedOut:
            status = Status.PauseTimedOut
        except asyncio.CancelledError:
            status = Status.Cancelled
        except TurnOverTime as exc:
            status = Status.Error
            self._error(str(exc), ErrorCode.InferenceTimeout)
        except TurnFailure as exc:
            status = Status.Error
            self._error(str(exc))
        except ProjectionError as exc:
            status = Status.Error
            self._error(f"node {self._last_node!r}: {exc}")
        except EngineError as exc:
            status = Status.Error
            self._error(f"node {self._last_node!r}: {exc.message}")
        except Exception as exc:   # a node bug must end the turn, not the loop
            log.exception("turn of agent %d failed in node %s", agent.id, self._last_node)
            status = Status.Error
            self._error(f"node {self._last_node!r}: internal error: {exc!r}")
        finally:
            self._finish(status)

    async def _restore_kv(self) -> None:
        """The agent's KV was evicted: prefill every eligible node again first (the protocol:
        restored before every SendMessage, no error, no client request)."""
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        report = await loop.run_in_executor(self.agent.runtime.workers, kv.restore,
                                            self.agent)
        if report is not None:
            self._kv_restore = {"ms": round((time.perf_counter() - t0) * 1000, 3),
                                "tokens_decoded": report.tokens_decoded,
                                "tokens_reused": report.tokens_reused}

    def _error(self, message: str, code: ErrorCode = ErrorCode.InferenceFailed) -> None:
        if self._diag is not None:
            self._diag["error"] = message
        self.session.send_error(self.request_id, code, message, self.agent.id)

    def _check_time(self, node_name: str) -> float | None:
        """Seconds the turn has left (None: no limit); TurnOverTime when none."""
        if self.deadline is None:
            return None
        left = self.deadline - time.perf_counter()
        if left <= 0:
            limit = self.agent.runtime.limits.turn_timeout_ms
            raise TurnOverTime(f"node {node_name!r}: the turn outlived its time limit "
                               f"(workflow.turn_timeout_ms = {limit})")
        return left

    def _finish(self, status) -> None:
        agent = self.agent
        inter = self.interaction
        try:
            if self.finals == 0:
                self.send_whole(self._last_node or agent.graph.start, "")
            if status in (Status.Success, Status.PauseTimedOut) or (
                    status == Status.Cancelled
                    and self.cancel_mode == codec.CancelMode.StopAndKeep):
                inter.outcome = {Status.Cancelled: "cancelled_kept",
                                 Status.PauseTimedOut: "failed"}.get(status, "completed")
                inter.completed_ms = int(time.time() * 1000)
            else:
                agent.dialog.remove(inter)
            if not agent.maintain_history:
                agent.dialog.clear()
            debug = self._debug_info(status) if agent.diagnostics else ""
        finally:
            agent.turns_run += 1
            with agent.lock:
                agent.end_turn()
            self.session.send_reply(codec.TurnComplete(
                request_id=self.request_id, agent_id=agent.id, status=status,
                debug_info=debug if agent.diagnostics else "",
                tokens_generated=self.tokens_generated))
            self.operation.finish()

    # ---- what nodes use ----

    def template_context(self) -> dict[str, Any]:
        return templates.context(variables=self.agent.variables.template_view(),
                                 instructions=self.instructions, locale=self.session.locale,
                                 knowledge=self.knowledge, attributes=self.attributes,
                                 user_message=self.user_text)

    def character(self, params) -> str:
        """The system message of a node that speaks as the character: the server's
        character frame, then the node's system_prompt (prompting/character.py)."""
        return framed(self.agent.runtime.limits.character_frame, params.system_prompt)

    def slot(self, name: str) -> str:
        if name == USER_SLOT:
            return self.user_text
        text = self.interaction.slot(name)
        if text is None:
            raise TurnFailure(f"input slot {name!r} is empty: node {name!r} has not produced "
                              "text in this turn")
        return text

    def fail(self, message: str):
        raise TurnFailure(message)

    def note(self, node, **values: Any) -> None:
        if self._diag is not None:
            self._diag.update(values)

    def send_whole(self, node_name: str, text: str) -> None:
        self.finals += 1
        self.session.send_frame(codec.encode_answer_text(self.request_id, self.agent.id,
                                                         node_name, text, False, True))

    def add_reply(self, node, text: str) -> Component:
        return self.interaction.add(Component(kind="assistant", slot=node.name, text=text,
                                              node_name=node.name))

    def latest_reply(self) -> str:
        """The latest non-empty assistant text of this turn (what a Speak node voices)."""
        for c in reversed(self.interaction.components):
            if c.kind == "assistant" and c.text:
                return c.text
        return ""

    async def open_strand(self, node) -> SpeechStrand:
        """A speaking node's way to the agent's voice (workflow/speech.py)."""
        agent = self.agent
        engine = await agent.engine(agent.voice.model)
        if self.audio is None:
            self.audio = TurnAudio(self, engine.sample_rate, agent.runtime.limits.voice_chunk_ms)
        strand = SpeechStrand(self.audio, engine, agent.voice, agent.delivery, node.name,
                              agent.priority, asyncio.get_running_loop())
        self._strands.append(strand)
        if self.cancelled:
            strand.cancel()
        return strand

    async def finish_strand(self, node, strand: SpeechStrand) -> None:
        """Wait until the node's audio is sent; a failed voice fails the turn."""
        await strand.done
        if self._diag is not None:
            self._diag["speech"] = {"sentences": strand.sentences,
                                    "delivery_modes": strand.modes}
        if strand.error is not None:
            raise TurnFailure(f"node {node.name!r}: speech synthesis failed: {strand.error}")
        if self.cancelled:
            raise TurnCancelled()

    def add_knowledge(self, node, source: str, query: str, chunks: list[dict]) -> None:
        """Attach a Retrieve's result: rendered by `{{#knowledge}}` / `{{#knowledge_<source>}}`
        in this turn, kept in the dialog (PersistedKnowledge) for export."""
        self.knowledge = [b for b in self.knowledge if b["name"] != source]
        self.knowledge.append({"name": source, "query": query, "chunks": chunks})
        self.interaction.add(Component(
            kind="knowledge", slot=node.name, text=query, node_name=node.name, name=source,
            role="hidden", extra={"entries": [
                {"id": c["id"], "text": c["text"], "distance": c["distance"],
                 "metadata_json": json.dumps(c["metadata"]) if c["metadata"] else ""}
                for c in chunks]}))

    def add_instruction(self, node, name: str, text: str) -> None:
        self.instructions.append((name, text))
        self.interaction.add(Component(kind="instruction", slot=node.name, text=text,
                                       node_name=node.name, name=name, role="hidden"))
        self.note(node, instruction=name, text=text)

    async def generate(self, node, spec, *, system_prompt: str, template_text: str,
                       placement: int, input_slot: str, send: int, on_text=None,
                       visible: bool | None = None) -> tuple[str, bool]:
        """Run the node's model on its projection; stream per `send`; return the reply and
        whether the token budget cut it. `on_text` also gets every chunk (on the engine's
        thread). A cut reply ends at its last complete sentence: in the dialog, in the
        Whole chunk, and in the stream (a TailGuard holds its unfinished sentence back)."""
        stream = (AnswerStream(self.conn, self.request_id, self.agent.id, node.name)
                  if send == Send.Streamed else None)
        guard = TailGuard(stream, spec.max_tokens) if stream is not None else None
        handle, _ = await self.run_model(node, spec, system_prompt=system_prompt,
                                         template_text=template_text, placement=placement,
                                         input_slot=input_slot, stream=stream,
                                         on_text=on_text, guard=guard, reply=True,
                                         visible=stream is not None if visible is None
                                         else visible)
        cut = handle.finish_reason == "length"
        reasoning, said = split_reasoning(handle.text)
        text = complete_sentences(said) if cut else said
        if self._diag is not None:
            if cut:
                self._diag["cut_at_sentence"] = len(said) - len(text)
            if reasoning:
                self._diag["reasoning_content"] = reasoning
        if stream is not None:
            guard.finish(cut)
            stream.finish()
            self.finals += 1
        elif send == Send.Whole:
            self.send_whole(node.name, text)
        return text, cut

    def _keep_template(self, node, template_text: str, placement: int) -> None:
        """The node's template message of this turn, for its later prompts (dialog.py)."""
        inter = self.interaction
        inter.components = [c for c in inter.components
                            if not (c.kind == "template" and c.node_name == node.name)]
        where = _TEMPLATE_PLACE.get(placement)
        if where is None or not template_text:
            return
        inter.add(Component(kind="template", slot=node.name, node_name=node.name,
                            text=template_text, role=where[1], producer="node",
                            extra={"where": where[0]}))

    def priority(self, visible: bool):
        """The engine class of this turn's model request (engines/roles.py, Priority)."""
        if self.agent.priority == Priority.BACKGROUND:
            return Priority.BACKGROUND
        return Priority.INTERACTIVE if visible else Priority.BUFFERED

    async def run_model(self, node, spec, *, system_prompt: str, template_text: str = "",
                        placement: int = 0, input_slot: str, stream=None, tools=None,
                        tool_mode: str = "", grammar=None, on_text=None,
                        max_history: int | None = None, score_tokens=None, guard=None,
                        keep_template: bool = True, reply: bool = False,
                        visible: bool = False):
        """Project, submit, await the engine; returns (the finished RequestHandle, the
        ToolSet used or None). `tools` is a ToolSet or formatter -> ToolSet, `grammar` a
        ToolGrammar or ToolSet -> ToolGrammar. Raises TurnCancelled or TurnFailure; under
        StopAndKeep a cancelled reply (`reply`: the character's words, streamed, sent whole
        or not sent) keeps its partial text in the dialog, a classifier's or a tool
        call's partial output does not. `visible`: text a player watches stream, the
        engine's most protected class under throttle (the rest of an interactive agent's
        work is Buffered; a Background agent's is Background)."""
        agent = self.agent
        runtime = agent.runtime
        self._mark("node_start")
        engine = await agent.engine(spec.model)
        lane = await agent.lane(node) if spec.lane is not None else None
        if self.cancelled:
            raise TurnCancelled()
        formatter = runtime.formatter(engine)
        toolset = tools(formatter) if callable(tools) else tools
        projection = agent.projection(node.name, engine, formatter)
        t_proj = time.perf_counter()
        prompt = projection.build(agent.dialog, self.interaction, system_prompt=system_prompt,
                                  template_text=template_text, placement=placement,
                                  input_text=self.slot(input_slot), input_slot=input_slot,
                                  n_ctx=spec.n_ctx, reserve=spec.max_tokens, tools=toolset,
                                  tool_mode=tool_mode, max_history=max_history)
        self._mark("projected")
        if keep_template:
            self._keep_template(node, template_text, placement)
        stop = spec.stop if spec.stop is not None else tuple(
            dict.fromkeys(formatter.stop_strings + spec.extra["catalog_stop"]))
        extra = {}
        if grammar is not None:
            g = grammar(toolset) if callable(grammar) else grammar
            extra = {"grammar": g.gbnf, "grammar_triggers": g.trigger_patterns}
        if score_tokens is not None:        # formatter -> candidate token ids
            extra["score_tokens"] = tuple(score_tokens(engine))
        sampling = SamplingParams(stop=stop, **spec.sampling, **extra)
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def finished(handle) -> None:        # scheduler thread
            loop.call_soon_threadsafe(_settle, done, handle)

        # `guard` (a TailGuard) stands between the engine and the stream
        feed = guard.feed if guard is not None else stream.feed if stream is not None \
            else None
        text_sink = feed
        if on_text is not None:
            text_sink = on_text if feed is None else _both(feed, on_text)
        # a reply's chain of thought is never shown or spoken (nor kept: generate())
        thought = ThoughtFilter(text_sink) if reply and text_sink is not None else None
        if thought is not None:
            text_sink = thought.feed
        unregister = self.session.on_resume(engine.wake)
        t_submit = time.perf_counter()
        try:
            handle = engine.submit(prompt.tokens, key=agent.conv_key(node.name),
                                   sampling=sampling, priority=self.priority(visible),
                                   shared_prefix_len=prompt.shared_prefix_len,
                                   on_text=text_sink,
                                   on_finish=finished, gate=self.conn, lane=lane)
            if stream is not None:
                stream.handle = handle
            self._mark("submitted")
            self._handles.add(handle)
            if self.cancelled:
                handle.cancel()
            left = self._check_time(node.name)
            over_time = False
            if left is None:
                await done
            else:
                try:
                    await asyncio.wait_for(asyncio.shield(done), left)
                except asyncio.TimeoutError:
                    over_time = True
                    handle.cancel()
                    await done              # the engine stops before its next token
        finally:
            unregister()
        self._handles.discard(handle)
        if thought is not None:
            thought.flush()
        self.tokens_generated += handle.stats.tokens_generated
        if self._diag is not None:
            self._diag.update(self._llm_diag(spec, sampling, prompt, handle, stream,
                                             t_submit - t_proj))
            if toolset is not None:
                self._diag["input"] = {"prompt": prompt.messages}
        if over_time:                       # a time limit, not a cancel: 4002
            self._check_time(node.name)
        if handle.finish_reason == "cancelled" or self.cancelled:
            if guard is not None:
                guard.finish(False)         # what the history keeps was all shown
            if stream is not None:
                stream.finish()
                self.finals += 1
            kept = split_reasoning(handle.text)[1] if reply else handle.text
            if (self.cancel_mode == codec.CancelMode.StopAndKeep and kept
                    and (reply or stream is not None)):
                self.add_reply(node, kept).extra["truncated"] = True
            raise TurnCancelled()
        if handle.error is not None:
            raise TurnFailure(f"node {node.name!r}: {handle.error}")
        return handle, toolset

    def send_event(self, node_name: str, event_type: str, pairs: dict[str, str]) -> None:
        """A NodeEvent (tool_call, paused, …): out of band, before the turn completes."""
        self.session.send_reply(codec.NodeEvent(
            request_id=self.request_id, agent_id=self.agent.id, node_name=node_name,
            event_type=event_type,
            kv_pairs=[codec.NodeParam(key=k, value=v) for k, v in pairs.items()]))

    # ---- pausing ----

    def request_pause(self, cause: str, timeout_ms: int, timeout_exit: str | None = None,
                      await_calls: tuple = ()) -> None:
        """A node asks the executor to pause right after it (it is not paused yet)."""
        self._pause_request = (cause, timeout_ms, timeout_exit, await_calls)

    async def _pause(self, node, exit_name: str):
        """Pause after `node`; returns the node to run next (None = end), or raises
        TurnCancelled / TurnTimedOut."""
        cause, timeout_ms, timeout_exit, await_calls = self._pause_request
        self._pause_request = None
        agent = self.agent
        loop = asyncio.get_running_loop()
        wake = loop.create_future()
        with agent.lock:
            if self.cancelled or not agent.pause():
                raise TurnCancelled()
            self.paused = Paused(node, exit_name, cause, list(await_calls), wake, loop)
        target = node.exits[exit_name]
        self.send_event(node.name, "paused", {"exit_route": target, "cause": cause,
                                               "timeout_ms": str(timeout_ms)})
        timer = loop.call_later(timeout_ms / 1000.0, _settle, wake, ("timeout",)) \
            if timeout_ms > 0 else None
        if self._diag is not None:
            self._diag["pause"] = {"cause": cause, "timeout_ms": timeout_ms}
        t0 = time.perf_counter()
        try:
            outcome = await wake
        finally:
            if self.deadline is not None:     # waiting for the client is not the turn's
                self.deadline += time.perf_counter() - t0
            if timer is not None:
                timer.cancel()
            with agent.lock:
                self.paused = None
                agent.unpause()
        if self._diag is not None:
            self._diag["pause"].update(outcome=outcome[0],
                                       paused_ms=round((time.perf_counter() - t0) * 1000, 3))
        kind = outcome[0]
        if kind == "cancel" or self.cancelled:
            raise TurnCancelled()
        if kind == "timeout":
            if timeout_exit:
                return agent.graph.nodes[timeout_exit]
            raise TurnTimedOut()
        jump = outcome[1]
        if jump:
            return agent.graph.nodes[jump]
        return agent.graph.next(node, exit_name)

    def resume(self, resume_node: str, results: dict[str, str]) -> None:
        """The client's ResumeAgentRequest, already validated (reactor thread, agent lock
        held): attach the tool results and wake the turn."""
        paused = self.paused
        for call in paused.await_calls:
            call_id = call.extra["call_id"]
            call.extra["state"] = "resolved"
            self.interaction.add(Component(
                kind="tool_result", slot=call.slot, node_name=call.node_name,
                text=results[call_id], name=call.name, role="tool",
                producer="client_tool_result",
                extra={"call_id": call_id, "projected": True}))
        self.agent.unpause()
        paused.loop.call_soon_threadsafe(_settle, paused.wake, ("resume", resume_node))

    # ---- diagnostics ----

    def _mark(self, what: str) -> None:
        """Milliseconds since the SendMessage was dispatched, per step of a model node."""
        if self._diag is not None:
            self._diag.setdefault("since_request_ms", {})[what] = round(
                (time.perf_counter() - self.t_start) * 1000, 3)

    def _begin_node(self, node) -> None:
        if self.agent.diagnostics:
            self._diag = {"node": node.name, "type": node.type.kind,
                          "t0": time.perf_counter()}
            self._nodes_diag.append(self._diag)

    def _end_node(self, exit_name: str) -> None:
        if self._diag is not None:
            self._diag["exit"] = exit_name
            self._diag["ms"] = round((time.perf_counter() - self._diag.pop("t0")) * 1000, 3)

    def _llm_diag(self, spec, sampling: SamplingParams, prompt, handle, stream,
                  projection_s: float) -> dict[str, Any]:
        st = handle.stats
        out = {
            "model": spec.model,
            # the context it ran on: "base", or its adapters (scale) and overrides
            "context": spec.lane.describe() if spec.lane is not None else "base",
            "adapters": [{"path": path, "scale": scale} for path, scale in spec.adapters],
            "prompt": prompt.text,
            "prompt_tokens": len(prompt.tokens),
            "shared_prefix_tokens": prompt.shared_prefix_len,
            "history_interactions": prompt.window,
            "dropped_interactions": prompt.dropped,
            "summarized_interactions": prompt.summarized,
            "sampling": {k: v for k, v in sampling.__dict__.items() if k != "grammar"},
            "timings_ms": {
                "projection": round(projection_s * 1000, 3),
                "queue": round(st.queue_wait_s * 1000, 3),
                "prefill": round(st.prefill_s * 1000, 3),
                "first_token": round(st.first_token_s * 1000, 3),
                # the first text handed to the connection (the detokenizer may hold a
                # token back until the next one completes its text)
                "first_text": round(stream.first_handoff_ns / 1e6 - handle.t_submit * 1000, 3)
                if stream is not None and stream.frames else None,
                "decode": round(st.decode_s * 1000, 3),
                "total": round(st.total_s * 1000, 3),
            },
            "tokens": {"generated": st.tokens_generated, "cached": st.cached_tokens,
                       "shared_prefix": st.prefix_tokens, "prefilled": st.prefilled_tokens,
                       "shifted": st.shifted_tokens},
            "finish_reason": handle.finish_reason,
        }
        if self.agent.runtime.limits.include_engine_diagnostics:
            out["engine"] = {
                # the class the scheduler served it in: interactive (streamed text),
                # buffered, background (slowed first under throttle)
                "class": Priority(handle.priority).name.lower(),
                "scheduler": {"queue_wait_ms": round(st.queue_wait_s * 1000, 3),
                              "prefill_ms": round(st.prefill_s * 1000, 3),
                              "decode_ms": round(st.decode_s * 1000, 3),
                              "cached_tokens": st.cached_tokens,
                              "prefilled_tokens": st.prefilled_tokens,
                              "shared_prefix_tokens": st.prefix_tokens,
                              "generated_tokens": st.tokens_generated},
                "chat_turn": {"has_grammar": bool(sampling.grammar),
                              "grammar_lazy": bool(sampling.grammar
                                                   and sampling.grammar_triggers)}}
        if stream is not None:
            handoff, sent = stream.handoff_ns, stream.sent_ns
            out["stream"] = {"frames": stream.frames, "coalesced": stream.coalesced,
                             "handoff_us_p50": _pct(handoff, 50),
                             "handoff_us_p99": _pct(handoff, 99),
                             "sent_us_p50": _pct(sent, 50), "sent_us_p99": _pct(sent, 99)}
        return out

    def _debug_info(self, status) -> str:
        for d in self._nodes_diag:
            d.pop("t0", None)
        return json.dumps({
            "agent_id": self.agent.id, "status": Status(status).name, "steps": self.steps,
            "tokens_generated": self.tokens_generated,
            "total_ms": round((time.perf_counter() - self.t_start) * 1000, 3),
            "nodes": self._nodes_diag,
            "tool_calls": [{"name": c.name, "params": _params(c.text),
                            "call_id": c.extra.get("call_id", "")}
                           for c in self.interaction.components if c.kind == "tool_call"],
            **({"interaction": _snapshot(self.interaction)}
               if self.agent.runtime.limits.include_interaction_in_diagnostics else {}),
            **({"kv_restore": self._kv_restore} if self._kv_restore else {}),
            **({"speech": self.audio.diagnostics()} if self.audio is not None else {}),
        }, ensure_ascii=False, default=str)


def _params(arguments_json: str):
    """A call's arguments as the JSON object they are (as written when they are not)."""
    try:
        return json.loads(arguments_json)
    except ValueError:
        return arguments_json


# the names the interaction snapshot gives a component kind (the rest keep their own)
_SNAPSHOT_KINDS = {"tool_call": "ToolCallRecord", "tool_result": "ToolResultComponent"}


def _snapshot(inter) -> dict:
    """The turn's interaction, component by component, for the diagnostics: a tool call
    and its result (a client's, or the server's acknowledgement) share a call_id."""
    return {"id": inter.id, "outcome": inter.outcome, "components": [
        {"type": _SNAPSHOT_KINDS.get(c.kind, c.kind), "node_name": c.node_name,
         "name": c.name, "role": c.role, "producer": c.producer, "text": c.text,
         **({"call_id": c.extra["call_id"]} if "call_id" in c.extra else {}),
         **({"state": c.extra["state"]} if "state" in c.extra else {})}
        for c in inter.components]}


def _both(first, second):
    def feed(text: str) -> None:
        first(text)
        second(text)
    return feed


def _settle(future: asyncio.Future, handle) -> None:
    if not future.done():
        future.set_result(handle)


def _pct(values_ns: list[int], q: int) -> float | None:
    if not values_ns:
        return None
    if len(values_ns) == 1:
        return round(values_ns[0] / 1000, 1)
    return round(statistics.quantiles(values_ns, n=100, method="inclusive")[q - 1] / 1000, 1)
