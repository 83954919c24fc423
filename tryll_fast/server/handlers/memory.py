"""Mutable knowledge bases and game-memory files (docs/knowledge.md, "Mutable knowledge
bases"). Every request runs on the session's lane, so a Write, a Delete and a Query sent in
that order apply in that order; embedding and file I/O never run on the reactor.
"""
from __future__ import annotations

import logging
import time

from tryll_fast import codec
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.knowledge import mutable
from tryll_fast.knowledge.strings import check_name
from tryll_fast.server import saves
from tryll_fast.server.dispatch import handles
from tryll_fast.server.logs import fields

log = logging.getLogger("tryll_fast.server.memory")


@handles("EnsureMutableKbRequest", lane=True)
def ensure(session, req):
    kb, created = session.memory.ensure(req.store_name, req.schema)
    if created:
        log.info("mutable KB created", extra=fields(
            session=session.id, store=kb.name, model=kb.schema.embedding_model))
    return codec.EnsureMutableKbResponse(request_id=req.request_id, store_name=kb.name,
                                         schema=kb.schema.to_wire(), created=created)


@handles("EnumerateMutableKbsRequest", lane=True)
def enumerate_stores(session, req):
    stores = sorted(session.memory.stores.values(), key=lambda kb: kb.name)
    return codec.EnumerateMutableKbsResponse(
        request_id=req.request_id,
        stores=[codec.MutableKbInfo(store_name=kb.name, schema=kb.schema.to_wire(),
                                    live_count=len(kb)) for kb in stores])


@handles("MutableKbWriteRequest", lane=True)
def write(session, req):
    kb = session.memory.get(req.store_name)
    records = list(req.records)
    session.memory.check_room(kb, records)
    results = kb.write(records)
    return codec.MutableKbWriteResponse(request_id=req.request_id, store_name=kb.name,
                                        results=[r.to_wire() for r in results])


@handles("MutableKbDeleteRequest", lane=True)
def delete(session, req):
    kb = session.memory.get(req.store_name)
    return codec.MutableKbDeleteResponse(request_id=req.request_id, store_name=kb.name,
                                         deleted_count=kb.delete(list(req.ids)))


@handles("MutableKbClearRequest", lane=True)
def clear(session, req):
    kb = session.memory.get(req.store_name)
    return codec.MutableKbClearResponse(request_id=req.request_id, store_name=kb.name,
                                        deleted_count=kb.clear())


@handles("MutableKbQueryRequest", lane=True)
def query(session, req):
    kb = session.memory.get(req.store_name)
    hits = kb.query(req.query_text or "", int(req.top_k), float(req.max_distance),
                    req.filter_json or "")
    return codec.MutableKbQueryResponse(
        request_id=req.request_id, store_name=kb.name,
        hits=[codec.MutableKbHit(id=r.id, text=r.text, metadata_json=r.metadata_json,
                                 distance=d) for r, d in hits])


@handles("MutableKbGetRequest", lane=True)
def get(session, req):
    kb = session.memory.get(req.store_name)
    rec = kb.get(req.record_id or "")
    return codec.MutableKbGetResponse(
        request_id=req.request_id, store_name=kb.name, found=rec is not None,
        record=None if rec is None else codec.MutableKbRecord(
            id=rec.id, text=rec.text, metadata_json=rec.metadata_json))


@handles("MutableKbListRequest", lane=True)
def list_records(session, req):
    kb = session.memory.get(req.store_name)
    size = int(req.page_size) or mutable.DEFAULT_PAGE
    if size > mutable.MAX_PAGE:
        raise TryllError(ErrorCode.InvalidMutableKbQuery,
                         f"page_size {size}: at most {mutable.MAX_PAGE}")
    records, cursor = kb.page(req.cursor or "", size)
    return codec.MutableKbListResponse(
        request_id=req.request_id, store_name=kb.name, next_cursor=cursor,
        records=[codec.MutableKbRecord(id=r.id, text=r.text,
                                       metadata_json=r.metadata_json) for r in records])


@handles("MutableKbStatsRequest", lane=True)
def stats(session, req):
    kb = session.memory.get(req.store_name)
    s = kb.stats()
    return codec.MutableKbStatsResponse(
        request_id=req.request_id, store_name=kb.name, live_count=s["live"],
        tombstoned_count=s["tombstoned"], size_bytes=s["size_bytes"],
        pending_embedding_count=s["pending"])


