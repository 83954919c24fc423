"""The turn executor: one SendMessage walked through the graph (SPEC §5-§7, seed 000).

From the start node, each node runs and names its exit; the exit's target runs next; an
empty exit ends the turn. More than `max_steps_per_turn` node runs: ErrorResponse 4001
"Max steps per turn (N) exceeded", then TurnComplete(Error).

Frames (SPEC §6): every text-producing node sends exactly one is_final chunk (Streamed:
deltas then an empty terminator; Whole: one chunk). A turn in which no node sent one ends
with an empty final chunk (is_delta = false, is_final = true) from its last node. Then
exactly one TurnComplete {request_id, agent_id, status, debug_info, tokens_generated}.

Outcomes: a node failure sends ErrorResponse 4001 with the reason, then TurnComplete(Error);
the interaction is dropped from the dialog (the dialog is as before the turn) and the agent
is idle again. Cancel: the engine stops before its next token, a streaming node still sends
its terminator, TurnComplete(Cancelled); StopAndKeep keeps the partial reply, StopAndDiscard
drops the interaction. Stateless agents clear the dialog after every turn.
"""
from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from typing import Any

from tryll_fast import codec
from tryll_fast.engines.llama.errors import EngineError
from tryll_fast.engines.llama.sampling import SamplingParams
from tryll_fast.errors import ErrorCode
from tryll_fast.workflow import templates
from tryll_fast.workflow._stream import AnswerStream
from tryll_fast.workflow.agent import DESTROYED, IDLE, Agent
from tryll_fast.workflow.dialog import USER_SLOT, Component
from tryll_fast.workflow.projection import ProjectionError

log = logging.getLogger("tryll_fast.workflow")

Status = codec.TurnStatus
Send = codec.SendMode


class TurnFailure(Exception):
    """A node failed: the turn ends with 4001 and TurnComplete(Error)."""


class TurnCancelled(Exception):
    pass


