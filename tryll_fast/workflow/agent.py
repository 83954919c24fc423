"""An agent: a compiled graph, its variables, its dialog, its engines, and its one turn.

State machine: idle -> running (SendMessage) -> [paused -> running]* -> idle, and
idle -> kv_operation (a KV-cache request, on a worker) -> idle; destroyed is final. `lock`
guards the state: the reactor thread checks and flips it (a request that needs another
state gets 3004 at once), the orchestrator ends turns. The dialog is only touched by the
agent's turn or, while idle, by the dialog requests under the lock.

Engines: each model the graph uses is held by a ModelManager lease for the agent's life
(taken at creation, or at first use with DeferAllocation), so a model is never freed under
an agent. Each language-model node keeps its own engine conversation (KV), keyed
("agent", agent_id, node_name), which destroy() releases.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING, Any

from tryll_fast import codec
from tryll_fast.workflow.dialog import Dialog
from tryll_fast.workflow.graph import Graph
from tryll_fast.workflow.projection import Projection
from tryll_fast.workflow.variables import Variables

if TYPE_CHECKING:
    from tryll_fast.workflow.runtime import Runtime
    from tryll_fast.workflow.turn import Turn

log = logging.getLogger("tryll_fast.workflow")

IDLE, RUNNING, PAUSED, DESTROYED = "idle", "running", "paused", "destroyed"
KV_OPERATION = "kv_operation"   # a Prefill / Evict / Status request is using the engines


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
        self.voice = voice              # stored; no node of this build speaks
        self.dialog = Dialog()
        self.state = IDLE
        self.lock = threading.Lock()
        self.turn: "Turn | None" = None
        self.leases: dict[str, Any] = {}
        self.projections: dict[str, Projection] = {}
        self._node_state: dict[str, dict] = {}
        self.turns_run = 0
        # KV cells freed by EvictAgentKvCache (or never allocated: DeferAllocation); the
        # next turn restores them first (workflow/kv.py)
        self.kv_evicted = kv_init == codec.KvCacheInitialization.DeferAllocation
        self.kv_job_done = threading.Event()     # clear while a KV-cache request runs
        self.kv_job_done.set()

    def __repr__(self) -> str:
        return f"<Agent {self.id} {self.state}>"

    # ---- models ----

    def model_names(self) -> set[str]:
        names: set[str] = set()
        for node in self.graph.nodes.values():
            names.update(node.type.model_names(node, self.default_model))
        return names

    def lease_all(self) -> None:
        """Blocking (a worker): take a lease on every model the graph uses."""
        for name in sorted(self.model_names()):
            if name not in self.leases:
                self.leases[name] = self.runtime.models.lease(name)

    async def engine(self, model: str):
        lease = self.leases.get(model)
        if lease is None:
            loop = asyncio.get_running_loop()
            lease = await loop.run_in_executor(self.runtime.workers,
                                               self.runtime.models.lease, model)
            if self.state == DESTROYED:
                self.runtime.workers.submit(lease.release)
                raise asyncio.CancelledError()
            self.leases[model] = lease
        return lease.obj

    def conv_key(self, node_name: str) -> tuple:
        return ("agent", self.id, node_name)

    def projection(self, node_name: str, engine, formatter) -> Projection:
        p = self.projections.get(node_name)
        if p is None or p.engine is not engine:
            p = self.projections[node_name] = Projection(engine, formatter)
        return p

    def node_state(self, node_name: str) -> dict:
        return self._node_state.setdefault(node_name, {})

    @property
    def priority(self):
        from tryll_fast.engines.llama.request import Priority
        return (Priority.BACKGROUND if self.workload == codec.AgentWorkload.Background
                else Priority.INTERACTIVE)

    # ---- teardown ----

    def destroy(self) -> "Turn | None":
        """Mark destroyed and cancel the running turn (any thread; cheap). release()
        must follow on a worker."""
        with self.lock:
            if self.state == DESTROYED:
                return None
            self.state = DESTROYED
            turn = self.turn
        if turn is not None:
            turn.cancel(codec.CancelMode.StopAndDiscard)
        return turn

    def release(self) -> None:
        """Blocking (a worker): free the engine conversations and the model leases."""
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
