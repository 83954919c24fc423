"""An agent's dialog and KV-cache requests, described once (DialogCalls): the blocking
and the asyncio agent get their methods from it (tools/gen_client.py writes them out in
_methods.py), with the values they return."""
from __future__ import annotations

from dataclasses import dataclass

from tryll_fast import codec
from tryll_fast.client.core import Call


@dataclass
class DialogImport:
    """What ImportDialog / LoadDialog restored."""
    interaction_count: int
    warnings: list[str]


@dataclass
class SavedDialog:
    save_id: str
    written_at_ms: int
    interaction_count: int


@dataclass
class KvCacheStatus:
    """The aggregate of a KV-cache request (docs/workflow.md)."""
    applicable: bool              # the agent has language-model nodes at all
    resident: bool                # residency == Resident
    prefix_current: bool          # prefix_status == Current
    eligible_node_count: int
    debug_info: str               # per-node JSON with enable_diagnostics, else ""
    contexts_created: int = 0     # prefill only
    tokens_decoded: int = 0       # prefill only
    tokens_reused: int = 0        # prefill only
    contexts_evicted: int = 0     # evict only


def _kv_status(r) -> KvCacheStatus:
    return KvCacheStatus(
        applicable=r.applicable, resident=r.residency == codec.KvResidency.Resident,
        prefix_current=r.prefix_status == codec.KvPrefixStatus.Current,
        eligible_node_count=r.eligible_node_count, debug_info=r.debug_info,
        contexts_created=getattr(r, "contexts_created", 0),
        tokens_decoded=getattr(r, "tokens_decoded", 0),
        tokens_reused=getattr(r, "tokens_reused", 0),
        contexts_evicted=getattr(r, "contexts_evicted", 0))


def _compatibility(allow_graph_mismatch: bool) -> int:
    return (codec.DialogCompatibility.AllowGraphMismatch if allow_graph_mismatch
            else codec.DialogCompatibility.Strict)


class DialogCalls:
    """The idle-only dialog and KV-cache requests (docs/workflow.md), described once: Agent
    gets a blocking method and `<name>_async` (a concurrent.futures.Future) for each,
    AsyncAgent a coroutine and `<name>_async` (an asyncio.Future), written out in
    _methods.py. All raise AgentBusy (3004) while the agent's turn runs or is paused."""

    def append_interactions(self, interactions) -> Call:
        """Scripted history without running the graph: (user_message, assistant_message)
        pairs (an empty side is omitted, a both-empty pair skipped). Returns how many
        interactions were appended."""
        pairs = [p if isinstance(p, codec.DialogInteraction) else
                 codec.DialogInteraction(user_message=p[0], assistant_message=p[1])
                 for p in interactions]
        return Call("AppendInteractionsRequest", lambda rid: codec.AppendInteractionsRequest(
            request_id=rid, agent_id=self.id, interactions=pairs), lambda r: r.appended_count)

    def remove_interactions_from_end(self, count: int) -> Call:
        """Remove the last `count` interactions (saturating); returns how many went."""
        return Call("RemoveInteractionsFromEndRequest",
                    lambda rid: codec.RemoveInteractionsFromEndRequest(
                        request_id=rid, agent_id=self.id, count=count),
                    lambda r: r.removed_count)

    def export_dialog(self) -> Call:
        """The dialog as TDLG bytes (store them as they are; 3021 over 1 MiB)."""
        return Call("ExportDialogRequest", lambda rid: codec.ExportDialogRequest(
            request_id=rid, agent_id=self.id), lambda r: bytes(r.snapshot))

    def import_dialog(self, snapshot: bytes, allow_graph_mismatch: bool = False) -> Call:
        """Replace the dialog with an exported one (all or nothing); DialogImport."""
        return Call("ImportDialogRequest", lambda rid: codec.ImportDialogRequest(
            request_id=rid, agent_id=self.id, snapshot=snapshot,
            compatibility=_compatibility(allow_graph_mismatch)),
            lambda r: DialogImport(r.interaction_count, list(r.warnings)))

    def save_dialog(self, save_id: str) -> Call:
        """Write the dialog to <storage root>/dialogs/<save_id>.tdlg, atomically."""
        return Call("SaveDialogRequest", lambda rid: codec.SaveDialogRequest(
            request_id=rid, agent_id=self.id, save_id=save_id),
            lambda r: SavedDialog(r.save_id, r.written_at_ms, r.interaction_count))

    def load_dialog(self, save_id: str, allow_graph_mismatch: bool = False) -> Call:
        """Replace the dialog with a saved one; DialogImport."""
        return Call("LoadDialogRequest", lambda rid: codec.LoadDialogRequest(
            request_id=rid, agent_id=self.id, save_id=save_id,
            compatibility=_compatibility(allow_graph_mismatch)),
            lambda r: DialogImport(r.interaction_count, list(r.warnings)))

    def prefill_kv_cache(self) -> Call:
        """Decode every language-model node's reusable prefix now; KvCacheStatus."""
        return Call("PrefillAgentKvCacheRequest", lambda rid: codec.PrefillAgentKvCacheRequest(
            request_id=rid, agent_id=self.id), _kv_status)

    def evict_kv_cache(self) -> Call:
        """Free the agent's KV cells (restored by its next turn); KvCacheStatus."""
        return Call("EvictAgentKvCacheRequest", lambda rid: codec.EvictAgentKvCacheRequest(
            request_id=rid, agent_id=self.id), _kv_status)

    def get_kv_cache_status(self) -> Call:
        """The agent's KV-cache residency and prefix state, read only; KvCacheStatus."""
        return Call("GetAgentKvCacheStatusRequest",
                    lambda rid: codec.GetAgentKvCacheStatusRequest(request_id=rid,
                                                                   agent_id=self.id),
                    _kv_status)