@handles("ExportMutableKbRequest", lane=True)
def export(session, req):
    kb = session.memory.get(req.store_name)
    parts = mutable.encode_parts(kb.name, kb.schema, kb.records(),
                                 limit=codec.MAX_FRAME)
    if len(parts) > 1 or len(parts[0]) > codec.MAX_FRAME - 4096:
        raise TryllError(ErrorCode.MutableKbLimitExceeded,
                         f"mutable KB {kb.name!r} ({len(kb)} records) does not fit one "
                         f"frame ({codec.MAX_FRAME} bytes) as a snapshot: save it with "
                         "SaveGameMemory, whose files have no such limit")
    return codec.ExportMutableKbResponse(request_id=req.request_id, store_name=kb.name,
                                         snapshot=parts[0])


@handles("ImportMutableKbRequest", lane=True)
def import_store(session, req):
    head, records, metas = mutable.parse_part(bytes(req.snapshot), "snapshot")
    if head[6] != 1:
        raise TryllError(ErrorCode.InvalidMutableKbSnapshot,
                         f"snapshot: part {head[5]} of {head[6]}; an imported snapshot "
                         "is one whole store (ExportMutableKb writes one)")
    parsed, = mutable.join_parts([(head, records, metas)], "snapshot")
    if req.store_name:
        parsed.name = check_name(req.store_name, ErrorCode.InvalidMutableKbName)
    warnings: list[str] = []
    kb = session.memory.build(parsed, True, warnings)
    session.memory.put(kb)
    log.info("mutable KB imported", extra=fields(session=session.id, store=kb.name,
                                                 records=len(kb)))
    return codec.ImportMutableKbResponse(request_id=req.request_id, store_name=kb.name,
                                         record_count=len(kb), warnings=warnings)


@handles("SaveGameMemoryRequest", lane=True)
def save_game_memory(session, req):
    path = saves.memory_path(session.server.config.storage_root, req.save_id)
    stores = sorted(session.memory.stores.values(), key=lambda kb: kb.name)
    data = mutable.encode_file([(kb.name, kb.schema, kb.records()) for kb in stores])
    saves.write_atomic(path, data, f"SaveGameMemory {req.save_id!r}",
                       ErrorCode.GameMemoryWriteFailed)
    log.info("game memory saved", extra=fields(session=session.id, save_id=req.save_id,
                                               stores=len(stores), bytes=len(data)))
    return codec.SaveGameMemoryResponse(request_id=req.request_id, save_id=req.save_id,
                                        written_at_ms=int(time.time() * 1000),
                                        store_count=len(stores))


@handles("LoadGameMemoryRequest", lane=True)
def load_game_memory(session, req):
    timing = int(req.embed_timing)
    if timing not in (codec.EmbedTiming.Now, codec.EmbedTiming.Lazy):
        raise TryllError(ErrorCode.InvalidEmbedTiming,
                         f"embed_timing {timing} must be Now (1) or Lazy (2)")
    path = saves.memory_path(session.server.config.storage_root, req.save_id)
    data = saves.read_limited(path, mutable.MAX_MEMORY_FILE_BYTES,
                              f"LoadGameMemory {req.save_id!r}",
                              ErrorCode.GameMemoryFileNotFound,
                              ErrorCode.InvalidMutableKbSnapshot)
    parsed = mutable.parse_file(data, f"game-memory file {req.save_id!r}")
    cap = session.memory.max_stores
    if len(parsed) > cap:
        raise TryllError(ErrorCode.MutableKbLimitExceeded,
                         f"the file holds {len(parsed)} stores; a session holds at most "
                         f"{cap} (session.max_mutable_kbs)")
    warnings: list[str] = []
    now = timing == codec.EmbedTiming.Now
    built = [session.memory.build(p, now, warnings) for p in parsed]
    session.memory.replace_all(built)
    log.info("game memory loaded", extra=fields(
        session=session.id, save_id=req.save_id, stores=len(built),
        records=sum(len(kb) for kb in built), timing="now" if now else "lazy"))
    return codec.LoadGameMemoryResponse(request_id=req.request_id, save_id=req.save_id,
                                        store_count=len(built), warnings=warnings)
