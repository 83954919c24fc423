"""The one exception a model fetch raises, with its protocol code (6001-6006).

The same object becomes a DownloadComplete{success=false, error_code, message} frame in the
server, so the message must stand alone: it names the model and, where one is involved, the
file. The mapping is written out in docs/models.md.
"""
from __future__ import annotations

from enum import IntEnum

from tryll_fast.errors import ErrorCode


# The download codes are the protocol's own (tryll_fast.errors.ErrorCode, 6001-6006). What
# each one means for a fetch:
#   DownloadFailed 6001: the transfer failed or delivered the wrong bytes (network error, HTTP
#       error other than 404/410, truncated stream, size or sha256 mismatch, pip failure,
#       unreadable wheel).
#   DownloadNotAvailable 6002: nothing to fetch: unknown catalog name, unsupported source,
#       HTTP 404/410, no such wheel on the index, wheel without the member, missing file://.
#   InsufficientDiskSpace 6003.
#   DownloadAlreadyActive 6004: the same model is already being fetched (this process or
#       another one).
#   ModelAutoDownloadFailed 6005: ensure_model() failed to fetch on demand; the underlying
#       error is __cause__.
#   DownloadCancelled 6006: the caller's cancel event fired; a resumable .part file is kept.
DownloadErrorCode = ErrorCode
DOWNLOAD_CODES = range(int(ErrorCode.DownloadFailed), int(ErrorCode.DownloadCancelled) + 1)


class ModelError(Exception):
    """Base of the model layer's errors: `.code` is the protocol code (an IntEnum
    member, so the server can answer with it), `.model` names the model."""

    def __init__(self, code: IntEnum, message: str, *, model: str = "") -> None:
        self.code = code
        self.model = model
        super().__init__(message)

    @property
    def message(self) -> str:
        return str(self.args[0])

    def __str__(self) -> str:
        return f"{self.args[0]} ({int(self.code)} {self.code.name})"


class ModelDownloadError(ModelError):
    """A failed fetch; `.file` names the file that failed."""

    def __init__(self, code: DownloadErrorCode, message: str, *, model: str = "",
                 file: str = "") -> None:
        if int(code) not in DOWNLOAD_CODES:
            raise ValueError(f"{code} is not a download error code (6001-6006)")
        super().__init__(ErrorCode(code), message, model=model)
        self.file = file