class Turn:
    def __init__(self, agent: Agent, request_id: int, user_text: str, operation) -> None:
        self.agent = agent
        self.session = agent.session
        self.conn = agent.session.conn
        self.request_id = request_id
        self.user_text = user_text
        self.operation = operation
        self.interaction = agent.dialog.begin(user_text)
        self.instructions: list[tuple[str, str]] = []
        self.steps = 0
        self.tokens_generated = 0
        self.finals = 0
        self.cancelled = False
        self.cancel_mode = codec.CancelMode.StopAndKeep
        self._handles: set = set()
        self._last_node = ""
        self._nodes_diag: list[dict[str, Any]] = []
        self._diag: dict[str, Any] | None = None
        self.regex_timeout_s = agent.runtime.limits.regex_timeout_s
        self.t_start = time.perf_counter()

    # ---- control (any thread) ----

    def cancel(self, mode) -> None:
        self.cancel_mode = mode
        self.cancelled = True
        for handle in list(self._handles):
            handle.cancel()

    # ---- the walk (orchestrator) ----

    async def run(self) -> None:
        agent = self.agent
        limit = agent.runtime.limits.max_steps_per_turn
        status = Status.Success
        try:
            node = agent.graph.nodes[agent.graph.start]
            while node is not None:
                if self.cancelled:
                    raise TurnCancelled()
                self.steps += 1
                if self.steps > limit:
                    raise TurnFailure(f"Max steps per turn ({limit}) exceeded")
                self._last_node = node.name
                self._begin_node(node)
                exit_name = await node.type.run(self, node)
                self._end_node(exit_name)
                node = agent.graph.next(node, exit_name)
            if self.cancelled:
                raise TurnCancelled()
        except TurnCancelled:
            status = Status.Cancelled
        except asyncio.CancelledError:
            status = Status.Cancelled
        except TurnFailure as exc:
            status = Status.Error
            self._error(str(exc))
        except (ProjectionError, EngineError) as exc:
            status = Status.Error
            self._error(f"node {self._last_node!r}: {exc}")
        except Exception as exc:   # a node bug must end the turn, not the loop
            log.exception("turn of agent %d failed in node %s", agent.id, self._last_node)
            status = Status.Error
            self._error(f"node {self._last_node!r}: internal error: {exc!r}")
        finally:
            self._finish(status)

    def _error(self, message: str) -> None:
        if self._diag is not None:
            self._diag["error"] = message
        self.session.send_error(self.request_id, ErrorCode.InferenceFailed, message)

    def _finish(self, status) -> None:
        agent = self.agent
        inter = self.interaction
        try:
            if self.finals == 0:
                self.send_whole(self._last_node or agent.graph.start, "")
            if status == Status.Success or (
                    status == Status.Cancelled
                    and self.cancel_mode == codec.CancelMode.StopAndKeep):
                inter.outcome = "completed" if status == Status.Success else "cancelled_kept"
                inter.completed_ms = int(time.time() * 1000)
            else:
                agent.dialog.remove(inter)
            if not agent.maintain_history:
                agent.dialog.clear()
            debug = self._debug_info(status) if agent.diagnostics else ""
        finally:
            agent.turns_run += 1
            with agent.lock:
                if agent.state != DESTROYED:
                    agent.state = IDLE
                agent.turn = None
            self.session.send_reply(codec.TurnComplete(
                request_id=self.request_id, agent_id=agent.id, status=status,
                debug_info=debug if agent.diagnostics else "",
                tokens_generated=self.tokens_generated))
            self.operation.finish()

    # ---- what nodes use ----

    def template_context(self) -> dict[str, Any]:
        return templates.context(variables=self.agent.variables.template_view(),
                                 instructions=self.instructions, locale=self.session.locale,
                                 user_message=self.user_text)

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
        self.session.send_frame(codec.encode_answer_text(self.agent.id, node_name, text,
                                                         False, True))

    def add_reply(self, node, text: str) -> None:
        self.interaction.add(Component(kind="assistant", slot=node.name, text=text,
                                       node_name=node.name))

    def add_instruction(self, node, name: str, text: str) -> None:
        self.instructions.append((name, text))
        self.interaction.add(Component(kind="instruction", slot=node.name, text=text,
                                       node_name=node.name, name=name, role="hidden"))
        self.note(node, instruction=name, text=text)

    async def generate(self, node, spec, *, system_prompt: str, template_text: str,
                       placement: int, input_text: str, send: int) -> str:
        """Run the node's model on its projection; stream per `send`; return the reply."""
        agent = self.agent
        runtime = agent.runtime
        self._mark("node_start")
        engine = await agent.engine(spec.model)
        if self.cancelled:
            raise TurnCancelled()
        formatter = runtime.formatter(engine)
        projection = agent.projection(node.name, engine, formatter)
        t_proj = time.perf_counter()
        prompt = projection.build(agent.dialog, self.interaction, system_prompt=system_prompt,
                                  template_text=template_text, placement=placement,
                                  input_text=input_text, n_ctx=spec.n_ctx,
                                  reserve=spec.max_tokens)
        self._mark("projected")
        stop = spec.stop if spec.stop is not None else tuple(
            dict.fromkeys(formatter.stop_strings + spec.extra["catalog_stop"]))
        sampling = SamplingParams(stop=stop, **spec.sampling)
        stream = AnswerStream(self.conn, agent.id, node.name) if send == Send.Streamed else None
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def finished(handle) -> None:        # scheduler thread
            loop.call_soon_threadsafe(_settle, done, handle)

        unregister = self.session.on_resume(engine.wake)
        t_submit = time.perf_counter()
        try:
            handle = engine.submit(prompt.tokens, key=agent.conv_key(node.name),
                                   sampling=sampling, priority=agent.priority,
                                   shared_prefix_len=prompt.shared_prefix_len,
                                   on_text=stream.feed if stream is not None else None,
                                   on_finish=finished, gate=self.conn)
            if stream is not None:
                stream.handle = handle
            self._mark("submitted")
            self._handles.add(handle)
            if self.cancelled:
                handle.cancel()
            await done
        finally:
            unregister()
        self._handles.discard(handle)
        st = handle.stats
        self.tokens_generated += st.tokens_generated
        if self._diag is not None:
            self._diag.update(self._llm_diag(spec, sampling, prompt, handle, stream,
                                             t_submit - t_proj))
        if handle.finish_reason == "cancelled" or self.cancelled:
            if stream is not None:
                stream.finish()
                self.finals += 1
            if self.cancel_mode == codec.CancelMode.StopAndKeep and handle.text:
                self.add_reply(node, handle.text)
            raise TurnCancelled()
        if handle.error is not None:
            raise TurnFailure(f"node {node.name!r}: {handle.error}")
        text = handle.text
        if stream is not None:
            stream.finish()
            self.finals += 1
        elif send == Send.Whole:
            self.send_whole(node.name, text)
        return text

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
            "prompt": prompt.text,
            "prompt_tokens": len(prompt.tokens),
            "shared_prefix_tokens": prompt.shared_prefix_len,
            "history_interactions": prompt.window,
            "dropped_interactions": prompt.dropped,
            "sampling": {k: v for k, v in sampling.__dict__.items() if k != "grammar"},
            "timings_ms": {
                "projection": round(projection_s * 1000, 3),
                "queue": round(st.queue_wait_s * 1000, 3),
                "prefill": round(st.prefill_s * 1000, 3),
                "first_token": round(st.first_token_s * 1000, 3),
                "decode": round(st.decode_s * 1000, 3),
                "total": round(st.total_s * 1000, 3),
            },
            "tokens": {"generated": st.tokens_generated, "cached": st.cached_tokens,
                       "shared_prefix": st.prefix_tokens, "prefilled": st.prefilled_tokens},
            "finish_reason": handle.finish_reason,
        }
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
        }, ensure_ascii=False, default=str)


def _settle(future: asyncio.Future, handle) -> None:
    if not future.done():
        future.set_result(handle)


def _pct(values_ns: list[int], q: int) -> float | None:
    if not values_ns:
        return None
    if len(values_ns) == 1:
        return round(values_ns[0] / 1000, 1)
    return round(statistics.quantiles(values_ns, n=100, method="inclusive")[q - 1] / 1000, 1)
