"""The Server: wires the reactor, sessions, models and workers together; owns shutdown.

Threads (docs/architecture.md has the picture):
- the reactor thread (`tryll-reactor`) owns every socket and runs the dispatch of each
  frame; handlers there only touch memory;
- the worker pool (`tryll-worker-N`, every thread started with the server) runs blocking
  requests, one lane per session;
- the download pool (`tryll-download-N`) runs model downloads;
- each loaded language model has its scheduler thread (engines/llama);
- the main thread of `tryll-fast serve` waits for SIGINT/SIGTERM and runs `shutdown()`.

Graceful shutdown: stop accepting; from then on new requests get 2001
ServerShuttingDown; running operations (turns, downloads, streams, blocking requests) get
`shutdown.deadline_ms` to finish, then they are cancelled; connections are closed after
their queued frames are written; models are freed.
"""
from __future__ import annotations

import gc
import itertools
import logging
import math
import socket
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable

from tryll_fast import PROTOCOL_VERSION, codec
from tryll_fast.engines import registry
from tryll_fast.knowledge import StorageFiles
from tryll_fast.knowledge.embedded import StoreFiles
from tryll_fast.models import ModelManager, load_catalog
from tryll_fast.models.catalog import ENGINE_WIRE_VALUES
from tryll_fast.models.manager import DEFAULT_LOADERS
from tryll_fast.server import memory
from tryll_fast.server.config import ConfigError, ServerConfig
from tryll_fast.server.dispatch import build_table
from tryll_fast.server.logs import fields
from tryll_fast.server.session import Operation, Session
from tryll_fast.transport import Reactor
from tryll_fast.voice_input.listener import Listener
from tryll_fast.workflow.runtime import Limits, Runtime

log = logging.getLogger("tryll_fast.server")

# InferenceEngine value -> the catalog's engine name (for CreateSession's engine hints)
_ENGINE_NAMES = {v: name for name, v in ENGINE_WIRE_VALUES.items()}
# The pin of models the server itself loads (models.preload), not any session's.
SERVER_PIN = 0
# After the deadline, how long cancelled operations get to wind down and connections get
# to flush their last frames.
CANCEL_GRACE_S = 5.0
CLOSE_GRACE_S = 3.0
# Operations a player waits on: while another session has one, a session's lane is paced.
_PLAYING = frozenset({"turn", "stream"})



def _start_every_thread(pool: ThreadPoolExecutor, n: int) -> None:
    """Start all n threads of `pool` now. ThreadPoolExecutor starts one per submit that
    finds none idle, as load first needs it, so the thread count kept rising long after
    start-up (a session lane resumed from a timer, a teardown beside a turn): a process
    whose size must return to its idle one after load then had no fixed idle size."""
    barrier = threading.Barrier(n)
    for future in [pool.submit(barrier.wait, 30) for _ in range(n)]:
        future.result()


class ThrottleBoard:
    """SetInferenceThrottle bookkeeping: the server-wide value is the maximum over the
    sessions that reported one; a session's value leaves with it."""

    def __init__(self, apply: Callable[[float], None]) -> None:
        self._apply = apply
        self._values: dict[int, float] = {}
        self._lock = threading.Lock()
        self.effective = 0.0

    @staticmethod
    def clamp(value: float) -> float | None:
        """0..1; None for a non-finite value (ignored, never an error: the protocol)."""
        if not math.isfinite(value):
            return None
        return min(1.0, max(0.0, value))

    def set(self, session_id: int, value: float) -> float:
        with self._lock:
            self._values[session_id] = value
            return self._update()

    def drop(self, session_id: int) -> float:
        with self._lock:
            self._values.pop(session_id, None)
            return self._update()

    def _update(self) -> float:
        new = max(self._values.values(), default=0.0)
        if new != self.effective:
            self.effective = new
            self._apply(new)
        return new


