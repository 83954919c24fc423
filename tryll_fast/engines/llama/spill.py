"""The file tier for evicted conversations: one file per conversation's KV state.

Eviction is for giving memory back, and on this CPU build the KV cache is host memory, so
a host copy of an evicted sequence keeps what eviction was meant to free; a re-prefill
gives it back but costs the whole conversation again (~0.75 s for 460 tokens of Gemma 3
270M). A spilled sequence costs neither: its llama_state_seq_get_data blob goes to a file
(through the page cache, which the kernel can write out and reclaim), nothing stays in
Python, and the restore reads it back in milliseconds.

Layout: `<root>/pid<pid>-<label>-<random>/<n>.kv`, one directory per engine (mkdtemp:
unique per process and engine, mode 0700; the root is created 0700 too) and one file per
spill, named by a counter, never by the conversation's key. A file is deleted when it is
restored, when its conversation is released, and with the directory when the engine
closes; directories left by a process that died are swept when the next engine creates
its own.

The files are a cache: no fsync. A crash loses only the speed of the next restore, which
then re-prefills; so does a file that is missing, truncated or fails its checksum.
Compression is off: zlib level 1 on a real Gemma 3 270M blob (8.5 MB f16 KV) saved 7 % and
took 417 ms to compress and 77 ms to decompress, against ~2 ms to read the raw file back.

Runs on the scheduler thread only (close: after that thread has stopped).
"""
from __future__ import annotations

import ctypes
import itertools
import logging
import os
import re
import shutil
import struct
import tempfile
import zlib
from pathlib import Path

log = logging.getLogger(__name__)

MAGIC = b"TFKV"
VERSION = 1
# magic, version, payload bytes, crc32 of the payload, tokens the state holds
_HEADER = struct.Struct("<4sIQII")
_DIR_RE = re.compile(r"pid(\d+)-")


def default_root() -> Path:
    """`$XDG_CACHE_HOME/tryll_fast/kv`, else `~/.cache/tryll_fast/kv`."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "tryll_fast" / "kv"


class SpillFile:
    """Where one evicted conversation's state is (and how much disk it takes)."""
    __slots__ = ("path", "size")

    def __init__(self, path: Path, size: int):
        self.path = path
        self.size = size


class SpillDir:
    """One engine's spill directory, created on the first spill."""

    def __init__(self, root: str | os.PathLike | None = None, label: str = "engine"):
        self.root = Path(root).expanduser() if root else default_root()
        self.label = re.sub(r"[^A-Za-z0-9._-]+", "_", label)[:40] or "engine"
        self.path: Path | None = None
        self._names = itertools.count(1)
        self.bytes = 0          # on disk now
        self.files = 0
        self.peak_bytes = 0
        self.writes = 0
        self.restores = 0
        self.failures = 0       # restores that found no usable file (then re-prefilled)

    def _dir(self) -> Path:
        if self.path is None:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            _sweep_dead(self.root)
            self.path = Path(tempfile.mkdtemp(prefix=f"pid{os.getpid()}-{self.label}-",
                                              dir=self.root))
        return self.path

    def write(self, data, n_tokens: int) -> SpillFile:
        """Write a state blob (any buffer) to a new file; OSError if that fails (nothing is
        left behind)."""
        view = memoryview(data).cast("B")
        header = _HEADER.pack(MAGIC, VERSION, view.nbytes, zlib.crc32(view), n_tokens)
        path = self._dir() / f"{next(self._names):08d}.kv"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            with open(fd, "wb") as f:
                f.write(header)
                f.write(view)
            # no fsync: a cache; after a crash the conversation re-prefills
        except BaseException:
            _unlink(path)
            raise
        spill = SpillFile(path, _HEADER.size + view.nbytes)
        self.bytes += spill.size
        self.files += 1
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        self.writes += 1
        return spill

    def take(self, spill: SpillFile, n_tokens: int):
        """Read a spilled state back and delete its file: a ctypes buffer ready for
        llama_state_seq_set_data, or None when the file is missing, truncated, altered, or
        holds another number of tokens."""
        try:
            with open(spill.path, "rb", buffering=0) as f:
                head = f.read(_HEADER.size)
                if len(head) != _HEADER.size:
                    return self._failed(spill, "truncated header")
                magic, version, length, crc, tokens = _HEADER.unpack(head)
                if (magic, version, tokens) != (MAGIC, VERSION, n_tokens):
                    return self._failed(spill, "not the state that was written")
                if os.fstat(f.fileno()).st_size != _HEADER.size + length:
                    return self._failed(spill, "wrong size")
                buf = (ctypes.c_uint8 * length)()
                if length and f.readinto(buf) != length:
                    return self._failed(spill, "short read")
        except OSError as exc:
            return self._failed(spill, exc.strerror or str(exc))
        if zlib.crc32(buf) != crc:
            return self._failed(spill, "checksum mismatch")
        self.discard(spill)
        self.restores += 1
        return buf

    def _failed(self, spill: SpillFile, why: str) -> None:
        log.warning("spilled KV state %s unusable (%s); the conversation re-prefills",
                    spill.path.name, why)
        self.failures += 1
        self.discard(spill)
        return None

    def discard(self, spill: SpillFile) -> None:
        _unlink(spill.path)
        self.bytes -= spill.size
        self.files -= 1

    def close(self) -> None:
        """Delete the directory and every file in it."""
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = None
        self.bytes = self.files = 0


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not delete spilled KV state %s: %s", path, exc)


def _sweep_dead(root: Path) -> None:
    """Remove the directories of processes that are gone (a crash skips close())."""
    uid = os.getuid()
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        m = _DIR_RE.match(entry.name)
        if not m or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            if entry.stat(follow_symlinks=False).st_uid != uid:
                continue
            os.kill(int(m.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(entry.path, ignore_errors=True)
        except (OSError, ValueError, OverflowError):
            continue   # alive (or not ours to judge)
