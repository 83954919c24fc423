"""Agent messages (docs/workflow.md): CreateAgent, DestroyAgent, SendMessage, Cancel,
ChangeAgentParam, UpdateAgentVariables, GetAgentVariables.

CreateAgent runs on the session's lane (it compiles the graph, checks models on disk and
takes model leases, which may load a model). The others answer from memory on the reactor
thread; a SendMessage hands its turn to the orchestrator. Agent ids are server-wide; an id
this session never had is 3001, one it destroyed 3002.
"""
from __future__ import annotations

import logging

from tryll_fast import codec
from tryll_fast.knowledge.mutable import KbRef
from tryll_fast.models import ModelError
from tryll_fast.server.dispatch import handles
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.server.logs import fields
from tryll_fast.workflow import kv
from tryll_fast.workflow.agent import Agent
from tryll_fast.workflow.graph import CompileContext, check_change, compile_graph
from tryll_fast.workflow.nodes import TYPES
from tryll_fast.workflow.turn import start as start_turn
from tryll_fast.workflow.variables import Variables
from tryll_fast.workflow.voice import check_voice

log = logging.getLogger("tryll_fast.server.agents")

_KV_INIT = {int(m) for m in codec.KvCacheInitialization}
_WORKLOAD = {int(m) for m in codec.AgentWorkload}
_CANCEL = {int(m) for m in codec.CancelMode}


def model_resolver(server, code: int, cache: dict | None = None):
    """resolve_model for CompileContext: catalog entry, llm role, engine in this build,
    on disk; returns (entry, KV cells the engine gets)."""
    catalog = server.catalog
    cap_limit = server.config.llama_max_n_ctx

    def resolve(name: str, where: str):
        if cache is not None and name in cache:
            return cache[name]
        entry = catalog.get(name)
        if entry is None:
            raise TryllError(code, f"{where}: model {name!r} is not in the model catalog "
                                     f"(language models: {_llm_names(catalog)})")
        if entry.role != "llm":
            raise TryllError(code, f"{where}: model {name!r} is a {entry.role} model; this "
                                     "node needs a language model")
        if entry.engine not in server.models.loaders:
            raise TryllError(ErrorCode.EngineNotAvailable,
                             f"{where}: model {name!r} (role {entry.role}) runs on engine "
                             f"{entry.engine}, which this server build does not have",
                             model=name, role=entry.role, engine=entry.engine)
        if not server.models.store.is_downloaded(name):
            raise TryllError(code, f"{where}: model {name!r} is not downloaded; download it "
                                     "first (DownloadModelRequest): CreateAgent never downloads")
        result = (entry, min(entry.context_size or cap_limit, cap_limit))
        if cache is not None:
            cache[name] = result
        return result

    return resolve


def voice_checker(session):
    """check_voice (workflow/voice.py) bound to this server's catalog, engines and models
    on disk and the session's locale: check(profile, speaks) -> Voice | None."""
    server = session.server

    def check(profile, speaks: bool):
        return check_voice(profile, speaks=speaks, catalog=server.catalog,
                           engines=set(server.models.loaders),
                           downloaded=server.models.store.is_downloaded,
                           locale=session.locale)
    return check


def _llm_names(catalog) -> str:
    return ", ".join(e.name for e in catalog.visible() if e.role == "llm") or "none"


def agent_of(session, agent_id: int) -> Agent:
    agent = session.agents.get(agent_id)
    if agent is None:
        if agent_id in session.destroyed_agents:
            raise TryllError(ErrorCode.AgentAlreadyDestroyed,
                             f"agent {agent_id} was destroyed")
        raise TryllError(ErrorCode.InvalidAgentId,
                         f"agent_id {agent_id} names no agent of this session")
    return agent


def load_refused(exc: ModelError, code: ErrorCode, what: str) -> TryllError:
    """The error a request answers when a model it needs is refused at load: the request's
    own code (`what`, then the model layer's reason), except a model whose engine is not
    in this build, which is 6008 EngineNotAvailable on every path (it names the model, its
    role and the engine), so a client tells a build without an engine from a bad request."""
    if exc.code == ErrorCode.EngineNotAvailable:
        return TryllError(ErrorCode.EngineNotAvailable, f"{what}: {exc.message}",
                          model=exc.model, role=exc.role, engine=exc.engine)
    return TryllError(code, f"{what}: {exc.message}")


