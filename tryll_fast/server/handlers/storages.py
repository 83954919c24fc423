"""String and embedded string storages (docs/knowledge.md): Create pins a named storage into the
session, Destroy unpins it. All run on the session's lane, in order with the
CreateAgent requests that link them (files are read and indexes built there, never on the reactor).
"""
from __future__ import annotations

import logging

from tryll_fast import codec
from tryll_fast.server.dispatch import handles
from tryll_fast.server.logs import fields

log = logging.getLogger("tryll_fast.server.storages")


@handles("CreateStringStorageRequest", lane=True)
def create_string_storage(session, req):
    made = session.strings.create(req, session.locale)
    log.info("string storage created", extra=fields(
        session=session.id, storage=made.name, kind=made.kind.name, entries=len(made),
        source=made.source or "inline"))
    return codec.CreateStringStorageResponse(request_id=req.request_id, name=made.name,
                                             entry_count=len(made))


@handles("DestroyStringStorageRequest", lane=True)
def destroy_string_storage(session, req):
    session.strings.destroy(req.name)
    return codec.Ack(request_id=req.request_id)


@handles("CreateEmbeddedStringStorageRequest", lane=True)
def create_embedded_string_storage(session, req):
    made = session.embedded.create(req)
    log.info("embedded string storage created", extra=fields(
        session=session.id, storage=made.name, records=len(made), dim=made.dim,
        model=made.model, source=made.source or "inline"))
    return codec.CreateEmbeddedStringStorageResponse(
        request_id=req.request_id, name=made.name, record_count=len(made),
        embedding_dim=made.dim)


@handles("DestroyEmbeddedStringStorageRequest", lane=True)
def destroy_embedded_string_storage(session, req):
    session.embedded.destroy(req.name)
    return codec.Ack(request_id=req.request_id)
