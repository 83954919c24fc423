"""ModelManager: load / unload / pin models with reference counts.

A model stays in memory while it is pinned (LoadModelRequest; UnloadModelRequest unpins),
leased (a request using it: `with manager.lease(name) as engine:`), or a dependency of a
loaded model (a VAD rides its STT model). When none of these holds it, it is freed; an
unload under a running request only takes effect when the last lease ends, so a model in
use is never freed under a request.

It never downloads: a model not on disk is refused with 6007 (fetch it first). Codes and
the close() policy: docs/models.md, "Loading models".
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping

from tryll_fast.engines import registry
from tryll_fast.engines.registry import Loader
from tryll_fast.errors import ErrorCode, ModelError, ServerShuttingDown, TryllError

from .catalog import Catalog, ModelEntry, load_catalog
from .fetch import ModelStore, resolve_models_dir

# How long close() waits for active leases before giving up (it never frees under them).
DEFAULT_CLOSE_TIMEOUT_S = 10.0


# A refused load is a ModelError (tryll_fast.errors) whose `.model`, `.role` and `.engine`
# say what could not be loaded: 6002 DownloadNotAvailable (not in the catalog, the answer
# ModelStore gives too), 6007 ModelResolutionFailed (a VAD on its own, not on disk, or the
# engine failed), 6008 EngineNotAvailable (the entry's or a dependency's engine is not in the
# build); 2001 ServerShuttingDown (a SessionError) once the manager closes.
Code = ErrorCode
# What the manager loads with: every engine this build runs (engines/registry.py).
DEFAULT_LOADERS: dict[str, Loader] = registry.loaders()
_PLACEABLE = registry.placeable()
# MemoryPlacement's wire values -> the engines' placement names (engines/llama/devices.py)
PLACEMENT_NAMES = {0: "auto", 1: "ram", 2: "vram"}


@dataclass(frozen=True)
class LoadResult:
    """What LoadModelRequest reports."""
    name: str
    role: str
    engine: str
    already_loaded: bool
    load_ms: float                  # this call's load time (0 when already loaded)
    weights_bytes: int
    ram_bytes: int                  # weights + the engine's KV cache (when it reports one)
    pinned: bool
    loaded_dependencies: tuple[str, ...] = ()
    vram_bytes: int = 0             # the part of both on a GPU device
    placement: str = "ram"          # where it went: "ram" or "vram"
    placement_note: str = ""        # why a placement hint was not honoured


@dataclass(frozen=True)
class UnloadResult:
    """What UnloadModelRequest reports. freed=False with leases > 0: deferred."""
    name: str
    was_loaded: bool
    was_pinned: bool
    freed: bool
    leases: int


@dataclass(frozen=True)
class LoadedModel:
    name: str
    role: str
    engine: str
    pinned: bool
    leases: int
    dependents: int                 # loaded models that depend on this one
    weights_bytes: int
    load_ms: float


@dataclass(eq=False)
class _Slot:
    entry: ModelEntry
    state: str = "loading"          # loading -> ready; a failed load removes the slot
    obj: Any = None
    pinned: bool = False
    leases: int = 0
    dependents: int = 0
    deps: tuple[str, ...] = ()
    load_ms: float = 0.0
    weights_bytes: int = 0
    ram_bytes: int = 0
    vram_bytes: int = 0
    error: BaseException | None = None

    @property
    def held(self) -> bool:
        return self.pinned or self.leases > 0 or self.dependents > 0


class ModelLease:
    """A held reference to a loaded model: `with manager.lease(name) as engine: ...`.

    The model cannot be freed until release() (or leaving the `with` block); release is
    idempotent.
    """

    def __init__(self, manager: "ModelManager", name: str, obj: Any) -> None:
        self._manager = manager
        self.name = name
        self._obj = obj
        self._released = False
        self._lock = threading.Lock()

    @property
    def obj(self) -> Any:
        if self._released:
            raise RuntimeError(f"lease on {self.name!r} already released")
        return self._obj

    engine = obj

    def release(self) -> None:
        with self._lock:
            if self._released:
                return
            self._released = True
        self._manager._release(self.name, "leases")

    @property
    def released(self) -> bool:
        return self._released

    def __enter__(self):
        return self.obj

    def __exit__(self, *exc) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"ModelLease({self.name!r}{', released' if self._released else ''})"


class ModelManager:
    """Loads catalog models on demand and keeps them alive while pinned or leased.

    engine_options: per engine name, e.g. {"llama-cpp": {"max_n_ctx": 2048, "n_slots": 4}}
    (llama-cpp: max_n_ctx caps the entry's context_size, default 4096; every other key
    goes to LlamaEngine). loaders: engine name -> loader(entry, path, options); the
    default is the registry's (engines/registry.py), every other engine is 6008.
    """

    def __init__(self, catalog: Catalog | None = None, models_dir=None, *,
                 engine_options: Mapping[str, Mapping[str, Any]] | None = None,
                 loaders: Mapping[str, Loader] | None = None) -> None:
        self.catalog = catalog if catalog is not None else load_catalog()
        self.models_dir = resolve_models_dir(models_dir)
        self.store = ModelStore(self.models_dir, self.catalog)
        self.engine_options = {k: dict(v) for k, v in (engine_options or {}).items()}
        self.loaders = dict(DEFAULT_LOADERS if loaders is None else loaders)
        self._cv = threading.Condition(threading.RLock())
        self._slots: dict[str, _Slot] = {}
        self._closing = False

    # ----- public API -----

    def lease(self, name: str, *, placement: str | None = None,
              n_gpu_layers: int | None = None) -> ModelLease:
        """Load if needed and hold the model until the lease is released. placement
        ("auto", "ram", "vram"; None: the engine's default) and n_gpu_layers (None: the
        engine's default) apply if this call loads it: a loaded model keeps its place."""
        obj, _ = self._acquire(name, "leases", placement=placement, n_gpu_layers=n_gpu_layers)
        return ModelLease(self, name, obj)

    def load(self, name: str, *, pin: bool = True, placement: str | None = None) -> LoadResult:
        """LoadModelRequest: load (with dependencies) and pin. pin=False only checks that
        the model loads and reports it: unless something else holds it, it is freed again.
        placement as for lease()."""
        t0 = time.perf_counter()
        _, info = self._acquire(name, "pin", placement=placement)
        slot, fresh, deps = info
        if not pin:
            self._release(name, "pin")
        return LoadResult(
            name=name, role=slot.entry.role, engine=slot.entry.engine,
            already_loaded=not fresh,
            load_ms=(time.perf_counter() - t0) * 1000.0 if fresh else 0.0,
            weights_bytes=slot.weights_bytes, ram_bytes=slot.ram_bytes, pinned=pin,
            loaded_dependencies=deps, vram_bytes=slot.vram_bytes,
            **_placement(slot.obj))

    def unload(self, name: str) -> UnloadResult:
        """UnloadModelRequest: unpin. Freed now if nothing else holds it, else when the last
        lease (or dependent) lets go."""
        self._entry(name)
        with self._cv:
            slot = self._slots.get(name)
            if slot is None:
                return UnloadResult(name, False, False, False, 0)
            was_pinned = slot.pinned
            leases = slot.leases
        if was_pinned:
            freed = self._release(name, "pin")
        else:
            freed = False
        return UnloadResult(name, True, was_pinned, freed, leases)

    def loaded(self) -> list[LoadedModel]:
        """The models in memory (finished loading), by name."""
        with self._cv:
            return [LoadedModel(n, s.entry.role, s.entry.engine, s.pinned, s.leases,
                                s.dependents, s.weights_bytes, s.load_ms)
                    for n, s in sorted(self._slots.items()) if s.state == "ready"]

    def is_loaded(self, name: str) -> bool:
        with self._cv:
            slot = self._slots.get(name)
            return slot is not None and slot.state == "ready"

    def memory(self) -> dict[str, dict]:
        """Per loaded model: engine, role, pinned, leases, dependents, weights_bytes,
        ram_bytes, load_ms and `engine_memory` (the engine's own memory() dict, or None)."""
        out: dict[str, dict] = {}
        for info in self.loaded():
            with self._cv:
                slot = self._slots.get(info.name)
                if slot is None or slot.state != "ready":
                    continue
                slot.leases += 1    # keep it alive while asking the engine
            try:
                mem_fn = getattr(slot.obj, "memory", None)
                engine_mem = mem_fn() if callable(mem_fn) else None
            finally:
                self._release(info.name, "leases")
            out[info.name] = {
                "engine": info.engine, "role": info.role, "pinned": info.pinned,
                "leases": info.leases, "dependents": info.dependents,
                "weights_bytes": info.weights_bytes, "ram_bytes": slot.ram_bytes,
                "load_ms": info.load_ms, "engine_memory": engine_mem,
            }
        return out

    def close(self, timeout: float = DEFAULT_CLOSE_TIMEOUT_S) -> None:
        """Refuse new loads and leases (2001), unpin everything, free what is idle, and
        wait up to `timeout` s for active leases to end. Never frees under a lease: on
        timeout raises TimeoutError naming them; each is still freed when released."""
        with self._cv:
            self._closing = True
            pinned = [n for n, s in self._slots.items() if s.pinned]
        for name in pinned:
            self.unload(name)
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._slots:
                left = deadline - time.monotonic()
                if left <= 0:
                    busy = ", ".join(f"{n} ({s.leases} lease(s))"
                                     for n, s in sorted(self._slots.items()))
                    raise TimeoutError(
                        f"ModelManager.close(): still in use after {timeout:g} s: {busy};"
                        " they are freed when their leases end")
                self._cv.wait(left)

    @property
    def closed(self) -> bool:
        return self._closing

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----- checks -----

    def _entry(self, name: str) -> ModelEntry:
        entry = self.catalog.get(name)
        if entry is None:
            raise ModelError(
                Code.DownloadNotAvailable,
                f"{name}: not in the catalog {self.catalog.origin}", model=name)
        return entry

    def _check(self, name: str, *, as_dependency: bool) -> ModelEntry:
        """Everything that can be refused before loading anything."""
        entry = self._entry(name)
        if entry.role == "vad" and not as_dependency:
            raise ModelError(
                Code.ModelResolutionFailed,
                f"{name}: role vad is not loaded on its own: a VAD loads as a dependency of"
                " its STT model", model=name, role=entry.role, engine=entry.engine)
        closure = self.catalog.with_dependencies([name])   # dependencies first
        for e in [entry] + [d for d in closure if d.name != name]:
            if e.engine not in self.loaders:
                via = "" if e.name == name else f" (a dependency of {name})"
                raise ModelError(
                    Code.EngineNotAvailable,
                    f"{e.name}{via}: role {e.role} needs engine {e.engine}, which this build"
                    f" cannot run (available: {', '.join(sorted(self.loaders)) or 'none'})",
                    model=e.name, role=e.role, engine=e.engine)
        if not self.store.is_downloaded(name):
            missing = [e for e in self.catalog.with_dependencies([name])
                       if not self.store.is_downloaded(e.name)]
            what = ", ".join(f"{e.name} ({self.store.status(e.name).name})" for e in missing)
            raise ModelError(
                Code.ModelResolutionFailed,
                f"{name}: not on disk in {self.models_dir}: {what}; download it first"
                f" (DownloadModel, or `tryll-fast models fetch {name}`): loading never"
                " downloads", model=name, role=entry.role, engine=entry.engine)
        return entry

    # ----- reference counting -----

    def _acquire(self, name: str, kind: str, *, as_dependency: bool = False,
                 placement: str | None = None, n_gpu_layers: int | None = None):
        """Take one reference of `kind` (leases | pin | dependents), loading if needed.
        Returns (obj, (slot, freshly_loaded, loaded_dependencies))."""
        entry = self._check(name, as_dependency=as_dependency)
        with self._cv:
            if self._closing:
                raise TryllError(Code.ServerShuttingDown,
                                 f"{name}: the model manager is shutting down",
                                 model=name, role=entry.role, engine=entry.engine)
            slot = self._slots.get(name)
            if slot is not None:
                self._take(slot, kind)
                while slot.state == "loading":
                    self._cv.wait()
                if slot.error is not None:
                    raise slot.error
                return slot.obj, (slot, False, ())
            slot = _Slot(entry)
            self._take(slot, kind)
            self._slots[name] = slot
        # This thread loads; the others wait on the slot (their references already count).
        deps: list[str] = []
        dep_objs: dict[str, Any] = {}
        fresh_deps: list[str] = []
        t0 = time.perf_counter()
        try:
            for dep in entry.dependencies:
                dep_obj, (_, fresh, sub) = self._acquire(dep, "dependents",
                                                         as_dependency=True)
                deps.append(dep)
                dep_objs[dep] = dep_obj
                if fresh:
                    fresh_deps.extend(sub + (dep,))
            obj = self._load_object(entry, dep_objs, placement, n_gpu_layers)
        except BaseException as exc:
            for dep in deps:
                self._release(dep, "dependents")
            # what this manager refused passes through; anything else (an engine's own
            # failure to load, a TryllError too) becomes 6007 naming the model
            err = exc if isinstance(exc, (ModelError, ServerShuttingDown)) else ModelError(
                Code.ModelResolutionFailed, f"{name}: loading failed: {exc}",
                model=name, role=entry.role, engine=entry.engine)
            if err is not exc:
                err.__cause__ = exc
            with self._cv:
                slot.error = err
                slot.state = "failed"
                if self._slots.get(name) is slot:
                    del self._slots[name]
                self._cv.notify_all()
            if err is exc:
                raise
            raise err from exc
        slot.obj = obj
        slot.deps = tuple(deps)
        slot.load_ms = (time.perf_counter() - t0) * 1000.0
        slot.weights_bytes, slot.ram_bytes, slot.vram_bytes = _sizes(obj, entry)
        with self._cv:
            slot.state = "ready"
            self._cv.notify_all()
            # Only possible for a pin: an unload() arrived while it was loading.
            idle = not slot.held
            if idle:
                del self._slots[name]
        if idle:
            self._free(slot)
        return obj, (slot, True, tuple(fresh_deps))

    @staticmethod
    def _take(slot: _Slot, kind: str) -> None:
        if kind == "pin":
            slot.pinned = True
        else:
            setattr(slot, kind, getattr(slot, kind) + 1)

    def _release(self, name: str, kind: str) -> bool:
        """Drop one reference; free the model (and release its dependencies) when it was
        the last. Returns True if this call freed it."""
        with self._cv:
            slot = self._slots.get(name)
            if slot is None:
                return False
            if kind == "pin":
                slot.pinned = False
            else:
                setattr(slot, kind, max(0, getattr(slot, kind) - 1))
            if slot.held or slot.state != "ready":
                return False
            # Unreachable from now on: a later lease() starts a fresh load.
            del self._slots[name]
        self._free(slot)
        return True

    def _free(self, slot: _Slot) -> None:
        try:
            close = getattr(slot.obj, "close", None)
            if callable(close):
                close()
        finally:
            for dep in slot.deps:
                self._release(dep, "dependents")
            with self._cv:
                self._cv.notify_all()

    def _load_object(self, entry: ModelEntry, dependencies: Mapping[str, Any],
                     placement: str | None = None, n_gpu_layers: int | None = None):
        """The engine's loader; an entry with dependencies gets their loaded objects as
        options["dependencies"] (a VAD rides its STT model and the STT engine uses it), and
        a placement hint overrides the engine's configured one (options["placement"])."""
        loader = self.loaders[entry.engine]
        options = self.engine_options.get(entry.engine, {})
        if dependencies:
            options = {**options, "dependencies": dict(dependencies)}
        if entry.engine in _PLACEABLE:
            if placement is not None and placement != "auto":
                options = {**options, "placement": placement}
            if n_gpu_layers is not None:
                options = {**options, "n_gpu_layers": n_gpu_layers}
        return loader(entry, self.store.path(entry.name), options)


def _sizes(obj: Any, entry: ModelEntry) -> tuple[int, int, int]:
    """(weights_bytes, ram_bytes, vram_bytes): from the engine's model when it says, else
    file sizes. A model on a device has its offloaded layers' weights and KV there."""
    model = getattr(obj, "model", None)
    weights = getattr(model, "weights_bytes", None) or getattr(obj, "weights_bytes", None)
    weights = int(weights) if weights else entry.size_bytes
    ctx = getattr(obj, "ctx", None)
    kv = getattr(ctx, "n_ctx", 0) * getattr(model, "kv_bytes_per_cell", 0) if ctx else 0
    dev_weights = int(getattr(model, "device_weights_bytes", 0) or 0)
    dev_kv = int(kv * float(getattr(model, "device_layer_share", 0.0) or 0.0))
    return weights, weights - dev_weights + int(kv) - dev_kv, dev_weights + dev_kv


def _placement(obj: Any) -> dict[str, str]:
    """LoadResult's placement and placement_note, from the engine's model when it has one
    (engines/llama/devices.Placement); host memory otherwise."""
    where = getattr(getattr(obj, "model", None), "placement", None)
    if where is None:
        return {"placement": "ram", "placement_note": ""}
    return {"placement": where.name, "placement_note": where.note}
