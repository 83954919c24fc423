"""An agent: a compiled graph, its variables, its dialog, its engines, and its one turn.

State machine (owned here: `state` changes only through the methods below):
idle -> running (SendMessage) -> [paused -> running]* -> idle, and idle -> kv_operation (a
KV-cache request, on a worker) -> idle; destroyed is final. ADMISSION says which requests
each state admits; `admit()` answers the rest with 3004 AgentBusy (3012 AgentNotPaused for
a resume). `lock` guards the state: the reactor thread checks and flips it, the
orchestrator ends turns. The dialog is only touched by the agent's turn or, while idle, by
the dialog requests under the lock.

Background work (a Summarize node's summarization) outlives the turn that started it: each
job is in `background` until it ends, and destroy() cancels them with the turn.

Engines: each model the graph uses (the voice's too, when a node speaks) is held by a
ModelManager lease for the agent's life (taken at creation, or at first use with
DeferAllocation), so a model is never freed under an agent. Each language-model node keeps
its own engine conversation (KV), keyed ("agent", agent_id, node_name), which destroy()
releases.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import threading
from typing import TYPE_CHECKING, Any

from tryll_fast import codec
from tryll_fast.engines.errors import EngineError
from tryll_fast.errors import AgentBusy, AgentNotPaused, ErrorCode, TryllError
from tryll_fast.models.manager import PLACEMENT_NAMES
from tryll_fast.workflow.dialog import Dialog
from tryll_fast.workflow.graph import Graph
from tryll_fast.workflow.projection import Projection
from tryll_fast.workflow.variables import Variables
from tryll_fast.workflow.voice import DeliveryState

if TYPE_CHECKING:
    from tryll_fast.workflow.runtime import Runtime
    from tryll_fast.workflow.turn import Turn

log = logging.getLogger("tryll_fast.workflow")

class AgentState(str, enum.Enum):
    IDLE = "idle"
    RUNNING = "running"             # a turn runs
    PAUSED = "paused"               # a turn waits for ResumeAgentRequest (or its deadline)
    KV_OPERATION = "kv_operation"   # a Prefill / Evict / Status request is using the engines
    DESTROYED = "destroyed"         # final

    def __str__(self) -> str:
        return self.value


IDLE, RUNNING, PAUSED, KV_OPERATION, DESTROYED = (
    AgentState.IDLE, AgentState.RUNNING, AgentState.PAUSED, AgentState.KV_OPERATION,
    AgentState.DESTROYED)
_LIVE = frozenset({IDLE, RUNNING, PAUSED, KV_OPERATION})

# Which agent requests each state admits (the protocol's admission rules, in one place).
# Not admitted: 3004 AgentBusy, except a resume, which gets 3012 AgentNotPaused.
ADMISSION: dict[str, frozenset[AgentState]] = {
    "SendMessageRequest": frozenset({IDLE}),
    "ResumeAgentRequest": frozenset({PAUSED}),
    "CancelRequest": _LIVE,                     # idle: a no-op
    "DestroyAgentRequest": _LIVE,
    "ChangeAgentParamRequest": frozenset({IDLE, PAUSED}),
    "UpdateAgentVariablesRequest": frozenset({IDLE, PAUSED}),
    "GetAgentVariablesRequest": _LIVE,
    "AppendInteractionsRequest": frozenset({IDLE}),
    "RemoveInteractionsFromEndRequest": frozenset({IDLE}),
    "ExportDialogRequest": frozenset({IDLE}),
    "ImportDialogRequest": frozenset({IDLE}),
    "SaveDialogRequest": frozenset({IDLE}),
    "LoadDialogRequest": frozenset({IDLE}),
    "PrefillAgentKvCacheRequest": frozenset({IDLE}),
    "EvictAgentKvCacheRequest": frozenset({IDLE}),
    "GetAgentKvCacheStatusRequest": frozenset({IDLE}),
    "SetAgentVoiceRequest": frozenset({IDLE}),
    "SetAgentDeliveryModeRequest": _LIVE,
}
_DOING = {RUNNING: "running a turn", PAUSED: "paused in a turn",
          KV_OPERATION: "in a KV-cache operation", IDLE: "idle"}


class Agent:
    def __init__(self, agent_id: int, session, runtime: "Runtime", graph: Graph,
                 variables: Variables, *, default_model: str, diagnostics: bool,
                 maintain_history: bool, workload: int, kv_init: int, voice=None) -> None:
        self.id = agent_id
        self.session = session
        self.runtime = runtime
        self.graph = graph
        self.variables = variables
        self.default_model = default_model
        self.diagnostics = diagnostics
        self.maintain_history = maintain_history
        self.workload = workload
        self.kv_init = kv_init
        self.voice = voice              # a checked Voice (workflow/voice.py) or None
        self.linked_strings: dict = {}  # storage reference -> StringStorage / EmbeddedStorage
        self.delivery = DeliveryState(voice.default_mode if voice is not None else "")
        self.dialog = Dialog()
        self._state = IDLE
        self.lock = threading.Lock()
        self.turn: "Turn | None" = None
        self.leases: dict[str, Any] = {}
        # node name -> (engine, ContextSpec): the lanes (LoRA adapters, context overrides)
        # this agent holds open on its engines
        self.lanes: dict[str, tuple[Any, Any]] = {}
        self.projections: dict[str, Projection] = {}
        self._node_state: dict[str, dict] = {}
        self.background: set = set()    # jobs with cancel() (nodes/summarize.py)
        self.turns_run = 0
        # KV cells freed by EvictAgentKvCache (or never allocated: DeferAllocation); the
        # next turn restores them first (workflow/kv.py)
        self.kv_evicted = kv_init == codec.KvCacheInitialization.DeferAllocation
        self.kv_job_done = threading.Event()     # clear while a KV-cache request runs
        self.kv_job_done.set()
        # the dialog was edited from outside since the KV was last synced (kv.status)
        self.kv_prefix_stale = False

    def __repr__(self) -> str:
        return f"<Agent {self.id} {self._state}>"

    def dialog_edited(self) -> None:
        """Interactions were appended or removed from outside a turn: the KV prefix no
        longer counts as current until a prefill or the next turn syncs it."""
        self.kv_prefix_stale = True

    def kv_synced(self) -> None:
        """A prefill or a turn brought the KV up to the dialog: the prefix is current again."""
        self.kv_prefix_stale = False

    # ---- state (call these with `lock` held) ----

    @property
    def state(self) -> AgentState:
        return self._state

    def admit(self, request: str, why: str = "") -> None:
        """Raise the protocol's error if the current state does not admit `request` (a
        MessageBody member name); `why` is appended to the message."""
        if self._state in ADMISSION[request]:
            return
        doing = _DOING.get(self._state, str(self._state))
        if request == "ResumeAgentRequest":
            raise AgentNotPaused(f"agent {self.id} is {doing}, not paused: nothing to resume")
        raise AgentBusy(f"agent {self.id} is {doing}: {why or request + ' is refused'}")

    def begin_turn(self, turn: "Turn") -> None:
        """SendMessage: idle -> running (admit("SendMessageRequest") first)."""
        self._move({IDLE}, RUNNING)
        self.turn = turn

    def pause(self) -> bool:
        """running -> paused; False if the agent is no longer running (destroyed)."""
        if self._state != RUNNING:
            return False
        self._state = PAUSED
        return True

    def unpause(self) -> None:
        """paused -> running (a resume, a deadline, a cancel); a no-op otherwise."""
        if self._state == PAUSED:
            self._state = RUNNING

    def end_turn(self) -> None:
        """running / paused -> idle (a destroyed agent stays destroyed)."""
        if self._state in (RUNNING, PAUSED):
            self._state = IDLE
        self.turn = None

    def begin_kv_operation(self) -> None:
        """idle -> kv_operation (admit() first)."""
        self._move({IDLE}, KV_OPERATION)
        self.kv_job_done.clear()

    def end_kv_operation(self) -> None:
        """kv_operation -> idle (a destroyed agent stays destroyed)."""
        if self._state == KV_OPERATION:
            self._state = IDLE
        self.kv_job_done.set()

    def _move(self, sources: set, target: AgentState) -> None:
        if self._state not in sources:
            raise RuntimeError(f"agent {self.id}: {self._state} -> {target} is not a "
                               "transition (admit() was skipped)")
        self._state = target

    # ---- models ----

    @property
    def speaks(self) -> bool:
        """A node of the graph speaks (Speak, GenerateAndSpeak)."""
        return any(getattr(n.type, "speaks", False) for n in self.graph.nodes.values())

    def model_names(self) -> set[str]:
        names: set[str] = set()
        for node in self.graph.nodes.values():
            names.update(node.type.model_names(node, self.default_model))
        if self.voice is not None and self.voice.model and self.speaks:
            names.add(self.voice.model)
        return names

    def lease_all(self) -> None:
        """Blocking (a worker): take a lease on every model the graph uses, and open the
        context every node with adapters or overrides runs on."""
        for name in sorted(self.model_names()):
            if name not in self.leases:
                self.leases[name] = self._lease(name)
        for node in self.graph.nodes.values():
            self.open_lane(node)

    def _lease(self, name: str):
        """A lease on model `name`, loaded (if this is the first) where the session's hint
        and this agent's nodes ask."""
        return self.runtime.models.lease(name, placement=self.placement_hint(name),
                                         n_gpu_layers=self.gpu_layers(name))

    def placement_hint(self, name: str) -> str | None:
        """The session's placement hint for model `name` (None: the server decides)."""
        hints = getattr(self.session, "placement_hints", None) or {}
        return PLACEMENT_NAMES.get(hints.get(name, 0))

    def gpu_layers(self, name: str) -> int | None:
        """The most layers any of this agent's nodes on model `name` asks to offload
        (context.n_gpu_layers; None: none asks)."""
        asked = [node.spec.n_gpu_layers for node in self.graph.nodes.values()
                 if getattr(getattr(node, "spec", None), "model", None) == name
                 and getattr(node.spec, "n_gpu_layers", -1) >= 0]
        return max(asked) if asked else None

    def open_lane(self, node):
        """Blocking (a worker): the ContextSpec `node` runs on, its lane opened on the
        node's engine the first time (None: the engine's own context). A file llama.cpp
        cannot apply, or overrides it cannot make a context with, is 3003 naming both."""
        spec = getattr(node, "spec", None)
        lane = getattr(spec, "lane", None)
        if lane is None:
            return None
        held = self.lanes.get(node.name)
        if held is not None:
            return held[1]
        lease = self.leases.get(spec.model)
        if lease is None:
            lease = self.leases[spec.model] = self._lease(spec.model)
        try:
            lease.obj.open_lane(lane)
        except EngineError as exc:
            files = ", ".join(repr(p) for p, _ in spec.adapters) or "no adapters"
            raise TryllError(ErrorCode.GraphCompilationFailed,
                             f"node {node.name!r}: model {spec.model!r} cannot run with "
                             f"{lane.describe()} ({files}): {exc.message}") from None
        self.lanes[node.name] = (lease.obj, lane)
        return lane

    async def lane(self, node):
        """The ContextSpec `node` runs on (None = the engine's own); opened on a worker the
        first time, for an agent whose models were not leased at creation."""
        held = self.lanes.get(node.name)
        if held is not None or getattr(node.spec, "lane", None) is None:
            return held[1] if held else None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.runtime.workers, self.open_lane, node)

    async def engine(self, model: str):
        lease = self.leases.get(model)
        if lease is None:
            loop = asyncio.get_running_loop()
            lease = await loop.run_in_executor(self.runtime.workers,
                                               self.runtime.models.lease, model)
            if self._state == DESTROYED:
                self.runtime.workers.submit(lease.release)
                raise asyncio.CancelledError()
            self.leases[model] = lease
        return lease.obj

    def conv_key(self, node_name: str) -> tuple:
        return ("agent", self.id, node_name)

    def projection(self, node_name: str, engine, formatter) -> Projection:
        p = self.projections.get(node_name)
        if p is None or p.engine is not engine:
            p = self.projections[node_name] = Projection(engine, formatter, node_name)
        return p

    def node_state(self, node_name: str) -> dict:
        return self._node_state.setdefault(node_name, {})

    @property
    def priority(self):
        from tryll_fast.engines.roles import Priority
        return (Priority.BACKGROUND if self.workload == codec.AgentWorkload.Background
                else Priority.INTERACTIVE)

    # ---- teardown ----

    def destroy(self) -> "Turn | None":
        """Mark destroyed and cancel the running turn and the background jobs (any thread;
        cheap). release() must follow on a worker."""
        with self.lock:
            if self._state == DESTROYED:
                return None
            self._state = DESTROYED
            turn = self.turn
            jobs = list(self.background)
        for job in jobs:
            job.cancel()
        if turn is not None:
            turn.cancel(codec.CancelMode.StopAndDiscard)
        return turn

    def release(self) -> None:
        """Blocking (a worker): free the engine conversations, lanes and model leases."""
        for name, (engine, lane) in list(self.lanes.items()):
            try:
                engine.release(self.conv_key(name))
                engine.close_lane(lane)
            except Exception as exc:   # a closed engine has nothing left to free
                log.debug("lane of %s/%s: %s", self.id, name, exc)
        self.lanes.clear()
        for node in self.graph.nodes.values():
            if not node.type.uses_model:
                continue
            lease = self.leases.get(node.spec.model)
            if lease is None:
                continue
            try:
                lease.obj.release(self.conv_key(node.name))
            except Exception as exc:   # a closed engine has nothing left to free
                log.debug("release of %s/%s: %s", self.id, node.name, exc)
        for lease in self.leases.values():
            lease.release()
        self.leases.clear()
        self.projections.clear()
