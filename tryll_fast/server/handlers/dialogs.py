"""The dialog lifecycle (docs/workflow.md): AppendInteractions, RemoveInteractionsFromEnd,
ExportDialog / ImportDialog, SaveDialog / LoadDialog, and the KV-cache requests
PrefillAgentKvCache, EvictAgentKvCache, GetAgentKvCacheStatus.

All of them are idle-only (3004 while a turn runs or is paused, or a KV-cache operation is
in flight). The edits are quick and answer on the reactor thread under the agent's lock.
Export, import, save and load copy or swap the interaction list under the lock and do the
encoding, decoding and file I/O on the session's lane; an import that finds the agent
busy by the time it is ready is 3004 and changes nothing. KV-cache requests hold the agent
in the kv_operation state while they run on the lane.
"""
from __future__ import annotations

import logging

from tryll_fast import codec
from tryll_fast.engines.errors import EngineError
from tryll_fast.server import saves
from tryll_fast.server.dispatch import handles
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.server.handlers.agents import agent_of
from tryll_fast.server.logs import fields
from tryll_fast.workflow import kv, snapshot
from tryll_fast.workflow.dialog import now_ms

log = logging.getLogger("tryll_fast.server.dialogs")


# ---- edits ----

@handles("AppendInteractionsRequest")
def append_interactions(session, req):
    agent = agent_of(session, req.agent_id)
    with agent.lock:
        agent.admit("AppendInteractionsRequest", "dialog edits only while idle")
        n = 0
        for pair in req.interactions:
            if pair.user_message or pair.assistant_message:
                agent.dialog.append_scripted(pair.user_message, pair.assistant_message)
                n += 1
        if n:
            agent.dialog_edited()
    return codec.AppendInteractionsResponse(request_id=req.request_id, agent_id=agent.id,
                                            appended_count=n)


@handles("RemoveInteractionsFromEndRequest")
def remove_interactions(session, req):
    agent = agent_of(session, req.agent_id)
    with agent.lock:
        agent.admit("RemoveInteractionsFromEndRequest", "dialog edits only while idle")
        n = agent.dialog.remove_from_end(req.count)
        if n:
            agent.dialog_edited()
    return codec.RemoveInteractionsFromEndResponse(request_id=req.request_id,
                                                   agent_id=agent.id, removed_count=n)


# ---- snapshots ----

def _finished_interactions(agent, request: str) -> list:
    with agent.lock:
        agent.admit(request, f"{request[:-7]} only while idle")
        return list(agent.dialog.interactions)


def _apply(agent, parsed, compatibility: int, locale: str, request: str) -> list[str]:
    """Swap the dialog in under the lock (3004 if a turn started meanwhile)."""
    warnings = snapshot.check_graph(parsed, agent.graph, compatibility, locale)
    with agent.lock:
        agent.admit(request, f"{request[:-7]} only while idle")
        agent.dialog.replace(parsed.interactions)
    return warnings


@handles("ExportDialogRequest")
def export_dialog(session, req):
    agent = agent_of(session, req.agent_id)
    interactions = _finished_interactions(agent, "ExportDialogRequest")

    def run():
        data = snapshot.encode(interactions, agent.graph, session.locale)
        reply = codec.ExportDialogResponse(request_id=req.request_id, agent_id=agent.id,
                                           snapshot=data)
        try:
            codec.encode(reply)
        except codec.FrameTooLarge:
            raise TryllError(ErrorCode.DialogSnapshotTooLarge,
                             f"the snapshot has {len(data)} bytes: with the response "
                             "around it, it does not fit in one 1 MiB frame") from None
        return reply

    session.run_blocking(req.request_id, "ExportDialogRequest", run, req.agent_id)