def default_llm(catalog, name: str) -> str:
    """The language model of graphs that name none: `name` (workflow.default_llm, checked
    against the catalog), else the catalog's `default = true` one ("" when it has none)."""
    if name:
        entry = catalog.get(name)
        if entry is None or entry.role != "llm":
            known = ", ".join(e.name for e in catalog if e.role == "llm")
            raise ConfigError("settings", "workflow.default_llm",
                              f"{name!r} is not a language model of the catalog ({known})")
        return name
    return next((e.name for e in catalog.defaults() if e.role == "llm"), "")


class Server:
    def __init__(self, config: ServerConfig, *, manager: ModelManager | None = None) -> None:
        self.config = config
        self.started_at = time.time()
        self._engines: "weakref.WeakSet[Any]" = weakref.WeakSet()
        if manager is None:
            catalog = load_catalog(config.catalog) if config.catalog else load_catalog()
            loaders = {name: self._tracking(loader) for name, loader in DEFAULT_LOADERS.items()}
            manager = ModelManager(catalog, config.models_dir,
                                   engine_options=config.engine_options(), loaders=loaders)
        self.models = manager
        self.catalog = manager.catalog
        self.default_llm = default_llm(self.catalog, config.workflow_default_llm)
        self.routes = build_table()
        self.workers = ThreadPoolExecutor(config.workers_threads,
                                          thread_name_prefix="tryll-worker")
        _start_every_thread(self.workers, config.workers_threads)
        self.downloads = ThreadPoolExecutor(config.workers_max_downloads,
                                            thread_name_prefix="tryll-download")
        self.throttle = ThrottleBoard(self._apply_throttle)
        self.runtime = Runtime(self.models, self.workers, Limits(
            character_frame=config.workflow_character_frame,
            tool_prompt=config.workflow_tool_prompt,
            max_steps_per_turn=config.workflow_max_steps_per_turn,
            max_agents_per_session=config.workflow_max_agents_per_session,
            regex_timeout_s=config.workflow_regex_timeout_ms / 1000.0,
            tool_call_pause_timeout_ms=config.workflow_tool_call_pause_timeout_ms,
            turn_timeout_ms=config.workflow_turn_timeout_ms,
            include_engine_diagnostics=config.workflow_include_engine_diagnostics,
            include_interaction_in_diagnostics=(
                config.workflow_include_interaction_in_diagnostics),
            kv_evict_tier=config.workflow_kv_evict_tier, voice_chunk_ms=config.voice_chunk_ms))
        self._agent_ids = itertools.count(1)
        self._voice_input_ids = itertools.count(1)
        self.listener = Listener()                  # runs every voice input's VAD
        self.audio_buffers_dropped = 0              # AudioBuffers for no voice input
        self.storage_files = StorageFiles(config.storage_root)  # files nodes link
        self.store_files = StoreFiles(config.storage_root, self.models)  # KB config files
        self.agents: dict[int, Any] = {}            # every live agent, by id (memory rows)
        self.connection_ready = codec.encode(codec.ConnectionReady(
            protocol_version=PROTOCOL_VERSION, codegen_fingerprint=codec.SCHEMA_FINGERPRINT,
            mode=config.mode))
        self.shutting_down = False
        self.reactor: Reactor | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._session_ids = itertools.count(1)
        self.connections: set[Session] = set()      # every open connection's receiver
        self.sessions: dict[int, Session] = {}      # the created ones, by session id
        self._operations: set[Operation] = set()
        self._pins: dict[str, set[int]] = {}        # model -> ids of the sessions pinning it
        self._pin_locks: dict[str, threading.Lock] = {}   # one pin/unpin at a time per model
        self._stopped = threading.Event()
        self._warmed: set[int] = set()
        self.front_doors: list[Any] = []            # other transports (the pipeline gateway)
        self.teardowns = 0                          # sessions fully torn down
        self.lane_high_water = 0                    # of closed sessions' lanes (dev stats)
        self.lanes_paced = [0, 0.0]                 # of closed sessions' lanes: times, seconds
        self._playing: dict[Session, int] = {}     # sessions with turns or streams running
        self._trim_queued = False                   # a heap trim waits for a worker

    # ---- lifecycle ----

    def start(self) -> tuple[str, int]:
        """Bind, start the reactor thread, preload models; returns (host, port)."""
        cfg = self.config
        self.reactor, self._thread = self._listen()
        for name in cfg.models_preload:
            self.pin_for(None, name)
        host, port = self.address
        ready = [e.name for e in self.catalog.visible() if self.models.store.is_downloaded(e.name)]
        log.info("listening", extra=fields(
            host=host, port=port, mode=cfg.mode, protocol=PROTOCOL_VERSION,
            models_ready=ready, models_loaded=[m.name for m in self.models.loaded()],
            models_dir=str(cfg.models_dir), storage_root=str(cfg.storage_root)))
        return host, port

    def _listen(self):
        """The transport: a Reactor on its own thread. It must offer address,
        connection_count, stop_accepting(), stop() and stats(), and call
        connection_made(conn) for every accepted connection (the benchmarks' uvloop
        baseline provides the same surface)."""
        cfg = self.config
        family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
        sock = socket.create_server((cfg.host, cfg.port), family=family, backlog=512)
        reactor = Reactor(
            sock, self, high_water=cfg.transport_send_queue_high_bytes,
            low_water=cfg.transport_send_queue_low_bytes,
            stall_timeout=cfg.transport_stall_timeout_ms / 1000.0,
            max_connections=cfg.transport_max_connections,
            direct_send=cfg.transport_direct_send,
            max_frames_per_second=cfg.transport_max_frames_per_second)
        thread = threading.Thread(target=self._run_reactor, args=(reactor,),
                                  name="tryll-reactor", daemon=True)
        thread.start()
        return reactor, thread

    def _run_reactor(self, reactor) -> None:
        try:
            reactor.run()
        except BaseException:
            log.exception("the reactor stopped with an error")
        finally:
            self._stopped.set()

    def add_front_door(self, door) -> None:
        """Another transport whose connections are sessions of this server (the pipeline
        gateway). Shutdown calls its stop_accepting() with the reactor's, closes its
        connections with every session's, waits while its connection_count is above 0,
        then calls its stop()."""
        self.front_doors.append(door)

    @property
    def address(self) -> tuple[str, int]:
        addr = self.reactor.address if self.reactor is not None else None
        if addr is None:
            raise RuntimeError("the server is not listening")
        return addr[0], addr[1]

    def shutdown(self, deadline_s: float | None = None) -> dict[str, int]:
        """Graceful shutdown (see the module docstring); idempotent. Returns counts of what
        finished in time and what had to be cancelled."""
        if deadline_s is None:
            deadline_s = self.config.shutdown_deadline_ms / 1000.0
        with self._lock:
            if self.shutting_down:
                first = False
            else:
                self.shutting_down = True
                first = True
            running = len(self._operations)
        if not first:
            self._stopped.wait()
            return {}
        log.info("shutting down", extra=fields(operations=running, deadline_s=deadline_s,
                                                connections=len(self.connections)))
        reactor = self.reactor
        if reactor is not None:
            reactor.stop_accepting()
        for door in self.front_doors:
            door.stop_accepting()
        finished_in_time = self._wait_operations(time.monotonic() + deadline_s)
        with self._lock:
            late = list(self._operations)
        for op in late:
            op.cancel()
        self._wait_operations(time.monotonic() + CANCEL_GRACE_S)
        if reactor is not None:
            for session in list(self.connections):
                session.conn.close()
            end = time.monotonic() + CLOSE_GRACE_S
            while (reactor.connection_count or any(d.connection_count for d in self.front_doors)
                   ) and time.monotonic() < end:
                time.sleep(0.01)
            reactor.stop()
            if self._thread is not None:
                self._thread.join(10)
        for door in self.front_doors:
            door.stop()
        self.downloads.shutdown(wait=True, cancel_futures=True)
        self.workers.shutdown(wait=True)
        self.runtime.stop()
        self.listener.stop()
        self.store_files.clear()       # cached knowledge bases hold embedding-model leases
        gc.collect()                   # and so may storages of sessions in reference cycles
        try:
            self.models.close()
        except TimeoutError as exc:
            log.warning("models still in use at shutdown: %s", exc)
        self._stopped.set()
        log.info("stopped", extra=fields(cancelled=len(late), finished=running - len(late)))
        return {"running_at_start": running, "cancelled": len(late),
                "finished_in_time": int(finished_in_time)}

    def _wait_operations(self, until: float) -> bool:
        with self._idle:
            while self._operations:
                left = until - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    def __enter__(self) -> "Server":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ---- transport handler ----

    def connection_made(self, conn) -> Session:
        session = Session(self, conn)
        with self._lock:
            self.connections.add(session)
        conn.send(self.connection_ready)
        log.debug("connection", extra=fields(connection=conn.id, peer=conn.peer))
        return session

    def create_session(self, session: Session) -> int:
        with self._lock:
            session.id = next(self._session_ids)
            self.sessions[session.id] = session
        return session.id

    def session_closed(self, session: Session) -> None:
        """Reactor thread: the connection is gone; free what the session owns."""
        with self._lock:
            self.connections.discard(session)
            self.sessions.pop(session.id, None)
            self.lane_high_water = max(self.lane_high_water, session.lane.high_water)
            self.lanes_paced[0] += session.lane.paced
            self.lanes_paced[1] += session.lane.paced_s
            ops = list(session.operations)
            pins = list(session.pins)
            agents = list(session.agents.values())
            voice_inputs = list(session.voice_inputs.values())
        for agent in agents:
            self.destroy_agent(session, agent)
        for handle in voice_inputs:
            self.destroy_voice_input(session, handle)
        session.strings.clear()
        session.embedded.clear()
        session.memory.clear()
        for op in ops:
            op.cancel()
        if session.throttle is not None:
            self.throttle.drop(session.id)
            session.throttle = None
        log.info("session closed", extra=fields(session=session.id, connection=session.conn.id,
                                                reason=session.close_reason,
                                                cancelled=len(ops)))
        # Unpinning may free a model (joins its scheduler thread): not on the reactor.
        if pins:
            self.workers.submit(self._release_pins, session, pins)
        else:
            self._torn_down()

    def _release_pins(self, session: Session, pins: Iterable[str]) -> None:
        try:
            for name in pins:
                try:
                    self.unpin_for(session, name)
                except Exception:
                    log.exception("releasing pin of %s failed", name)
        finally:
            self._torn_down()

    def _torn_down(self) -> None:
        with self._lock:
            self.teardowns += 1
            self._idle.notify_all()
            # one trim queued at a time: a burst of teardowns costs one, and the last
            # teardown always has one after it
            trim, self._trim_queued = not self._trim_queued, True
        if trim and not self.shutting_down:
            try:
                self.workers.submit(self._trim_heap)
            except RuntimeError:            # the pool is shutting down
                pass

    def _trim_heap(self) -> None:
        with self._lock:
            self._trim_queued = False
        memory.give_back_heap()

    # ---- agents ----

    def new_agent_id(self) -> int:
        with self._lock:
            return next(self._agent_ids)

    def register_agent(self, session: Session, agent) -> bool:
        """Add a freshly built agent; False when its session closed meanwhile."""
        with self._lock:
            if session.closed:
                return False
            session.agents[agent.id] = agent
            self.agents[agent.id] = agent
            return True

    def destroy_agent(self, session: Session, agent) -> None:
        """Cancel its turn (any thread), then free its engine conversations and model leases
        on a worker once the turn has finished."""
        turn = agent.destroy()
        with self._lock:
            session.agents.pop(agent.id, None)
            session.destroyed_agents.add(agent.id)
            self.agents.pop(agent.id, None)

        def release() -> None:
            if turn is not None:
                turn.operation.done.wait(60)
            agent.kv_job_done.wait(60)      # a KV-cache request still using the engines
            agent.release()

        try:
            self.workers.submit(release)
        except RuntimeError:          # the pool is already shut down
            release()

    # ---- voice inputs ----

    def new_voice_input_id(self) -> int:
        with self._lock:
            return next(self._voice_input_ids)

    def register_voice_input(self, session: Session, handle) -> bool:
        """Add a new voice input; False when its session closed meanwhile."""
        with self._lock:
            if session.closed:
                return False
            session.voice_inputs[handle.id] = handle
            return True

    def destroy_voice_input(self, session: Session, handle) -> None:
        """Drop its utterance now (any thread); release its model on a worker (the last
        lease may close the model and join its decoding thread)."""
        handle.destroy()
        with self._lock:
            session.voice_inputs.pop(handle.id, None)
        try:
            self.workers.submit(handle.lease.release)
        except RuntimeError:          # the pool is already shut down
            handle.lease.release()

    # ---- operations ----

    def operation_started(self, op: Operation) -> None:
        """A session opened an operation (a turn, a stream, a lane request): shutdown waits
        for it, and a turn or stream paces the other sessions' lanes."""
        with self._lock:
            self._operations.add(op)
            if op.kind in _PLAYING:
                self._playing[op.session] = self._playing.get(op.session, 0) + 1

    def operation_finished(self, op: Operation) -> None:
        with self._lock:
            if op in self._operations and op.kind in _PLAYING:
                left = self._playing.get(op.session, 0) - 1
                if left > 0:
                    self._playing[op.session] = left
                else:
                    self._playing.pop(op.session, None)
            self._operations.discard(op)
            self._idle.notify_all()

    def turns_elsewhere(self, session: Session) -> bool:
        """Whether a session other than `session` has a turn or a stream running (its
        lane is then paced: docs/configuration.md, "Bounded work per session")."""
        if self.shutting_down:
            return False
        playing = self._playing           # read without the lock: a hint, not a decision
        return len(playing) > (1 if session in playing else 0)

    @property
    def operation_count(self) -> int:
        with self._lock:
            return len(self._operations)

    # ---- models: pins shared by sessions, throttle on every engine ----

    def _tracking(self, loader):
        def load(entry, path, options):
            engine = loader(entry, path, options)
            if hasattr(engine, "set_throttle"):
                self._engines.add(engine)
                engine.set_throttle(self.throttle.effective)
            model = getattr(engine, "model", None)
            if model is not None and hasattr(model, "special_tokens"):
                _ = model.special_tokens   # scan the vocabulary now, not in a first turn
            return engine
        return load

    def warm_engines(self, kinds: Iterable[int]) -> None:
        """The one effect of CreateSession's engine hints (docs/protocol.md): initialise the named
        engines' backends now, off the reactor, instead of at the first load. Engines this
        build does not have are ignored here; loading one of their models is 6008."""
        for kind in kinds:
            name = _ENGINE_NAMES.get(kind)
            if name in registry.ENGINES and kind not in self._warmed:
                self._warmed.add(kind)
                self.workers.submit(registry.warm, name)

    def engines(self) -> list[Any]:
        """The loaded engines that are still open."""
        return [e for e in list(self._engines) if not getattr(e, "closed", False)]

    def _apply_throttle(self, value: float) -> None:
        for engine in self.engines():
            try:
                engine.set_throttle(value)
            except Exception:
                log.exception("set_throttle failed")

    def _pin_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._pin_locks.setdefault(name, threading.Lock())

    def pin_for(self, session: Session | None, name: str, *, placement: str | None = None):
        """Load and pin `name` for a session (None: the server itself, models.preload).
        A model stays pinned while any session that pinned it is connected. placement
        applies if this call loads it. Returns the manager's LoadResult;
        ModelManagerError (6002/6007/6008/2001) passes through."""
        pinner = SERVER_PIN if session is None else session.id
        with self._pin_lock(name):
            result = self.models.load(name, pin=True, placement=placement)
            with self._lock:
                # The session may have disconnected while the model loaded: its teardown
                # has already released its pins, so this one must not outlive it.
                late = session is not None and session.closed
                if not late:
                    self._pins.setdefault(name, set()).add(pinner)
                    if session is not None:
                        session.pins.add(name)
                holders = len(self._pins.get(name, ()))
            if late and holders == 0:
                self.models.unload(name)
        return result

    def unpin_for(self, session: Session | None, name: str) -> str:
        """Drop one pinner; the model is unpinned when it was the last. Returns a warning
        for the Ack ('' when nothing unusual happened)."""
        pinner = SERVER_PIN if session is None else session.id
        with self._pin_lock(name):
            with self._lock:
                holders = self._pins.get(name, set())
                was_holder = pinner in holders
                holders.discard(pinner)
                if session is not None:
                    session.pins.discard(name)
                others = len(holders)
                if not holders:
                    self._pins.pop(name, None)
            if others:
                return (f"{name} stays loaded: pinned by {others} other session(s)"
                        if was_holder else
                        f"{name} was not pinned by this session; {others} other session(s)"
                        " pin it")
            if not was_holder:
                return "" if not self.models.is_loaded(name) else (
                    f"{name} was not pinned by LoadModel; it stays loaded while requests"
                    " use it")
            result = self.models.unload(name)
        if result.leases and not result.freed:
            return f"{name} is freed once its {result.leases} running request(s) finish"
        return ""

    def describe_key(self, key: Any) -> tuple[int, int, str, int]:
        """An engine conversation key -> (session_id, agent_id, node_name, consumer class)
        for GetMemoryConsumption rows (agents key theirs ("agent", agent_id, node))."""
        if not (isinstance(key, tuple) and len(key) == 3 and key[0] == "agent"):
            return 0, 0, "", 0
        agent = self.agents.get(key[1])
        if agent is None:
            return 0, key[1], key[2], 0
        node = agent.graph.nodes.get(key[2])
        consumer = codec.InferenceConsumerClass.Buffered
        if agent.workload == codec.AgentWorkload.Background:
            consumer = codec.InferenceConsumerClass.Background
        elif node is not None and getattr(node.params, "send", None) == codec.SendMode.Streamed:
            consumer = codec.InferenceConsumerClass.VisibleText
        return agent.session.id, agent.id, key[2], int(consumer)

    def pinners(self, name: str) -> int:
        with self._lock:
            return len(self._pins.get(name, ()))

    # ---- introspection ----

    def stats(self) -> dict[str, Any]:
        with self._lock:
            ops = [(op.kind, op.name, op.session.id) for op in self._operations]
            sessions = len(self.sessions)
            connections = len(self.connections)
            lane_high_water = max([self.lane_high_water,
                                   *(s.lane.high_water for s in self.connections)])
            paced = [self.lanes_paced[0] + sum(s.lane.paced for s in self.connections),
                     self.lanes_paced[1] + sum(s.lane.paced_s for s in self.connections)]
            pins = {k: sorted(v) for k, v in self._pins.items()}
        return {
            "connections": connections, "sessions": sessions, "teardowns": self.teardowns,
            "operations": len(ops), "operation_kinds": sorted({k for k, _, _ in ops}),
            "lane_high_water": lane_high_water,
            "lanes_paced": paced[0], "lanes_paced_s": round(paced[1], 3),
            "python_threads": sorted(t.name for t in threading.enumerate()),
            "pins": pins, "throttle": self.throttle.effective,
            "shutting_down": self.shutting_down,
            "reactor": self.reactor.stats() if self.reactor is not None else {},
            "models_loaded": [m.name for m in self.models.loaded()],
            "engines": {name: info.get("engine_memory")
                        for name, info in self.models.memory().items()},
            "voice_inputs": sum(len(s.voice_inputs) for s in list(self.sessions.values())),
            "audio_buffers_dropped": self.audio_buffers_dropped,
        }