@handles("CreateAgentRequest")
def create_agent(session, req):
    server = session.server
    rid = req.request_id
    limit = server.config.workflow_max_agents_per_session
    if len(session.agents) >= limit:
        raise TryllError(ErrorCode.SessionLimitReached,
                         f"the session already has {len(session.agents)} agents, the most "
                         f"workflow.max_agents_per_session allows ({limit})")
    if req.kv_cache_initialization not in _KV_INIT:
        raise TryllError(ErrorCode.GraphCompilationFailed,
                         f"kv_cache_initialization {int(req.kv_cache_initialization)} is not "
                         "a KvCacheInitialization (0..2)")
    if req.workload not in _WORKLOAD:
        raise TryllError(ErrorCode.GraphCompilationFailed,
                         f"workload {int(req.workload)} is not an AgentWorkload (0..1)")
    session.run_blocking(rid, "CreateAgentRequest", lambda: _create(session, req))


def _create(session, req):
    server = session.server
    variables = Variables(req.variables)
    resolved: dict = {}
    linked: dict = {}
    # a graph that names no model gets the server's (workflow.default_llm)
    default_model = req.default_model_name or server.default_llm
    ctx = CompileContext(node_names=frozenset(), default_model=default_model,
                         variables=variables,
                         resolve_model=model_resolver(server, ErrorCode.GraphCompilationFailed,
                                                      resolved),
                         resolve_strings=strings_resolver(session, linked,
                                                          ErrorCode.GraphCompilationFailed),
                         resolve_embedded=embedded_resolver(session, linked,
                                                            ErrorCode.GraphCompilationFailed),
                         storage_root=server.config.storage_root)
    graph = compile_graph(req.graph, ctx, TYPES)
    speaks = any(node.type.speaks for node in graph.nodes.values())
    voice = voice_checker(session)(req.voice, speaks)
    agent = Agent(server.new_agent_id(), session, server.runtime, graph, variables,
                  default_model=default_model, diagnostics=req.enable_diagnostics,
                  maintain_history=req.maintain_dialogue_history, workload=int(req.workload),
                  kv_init=int(req.kv_cache_initialization), voice=voice)
    agent.resolved_models = resolved
    agent.linked_strings = linked
    try:
        if agent.kv_init != codec.KvCacheInitialization.DeferAllocation:
            agent.lease_all()
        prefill = None
        if agent.kv_init == codec.KvCacheInitialization.Prefill:
            report = kv.prefill(agent)
            prefill = {"contexts": report.contexts_created, "tokens": report.tokens_decoded}
    except ModelError as exc:
        agent.release()
        raise load_refused(exc, ErrorCode.GraphCompilationFailed,
                           "a model of the graph cannot be loaded") from None
    except BaseException:
        agent.release()
        raise
    if not server.register_agent(session, agent):
        agent.release()             # the session went away while the agent was built
        return None
    log.info("agent created", extra=fields(session=session.id, agent=agent.id,
                                           nodes=len(graph.nodes), models=sorted(agent.leases),
                                           prefill=prefill))
    return codec.CreateAgentResponse(request_id=req.request_id, agent_id=agent.id)


@handles("DestroyAgentRequest", during_shutdown=True)
def destroy_agent(session, req):
    agent = agent_of(session, req.agent_id)
    session.server.destroy_agent(session, agent)
    return codec.Ack(request_id=req.request_id, agent_id=req.agent_id)


@handles("SendMessageRequest")
def send_message(session, req):
    agent = agent_of(session, req.agent_id)
    start_turn(agent, req.request_id, req.text,
               lambda cancel: session.begin_operation("turn", f"agent {agent.id}", cancel))
    return None


MAX_RESULT_CHARS = 65536
MAX_RESULTS_CHARS = 262144


@handles("ResumeAgentRequest", during_shutdown=True)
def resume_agent(session, req):
    agent = agent_of(session, req.agent_id)
    with agent.lock:
        agent.admit("ResumeAgentRequest")
        turn = agent.turn
        paused = turn.paused
        if req.resume_node and req.resume_node not in agent.graph.nodes:
            raise TryllError(ErrorCode.UnknownNode,
                             f"resume_node {req.resume_node!r} is not a node of agent "
                             f"{agent.id} (the turn stays paused)")
        results = _check_tool_results(paused, list(req.tool_results))
        turn.resume(req.resume_node, results)
    return codec.Ack(request_id=req.request_id, agent_id=req.agent_id)


