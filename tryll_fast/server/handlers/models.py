"""Model messages (docs/protocol.md): ListModels, DownloadModel, LoadModel, UnloadModel,
DeleteModel, GetMemoryConsumption. Model requests are server-wide: every catalog entry
names its engine.

All of them touch the disk or an engine, so they run on the session's lane (LoadModel then
UnloadModel from one client keep their order); downloads run on the download pool and stream
DownloadProgress (at most every PROGRESS_INTERVAL_S, skipped while the client is not
reading: each one supersedes the last) before their DownloadComplete.
"""
from __future__ import annotations

import logging
import threading
import time

from tryll_fast import codec
from tryll_fast.models import DownloadError, ModelEntry, ModelStatus
from tryll_fast.models.catalog import ENGINE_WIRE_VALUES
from tryll_fast.models.manager import PLACEMENT_NAMES
from tryll_fast.server import memory
from tryll_fast.server.dispatch import handles
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.server.logs import fields

log = logging.getLogger("tryll_fast.server.models")

PROGRESS_INTERVAL_S = 0.1

# catalog engine name -> its InferenceEngine on the wire
ENGINE_KINDS = {name: codec.InferenceEngine(v) for name, v in ENGINE_WIRE_VALUES.items()}


def _entry(server, name: str, field: str = "model_name") -> ModelEntry:
    if not name:
        raise TryllError(ErrorCode.DownloadNotAvailable, f"{field} is empty")
    entry = server.catalog.get(name)
    if entry is None:
        raise TryllError(ErrorCode.DownloadNotAvailable,
                         f"{field}: {name!r} is not in the model catalog "
                         f"(known: {', '.join(e.name for e in server.catalog.visible())})")
    return entry


def model_info(server, entry: ModelEntry, on_disk: dict) -> codec.ModelInfo:
    """The entry's ListModels row; `on_disk`: ModelStore.statuses()."""
    if server.models.is_loaded(entry.name):
        status = codec.ModelStatus.Loaded
    else:
        found = on_disk.get(entry.name)
        if found is None:
            found = server.models.store.status(entry.name)
        status = codec.ModelStatus(int(found))
    caps = entry.capabilities
    tts = None
    if entry.role == "tts":
        tts = codec.TtsCapabilitiesInfo(
            sample_rate=caps.get("sample_rate", 0),
            supports_speed=caps.get("supports_speed", False),
            supports_voice_description=caps.get("supports_voice_description", False),
            supports_reference_clip=caps.get("supports_reference_clip", False),
            expressiveness=caps.get("expressiveness", False),
            num_speakers=caps.get("num_speakers", 0))
    return codec.ModelInfo(
        name=entry.name, status=status, huggingface_repo=entry.huggingface_repo,
        model_type=entry.protocol_role, engine=ENGINE_KINDS[entry.engine],
        size_bytes=entry.size_bytes, description=entry.description,
        context_size=entry.context_size, languages=list(entry.languages),
        dependencies=list(entry.dependencies), tts_capabilities=tts)


@handles("ListModelsRequest")
def list_models(session, req):
    rid = req.request_id
    server = session.server

    def answer():
        on_disk = server.models.store.statuses()
        return codec.ListModelsResponse(request_id=rid, models=[
            model_info(server, e, on_disk) for e in server.catalog.visible()])

    session.run_blocking(rid, "ListModelsRequest", answer)


class _Progress:
    """The fetcher's progress callback -> DownloadProgress frames, coalesced."""

    def __init__(self, session, request_id: int, name: str) -> None:
        self.session = session
        self.request_id = request_id
        self.name = name
        self.last = 0.0
        self.state = (0, 0, "")
        self.sent = 0

    def __call__(self, done: int, total: int, current_file: str) -> None:
        self.state = (done, total, current_file)
        now = time.monotonic()
        if now - self.last < PROGRESS_INTERVAL_S or self.session.conn.paused:
            return
        self.last = now
        self.send()

    def send(self) -> None:
        done, total, current = self.state
        self.sent += 1
        self.session.send_reply(codec.DownloadProgress(
            request_id=self.request_id, model_name=self.name, bytes_downloaded=done,
            total_bytes=total, percent=min(100.0, 100.0 * done / total) if total else 0.0,
            current_file=current))


