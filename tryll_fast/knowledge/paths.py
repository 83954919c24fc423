"""Files under the storage root (`storage_root`, process-wide): the one place a client's
relative path becomes a file the server opens.

`resolve(root, relative, suffixes, what)`: an absolute path, a `..` component, or a path
whose real location (symlinks followed) leaves the root is 3009 StorageOutsideRoot; a file
that is not there is 3010 StorageFileNotFound; one of the wrong kind (its suffix) is 3011
StorageKindMismatch. Each message names the field and the path as the client wrote it.
"""
from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath

from tryll_fast.errors import ErrorCode, TryllError


def target(root: Path, relative: str, what: str) -> Path:
    """The real location of `relative` under the root, which need not exist yet (a file the
    server will write); 3009 on any escape."""
    if not relative:
        raise TryllError(ErrorCode.StorageFileNotFound, f"{what}: empty path")
    if "\x00" in relative:
        raise TryllError(ErrorCode.StorageOutsideRoot, f"{what}: a NUL character in the path")
    posix, windows = PurePosixPath(relative), PureWindowsPath(relative)
    if posix.is_absolute() or windows.is_absolute() or windows.drive:
        raise TryllError(ErrorCode.StorageOutsideRoot,
                         f"{what}: {relative!r} is absolute; paths are relative to the "
                         "storage root")
    if ".." in posix.parts or ".." in windows.parts:
        raise TryllError(ErrorCode.StorageOutsideRoot,
                         f"{what}: {relative!r} climbs out of the storage root ('..')")
    base = Path(root).resolve()
    path = base / Path(*posix.parts)
    real = Path(os.path.realpath(path))
    if real != base and base not in real.parents:
        raise TryllError(ErrorCode.StorageOutsideRoot,
                         f"{what}: {relative!r} leads outside the storage root (a symbolic "
                         "link)")
    return real


def resolve(root: Path, relative: str, *, suffixes: tuple[str, ...], what: str) -> Path:
    real = target(root, relative, what)
    try:
        is_file = real.is_file()
    except OSError as exc:              # a name too long for the file system, and the like
        raise TryllError(ErrorCode.StorageFileNotFound,
                         f"{what}: {relative!r} cannot be a file under the storage root "
                         f"({exc.strerror})") from None
    if not is_file:
        raise TryllError(ErrorCode.StorageFileNotFound,
                         f"{what}: {relative!r} is not a file under the storage root")
    if suffixes and not real.name.lower().endswith(suffixes):
        raise TryllError(ErrorCode.StorageKindMismatch,
                         f"{what}: {relative!r} is not a {' or '.join(suffixes)} file")
    return real
