"""Mutable knowledge bases on the client (docs/knowledge.md, "Mutable knowledge bases").

    kb = client.ensure_mutable_kb("npc_memory", metadata_fields=["speaker", "turn"])
    kb.write([{"id": "player_name", "text": "The player's name is Aldric."},
              "The player carries a silver key."])          # a text alone gets a new id
    for hit in kb.query("what is the player called?", top_k=3):
        print(hit.distance, hit.text)
    client.save_game_memory("slot1")                        # every store of the session
    client.load_game_memory("slot1", lazy=True)             # in a later session

The requests of one store are described once here in MutableKbCalls and written out for the
blocking and the asyncio handle (memory_handle.py) by tools/gen_client.py.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from tryll_fast import codec
from tryll_fast.client.core import Call


@dataclass(frozen=True)
class KbRecord:
    id: str
    text: str
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class KbHit:
    id: str
    text: str
    metadata: dict
    distance: float            # cosine distance to the query (smaller = closer)


@dataclass(frozen=True)
class WriteOutcome:
    id: str                    # the record id (server-assigned when the record had none)
    status: Any                # codec.MutableKbWriteStatus: Inserted, Updated, Unchanged, Rejected
    error_code: int = 0        # why a Rejected record was not written
    message: str = ""


def _meta(value: Any) -> str:
    if value is None or value == "":
        return ""
    return value if isinstance(value, str) else json.dumps(value)


def _wire_record(r: Any) -> Any:
    """A text, a KbRecord, or a mapping {text, id?, metadata?} as a MutableKbRecord."""
    if isinstance(r, str):
        return codec.MutableKbRecord(id="", text=r, metadata_json="")
    if isinstance(r, KbRecord):
        return codec.MutableKbRecord(id=r.id, text=r.text, metadata_json=_meta(r.metadata))
    if isinstance(r, Mapping):
        return codec.MutableKbRecord(id=str(r.get("id", "")), text=r.get("text", ""),
                                     metadata_json=_meta(r.get("metadata")))
    raise TypeError(f"a record is a text, a KbRecord or a mapping, not {type(r).__name__}")


def _record(r) -> KbRecord:
    return KbRecord(r.id, r.text, json.loads(r.metadata_json) if r.metadata_json else {})


class MutableKbCalls:
    """The requests of one mutable knowledge base (`self.name`)."""

    def write(self, records: Iterable[Any]) -> Call:
        """Upsert records: each a text (a new id), a KbRecord, or a mapping {text, id?,
        metadata?}. Returns a WriteOutcome per record, in order; a Rejected one says why
        and does not stop the others."""
        return Call("MutableKbWriteRequest", lambda rid: codec.MutableKbWriteRequest(
            request_id=rid, store_name=self.name, records=[_wire_record(r) for r in records]),
            lambda reply: [WriteOutcome(r.id, codec.MutableKbWriteStatus(r.status),
                                        r.error_code, r.message) for r in reply.results])

    def query(self, text: str, top_k: int = 5, max_distance: float = 0.0,
              filter: Any = None) -> Call:
        """Nearest records, best first (KbHit each): at most top_k, none farther than
        max_distance (0: no limit), passing `filter` (the Retrieve filter grammar, a dict
        or JSON text)."""
        return Call("MutableKbQueryRequest", lambda rid: codec.MutableKbQueryRequest(
            request_id=rid, store_name=self.name, query_text=text, top_k=int(top_k),
            max_distance=float(max_distance), filter_json=_meta(filter)),
            lambda reply: [KbHit(h.id, h.text, json.loads(h.metadata_json)
                                 if h.metadata_json else {}, h.distance) for h in reply.hits])

    def get(self, record_id: str) -> Call:
        """The record with this id (a KbRecord), or None."""
        return Call("MutableKbGetRequest", lambda rid: codec.MutableKbGetRequest(
            request_id=rid, store_name=self.name, record_id=record_id),
            lambda reply: _record(reply.record) if reply.found else None)

    def list(self, cursor: str = "", page_size: int = 100) -> Call:
        """One page of records in id order: (records, next_cursor); next_cursor is empty
        after the last page."""
        return Call("MutableKbListRequest", lambda rid: codec.MutableKbListRequest(
            request_id=rid, store_name=self.name, cursor=cursor, page_size=int(page_size)),
            lambda reply: ([_record(r) for r in reply.records], reply.next_cursor))

    def stats(self) -> Call:
        """{live, tombstoned, size_bytes, pending_embedding}."""
        return Call("MutableKbStatsRequest", lambda rid: codec.MutableKbStatsRequest(
            request_id=rid, store_name=self.name),
            lambda r: {"live": r.live_count, "tombstoned": r.tombstoned_count,
                       "size_bytes": r.size_bytes,
                       "pending_embedding": r.pending_embedding_count})

    def export(self) -> Call:
        """The store as snapshot bytes (TMKB); import_mutable_kb takes them back."""
        return Call("ExportMutableKbRequest", lambda rid: codec.ExportMutableKbRequest(
            request_id=rid, store_name=self.name), lambda reply: bytes(reply.snapshot))

    def delete(self, *ids: str) -> Call:
        """Delete records by id (unknown ids are ignored); returns how many went."""
        return Call("MutableKbDeleteRequest", lambda rid: codec.MutableKbDeleteRequest(
            request_id=rid, store_name=self.name, ids=list(ids)),
            lambda reply: reply.deleted_count)

    def clear(self) -> Call:
        """Delete every record; returns how many went."""
        return Call("MutableKbClearRequest", lambda rid: codec.MutableKbClearRequest(
            request_id=rid, store_name=self.name), lambda reply: reply.deleted_count)


def ensure_mutable_kb_call(name: str, schema_name: str, schema_version: int,
                           embedding_model: str, metadata_fields: Iterable[str]) -> Call:
    return Call("EnsureMutableKbRequest", lambda rid: codec.EnsureMutableKbRequest(
        request_id=rid, store_name=name, schema=codec.MutableKbSchema(
            schema_name=schema_name, schema_version=int(schema_version),
            embedding_model_name=embedding_model, metadata_fields=list(metadata_fields))),
        lambda reply: (reply.store_name, reply.created))
