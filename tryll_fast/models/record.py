"""downloads.json: which catalog models are on disk, with the sizes and hashes verified.

The record is what lets status() say Downloaded without re-hashing hundreds of megabytes;
DeleteModel drops an entry. It is rewritten whole (temp file, fsync, rename), under a lock
that covers both threads and processes, so a crash leaves the old or the new record, never
half of one. A missing or unreadable record reads as empty: the files are re-verified by
hash on the next fetch instead of trusted.
"""
from __future__ import annotations

import json
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from .catalog import ModelEntry

try:  # POSIX; elsewhere only the in-process lock applies.
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

RECORD_NAME = "downloads.json"
RECORD_FORMAT = 1
_thread_lock = threading.Lock()


class DownloadsRecord:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.path = self.root / RECORD_NAME
        # the last parse, keyed by the file's identity and change time: status() asks for
        # every catalog entry's record on each ListModels, and a stat is far cheaper than
        # reading and parsing the JSON again (another process may rewrite it: the key sees)
        self._cached: tuple[tuple[int, int, int, int], dict[str, dict[str, Any]]] | None = None

    def models(self) -> dict[str, dict[str, Any]]:
        """The recorded models (read-only: shared between calls until the file changes)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return {}
        key = (st.st_ino, st.st_dev, st.st_mtime_ns, st.st_size)
        cached = self._cached
        if cached is not None and cached[0] == key:
            return cached[1]
        models = self._read()
        self._cached = (key, models)
        return models

    def _read(self) -> dict[str, dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        models = data.get("models") if isinstance(data, dict) else None
        return models if isinstance(models, dict) else {}

    def get(self, name: str) -> dict[str, Any] | None:
        entry = self.models().get(name)
        return entry if isinstance(entry, dict) else None

    def matches(self, entry: ModelEntry) -> bool:
        """True when the record lists exactly the catalog's current files for this entry."""
        recorded = self.get(entry.name)
        if recorded is None:
            return False
        files = {f.get("name"): (f.get("size"), f.get("sha256"))
                 for f in recorded.get("files", []) if isinstance(f, dict)}
        return files == {f.name: (f.size, f.sha256) for f in entry.files}

    def derived(self, name: str) -> list[dict[str, Any]]:
        """Files a fetch-time preparation wrote for the entry: [{name, size, sha256}]."""
        recorded = self.get(name) or {}
        items = recorded.get("derived", [])
        return [d for d in items if isinstance(d, dict)] if isinstance(items, list) else []

    def add(self, entry: ModelEntry, derived: list[dict[str, Any]] = ()) -> None:
        item = {
            "role": entry.role,
            "engine": entry.engine,
            "size_bytes": entry.size_bytes,
            "downloaded_at_ms": int(time.time() * 1000),
            "files": [{"name": f.name, "size": f.size, "sha256": f.sha256,
                       "source": [str(s) for s in f.sources]} for f in entry.files],
        }
        if entry.prepare:
            item["prepare"] = entry.prepare
            item["derived"] = list(derived)
        self._update(lambda models: models.__setitem__(entry.name, item))

    def remove(self, name: str) -> bool:
        removed = []
        self._update(lambda models: removed.append(models.pop(name, None) is not None))
        return removed[0]

    def _update(self, change: Callable[[dict[str, Any]], None]) -> None:
        with self._locked():
            models = self._read()           # a fresh copy: the cached one is shared
            change(models)
            self._write({"format": RECORD_FORMAT, "models": models})

    def _write(self, data: dict[str, Any]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{RECORD_NAME}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(data, f, indent=2, sort_keys=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)
        fsync_dir(self.root)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with _thread_lock:
            if fcntl is None:  # pragma: no cover
                yield
                return
            with open(self.root / f".{RECORD_NAME}.lock", "a+b") as lock:
                # Blocking: a record update is a few milliseconds, never worth failing over.
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)