def _check_tool_results(paused, results) -> dict[str, str]:
    """The whole batch, or 3016 InvalidToolResults (the turn stays paused for a retry)."""
    def bad(problem: str) -> TryllError:
        return TryllError(ErrorCode.InvalidToolResults, f"tool_results: {problem} (the turn "
                                                          "stays paused)")

    pending = {c.extra["call_id"]: c for c in paused.await_calls}
    if not pending:
        if results:
            raise bad(f"this is a {paused.cause} pause with no AwaitResult call; resume "
                      "without results")
        return {}
    names = ", ".join(pending)
    if not results:
        raise bad(f"AwaitResult calls {names} are pending: send one result per call")
    got: dict[str, str] = {}
    total = 0
    for i, r in enumerate(results):
        if r.call_id not in pending:
            raise bad(f"[{i}].call_id {r.call_id!r} is not a pending call (pending: {names})")
        if r.call_id in got:
            raise bad(f"[{i}].call_id {r.call_id!r} appears twice")
        if len(r.result) > MAX_RESULT_CHARS:
            raise bad(f"[{i}].result has {len(r.result)} characters; at most "
                      f"{MAX_RESULT_CHARS}")
        total += len(r.result)
        got[r.call_id] = r.result
    if total > MAX_RESULTS_CHARS:
        raise bad(f"{total} characters in all; a batch holds at most {MAX_RESULTS_CHARS}")
    missing = [cid for cid in pending if cid not in got]
    if missing:
        raise bad(f"no result for {', '.join(missing)}: a batch answers every pending call")
    return got


@handles("CancelRequest", during_shutdown=True)
def cancel(session, req):
    agent = agent_of(session, req.agent_id)
    if req.mode not in _CANCEL:
        raise TryllError(ErrorCode.InvalidParamValue,
                         f"mode {int(req.mode)} is not a CancelMode (0..1)")
    with agent.lock:
        turn = agent.turn
    # the Ack goes first: the turn may end (and send its TurnComplete from the
    # orchestrator) as soon as it is cancelled, and the protocol orders Ack, TurnComplete
    session.send_reply(codec.Ack(request_id=req.request_id, agent_id=req.agent_id))
    if turn is not None:
        turn.cancel(int(req.mode))
    return None


def strings_resolver(session, linked: dict, code: int):
    """A node's string_storage: what this agent already linked under that reference (a
    storage never changes, and the reference is structural), else the session's storage
    of that name, else a file under the storage root in the session's language."""
    def resolve(ref: str, kinds: tuple, where: str):
        return session.strings.resolve(ref, kinds, where, session.locale, code, linked)
    return resolve


def embedded_resolver(session, linked: dict, code: int):
    """A node's embedded_string_storage, linked into the agent like string storages; a
    name that is no embedded storage but a mutable KB of the session is a reference to
    that store by name (looked up at every search: the game keeps writing it)."""
    def resolve(ref: str, where: str):
        if (("embedded", ref) not in linked and ref not in session.embedded.by_name
                and ref in session.memory.stores):
            return KbRef(session.memory, ref)
        return session.embedded.resolve(ref, where, code, linked)
    return resolve


@handles("ChangeAgentParamRequest")
def change_agent_param(session, req):
    agent = agent_of(session, req.agent_id)
    node = agent.graph.nodes.get(req.node_name)
    if node is None:
        raise TryllError(ErrorCode.UnknownNode,
                         f"agent {agent.id} has no node {req.node_name!r} (nodes: "
                         f"{', '.join(agent.graph.nodes)})")
    with agent.lock:
        agent.admit("ChangeAgentParamRequest", "params change only while idle or paused")
        ctx = CompileContext(node_names=frozenset(agent.graph.nodes),
                             default_model=agent.default_model, variables=agent.variables,
                             resolve_model=model_resolver(session.server,
                                                          ErrorCode.InvalidParamValue,
                                                          agent.resolved_models),
                             resolve_strings=strings_resolver(session, agent.linked_strings,
                                                              ErrorCode.InvalidParamValue),
                             resolve_embedded=embedded_resolver(
                                 session, agent.linked_strings, ErrorCode.InvalidParamValue),
                             storage_root=session.server.config.storage_root,
                             code=ErrorCode.InvalidParamValue)
        spec = check_change(node, req.params, ctx)
        node.params, node.spec = req.params, spec
    return codec.Ack(request_id=req.request_id, agent_id=req.agent_id)


@handles("UpdateAgentVariablesRequest")
def update_variables(session, req):
    agent = agent_of(session, req.agent_id)
    with agent.lock:
        agent.admit("UpdateAgentVariablesRequest",
                    "variables change only while idle or paused")
        agent.variables.apply(req.updates)
    return codec.Ack(request_id=req.request_id, agent_id=req.agent_id)


@handles("GetAgentVariablesRequest")
def get_variables(session, req):
    agent = agent_of(session, req.agent_id)
    return codec.GetAgentVariablesResponse(request_id=req.request_id,
                                           variables=agent.variables.snapshot())