@handles("DownloadModelRequest")
def download_model(session, req):
    rid = req.request_id
    name = req.model_name
    server = session.server
    cancel = threading.Event()
    op = session.begin_operation("download", name, cancel.set)

    def complete(success: bool, code: int = 0, message: str = "") -> None:
        session.send_reply(codec.DownloadComplete(request_id=rid, model_name=name,
                                                  success=success, error=message,
                                                  error_code=code))

    def run() -> None:
        t0 = time.monotonic()
        try:
            store = server.models.store
            progress = _Progress(session, rid, name)
            try:
                _entry(server, name)
                already = store.is_downloaded(name)
                store.fetch(name, progress=progress, cancel=cancel)
            except DownloadError as exc:
                log.info("download failed", extra=fields(model=name, session=session.id,
                                                         code=int(exc.code), error=exc.message))
                complete(False, int(exc.code), exc.message)
                return
            except TryllError as exc:               # 6002 from _entry: nothing to fetch
                complete(False, int(exc.code), exc.message)
                return
            if not already or progress.sent == 0:
                size = sum(f.size for e in server.catalog.with_dependencies([name])
                           for f in e.files)
                progress.state = (progress.state[1] or size, progress.state[1] or size,
                                  progress.state[2])
                progress.send()     # the final 100 % frame, always
            log.info("download complete", extra=fields(
                model=name, session=session.id, already_downloaded=already,
                seconds=round(time.monotonic() - t0, 3)))
            complete(True)
        except Exception as exc:
            log.exception("download of %s failed", name)
            complete(False, int(ErrorCode.DownloadFailed), f"{name}: download failed: {exc!r}")
        finally:
            op.finish()

    try:
        server.downloads.submit(run)
    except RuntimeError:            # the pool is shut down: the server is stopping
        op.finish()
        raise TryllError(ErrorCode.ServerShuttingDown,
                         "DownloadModelRequest refused: the server is shutting down") from None


@handles("LoadModelRequest")
def load_model(session, req):
    rid = req.request_id
    name = req.model_name
    placement = req.placement
    server = session.server
    if placement not in PLACEMENT_NAMES:
        raise TryllError(ErrorCode.InvalidEngineSet,
                         f"LoadModelRequest.placement: {placement} is not a MemoryPlacement "
                         f"(0..{max(PLACEMENT_NAMES)})")
    if placement == codec.MemoryPlacement.Auto:
        placement = session.placement_hints.get(name, codec.MemoryPlacement.Auto)

    def run():
        _entry(server, name)
        result = server.pin_for(session, name, placement=PLACEMENT_NAMES[int(placement)])
        log.info("model loaded", extra=fields(
            model=name, session=session.id, already_loaded=result.already_loaded,
            load_ms=round(result.load_ms, 1), ram_bytes=result.ram_bytes,
            vram_bytes=result.vram_bytes, placement=result.placement,
            requested_placement=int(placement)))
        if result.placement_note:
            # the hint could not be honoured: the response's placement says where it went
            log.warning("placement hint not honoured", extra=fields(
                model=name, session=session.id, requested_placement=int(placement),
                placement=result.placement, reason=result.placement_note))
        return codec.LoadModelResponse(
            request_id=rid, model_name=name, engine=ENGINE_KINDS[result.engine],
            already_loaded=result.already_loaded,
            placement=(codec.MemoryPlacement.Vram if result.placement == "vram"
                       else codec.MemoryPlacement.Ram),
            load_ms=round(result.load_ms), ram_bytes=result.ram_bytes,
            vram_bytes=result.vram_bytes, loaded_dependencies=list(result.loaded_dependencies))

    session.run_blocking(rid, "LoadModelRequest", run)


@handles("UnloadModelRequest", lane=True)
def unload_model(session, req):
    _entry(session.server, req.model_name)
    warning = session.server.unpin_for(session, req.model_name)
    return codec.Ack(request_id=req.request_id, warning=warning)


@handles("DeleteModelRequest", lane=True)
def delete_model(session, req):
    name = req.model_name
    server = session.server
    _entry(server, name)
    removed = server.models.store.delete(name)      # 6004 while it is being fetched
    if server.models.is_loaded(name):
        warning = f"{name} is loaded: it stays in memory until unloaded"
    elif not removed:
        warning = f"{name} was not downloaded"
    else:
        warning = ""
    log.info("model deleted", extra=fields(model=name, session=session.id, removed=removed))
    return codec.Ack(request_id=req.request_id, warning=warning)


@handles("GetMemoryConsumptionRequest", lane=True)
def get_memory_consumption(session, req):
    server = session.server
    return memory.snapshot(server, req.request_id, server.describe_key)


# ModelStatus values on the wire and in the fetcher agree (Loaded is the server's own).
assert all(int(codec.ModelStatus[s.name]) == int(s) for s in ModelStatus)