@handles("ImportDialogRequest")
def import_dialog(session, req):
    agent = agent_of(session, req.agent_id)
    _finished_interactions(agent, "ImportDialogRequest")     # refuse a busy agent before decoding
    data = bytes(req.snapshot)

    def run():
        parsed = snapshot.parse(data)
        warnings = _apply(agent, parsed, int(req.compatibility), session.locale,
                          "ImportDialogRequest")
        return codec.ImportDialogResponse(request_id=req.request_id, agent_id=agent.id,
                                          interaction_count=len(parsed.interactions),
                                          warnings=warnings)

    session.run_blocking(req.request_id, "ImportDialogRequest", run, req.agent_id)


@handles("SaveDialogRequest")
def save_dialog(session, req):
    agent = agent_of(session, req.agent_id)
    path = saves.dialog_path(session.server.config.storage_root, req.save_id)
    interactions = _finished_interactions(agent, "SaveDialogRequest")

    def run():
        data = snapshot.encode(interactions, agent.graph, session.locale)
        saves.write_atomic(path, data, f"SaveDialog {req.save_id!r}")
        log.info("dialog saved", extra=fields(session=session.id, agent=agent.id,
                                              save_id=req.save_id, bytes=len(data)))
        return codec.SaveDialogResponse(request_id=req.request_id, agent_id=agent.id,
                                        save_id=req.save_id, written_at_ms=now_ms(),
                                        interaction_count=len(interactions))

    session.run_blocking(req.request_id, "SaveDialogRequest", run, req.agent_id)


@handles("LoadDialogRequest")
def load_dialog(session, req):
    agent = agent_of(session, req.agent_id)
    path = saves.dialog_path(session.server.config.storage_root, req.save_id)
    _finished_interactions(agent, "LoadDialogRequest")

    def run():
        data = saves.read_limited(path, snapshot.MAX_SNAPSHOT_BYTES,
                                  f"LoadDialog {req.save_id!r}")
        parsed = snapshot.parse(data)
        warnings = _apply(agent, parsed, int(req.compatibility), session.locale,
                          "LoadDialogRequest")
        return codec.LoadDialogResponse(request_id=req.request_id, agent_id=agent.id,
                                        save_id=req.save_id,
                                        interaction_count=len(parsed.interactions),
                                        warnings=warnings)

    session.run_blocking(req.request_id, "LoadDialogRequest", run, req.agent_id)


# ---- KV cache ----

def _kv_request(session, req, name: str, operation, reply) -> None:
    agent = agent_of(session, req.agent_id)
    with agent.lock:
        agent.admit(name, "KV-cache operations only while idle")
        agent.begin_kv_operation()

    def run():
        try:
            report = operation(agent)
        except EngineError as exc:
            raise TryllError(ErrorCode.InferenceFailed,
                             f"{name} of agent {agent.id}: {exc.message}") from None
        finally:
            with agent.lock:
                agent.end_kv_operation()
        common = dict(request_id=req.request_id, agent_id=agent.id,
                      applicable=report.applicable, residency=report.residency,
                      prefix_status=report.prefix_status,
                      eligible_node_count=report.eligible_node_count,
                      debug_info=report.debug_info(agent))
        return reply(report, common)

    try:
        session.run_blocking(req.request_id, name, run)
    except BaseException:
        with agent.lock:
            agent.end_kv_operation()
        raise


@handles("PrefillAgentKvCacheRequest")
def prefill_kv(session, req):
    _kv_request(session, req, "PrefillAgentKvCacheRequest", kv.prefill,
                lambda r, common: codec.PrefillAgentKvCacheResponse(
                    **common, contexts_created=r.contexts_created,
                    tokens_decoded=r.tokens_decoded, tokens_reused=r.tokens_reused))


@handles("EvictAgentKvCacheRequest")
def evict_kv(session, req):
    _kv_request(session, req, "EvictAgentKvCacheRequest", kv.evict,
                lambda r, common: codec.EvictAgentKvCacheResponse(
                    **common, contexts_evicted=r.contexts_evicted))


@handles("GetAgentKvCacheStatusRequest")
def kv_status(session, req):
    _kv_request(session, req, "GetAgentKvCacheStatusRequest", kv.status,
                lambda r, common: codec.GetAgentKvCacheStatusResponse(**common))
