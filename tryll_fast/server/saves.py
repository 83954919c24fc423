"""Files the game owns, keyed by a caller `save_id`, under the storage root.

A save_id is a file name, never a path: 1..128 characters of letters, digits, '_', '-' and
'.', not starting with '.' (so it cannot name a hidden file, our temporary files, '.' or
'..'); anything else is 3017 InvalidSaveId. Dialogs live at
`<storage_root>/dialogs/<save_id>.tdlg`, game memory at `<storage_root>/memory/<save_id>.tgmf`.

Writes are atomic: the bytes go to a temporary file next to the target, are fsynced, and
replace the target with one rename (then the directory is fsynced), so a crash or kill at
any moment leaves either the old file or the new one, never a torn one. Temporary files a
killed process left behind are removed by the next save of the same save_id.
"""
from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from tryll_fast.errors import ErrorCode, TryllError

_SAVE_ID = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,127}")
_TMP_SUFFIX = ".tmp"


def check_save_id(save_id: str) -> str:
    if not save_id:
        raise TryllError(ErrorCode.InvalidSaveId, "save_id is empty")
    if not _SAVE_ID.fullmatch(save_id):
        bad = sorted({ch for ch in save_id if not (ch.isascii() and (ch.isalnum()
                                                                     or ch in "_.-"))})
        if len(save_id) > 128:
            problem = f"has {len(save_id)} characters; at most 128"
        elif bad:
            problem = f"contains {''.join(bad)!r}"
        else:
            problem = "starts with '.'"
        raise TryllError(ErrorCode.InvalidSaveId,
                         f"save_id {save_id[:64]!r} {problem}: a save_id is a file name of "
                         "letters, digits, '_', '-' and '.', not starting with '.'")
    return save_id


def dialog_path(root: Path, save_id: str) -> Path:
    return Path(root) / "dialogs" / f"{check_save_id(save_id)}.tdlg"


def memory_path(root: Path, save_id: str) -> Path:
    """A game-memory file (SaveGameMemory / LoadGameMemory)."""
    return Path(root) / "memory" / f"{check_save_id(save_id)}.tgmf"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(path: Path) -> None:
    """Temporary files of this target whose writer process is gone."""
    prefix = f".{path.name}."
    try:
        names = os.listdir(path.parent)
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and name.endswith(_TMP_SUFFIX)):
            continue
        pid = name[len(prefix):-len(_TMP_SUFFIX)].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            try:
                os.unlink(path.parent / name)
            except OSError:
                pass


def write_atomic(path: Path, data: bytes, what: str,
                 code: int = ErrorCode.DialogWriteFailed) -> None:
    """Replace `path` with `data` atomically; `code` (3022 DialogWriteFailed for dialogs)
    on any OS error."""
    tmp = path.parent / f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}{_TMP_SUFFIX}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise TryllError(code,
                         f"{what}: cannot write {path}: {exc.strerror or exc}") from None


def read_limited(path: Path, limit: int, what: str,
                 missing: int = ErrorCode.DialogFileNotFound,
                 too_large: int = ErrorCode.DialogSnapshotTooLarge) -> bytes:
    """The file's bytes; `missing` (3018 for dialogs) when there is none, `too_large`
    (3021) when it is over `limit`."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise TryllError(too_large,
                                 f"{what}: {path} has {size} bytes; at most {limit}")
            return f.read(limit + 1)
    except FileNotFoundError:
        raise TryllError(missing,
                         f"{what}: no file {path} (nothing was saved under that save_id)"
                         ) from None
    except IsADirectoryError:
        raise TryllError(missing, f"{what}: {path} is a directory, not a saved file") from None
    except OSError as exc:
        raise TryllError(ErrorCode.DialogFileNotFound,
                         f"{what}: cannot read {path}: {exc.strerror or exc}") from None
