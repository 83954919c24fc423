"""The protocol's error codes (SPEC §4 and docs/protocol.md), shared by server and client,
and RequestError, the exception that fails one request with one of them.

1xxx are raised by clients only (the server never sends them); every other code arrives in
ErrorResponse.code (or DownloadComplete.error_code).
"""
from __future__ import annotations

from enum import IntEnum


class ErrorCode(IntEnum):
    # 1xxx: client side only (the Python client raises these; the server never sends them)
    ConnectionFailed = 1001
    ConnectionDropped = 1002
    Timeout = 1003
    # 2xxx: server and session
    ServerShuttingDown = 2001
    SessionNotReady = 2002
    SessionAlreadyExists = 2003
    InvalidLocale = 2004
    InvalidEngineSet = 2005
    InternalError = 2006            # a handler failed unexpectedly (a bug); the session lives on
    FeatureNotAvailable = 2007      # the message's feature is not in this server build yet
    # 3xxx: agents, graphs, dialogs
    InvalidAgentId = 3001
    AgentAlreadyDestroyed = 3002
    GraphCompilationFailed = 3003
    AgentBusy = 3004
    UnknownNode = 3005
    ParamNotMutable = 3006
    InvalidParamValue = 3007
    StorageOutsideRoot = 3009
    StorageFileNotFound = 3010
    StorageKindMismatch = 3011
    AgentNotPaused = 3012
    UnknownVariable = 3013
    VariableTypeMismatch = 3014
    InvalidVariableValue = 3015
    InvalidToolResults = 3016
    InvalidSaveId = 3017
    DialogFileNotFound = 3018
    InvalidDialogSnapshot = 3019
    DialogGraphMismatch = 3020
    DialogSnapshotTooLarge = 3021
    DialogWriteFailed = 3022
    InvalidVoiceProfile = 3023
    UnknownDeliveryMode = 3024
    AgentVoiceRequired = 3025
    DebugCommandsDisabled = 3026
    UnknownDebugCommand = 3027
    # 4xxx: running turns
    InferenceFailed = 4001
    InferenceTimeout = 4002
    MaxStepsExceeded = 4003
    InvalidHotwordsScore = 4107
    # 5xxx: protocol
    MalformedMessage = 5001
    UnknownMessageType = 5002
    FrameTooLarge = 5003
    ProtocolVersionMismatch = 5004
    # 6xxx: models
    DownloadFailed = 6001
    DownloadNotAvailable = 6002
    InsufficientDiskSpace = 6003
    DownloadAlreadyActive = 6004
    ModelAutoDownloadFailed = 6005
    DownloadCancelled = 6006
    ModelResolutionFailed = 6007
    EngineNotAvailable = 6008
    # 7xxx / 8xxx: storages and knowledge bases
    InvalidStringStorageName = 7001
    StringStorageAlreadyExists = 7002
    InvalidStringStorageData = 7003
    StorageNameInUse = 7004
    InvalidEmbeddedStorageName = 8001
    EmbeddedStorageAlreadyExists = 8002
    InvalidEmbeddedStorageData = 8003
    MutableKbNotFound = 8101
    MutableKbSchemaMismatch = 8102
    InvalidMutableKbName = 8103
    InvalidMutableKbRecord = 8104
    MutableKbLimitExceeded = 8105
    InvalidMutableKbSnapshot = 8106
    InvalidEmbedTiming = 8107
    GameMemoryFileNotFound = 8108
    GameMemoryWriteFailed = 8109


class RequestError(Exception):
    """Fail one request with a protocol error code. The session turns it into
    `ErrorResponse {request_id, code, message}`; the message is shown to game developers, so
    it names the field and the constraint."""

    def __init__(self, code: int, message: str) -> None:
        self.code = ErrorCode(code)
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        return f"{self.message} ({int(self.code)} {self.code.name})"
