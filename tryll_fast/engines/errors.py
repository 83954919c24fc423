"""Errors raised by the llama engine instead of letting llama.cpp abort the process.

Every llama.cpp call that can GGML_ASSERT (and so kill the whole server, every
session with it) is checked in Python first; the check raises one of these,
naming the offending value and the limit it broke. They are protocol errors like any
other (tryll_fast.errors): a failure under a turn is 4001 InferenceFailed, a model that
cannot be loaded 6007 ModelResolutionFailed.
"""
from tryll_fast.errors import ErrorCode, TryllError


class EngineError(TryllError):
    """Base of every error the engine raises on purpose."""
    code = ErrorCode.InferenceFailed


class InvalidRequest(EngineError, ValueError):
    """The caller passed something the engine must refuse (bad ids, sizes, parameters)."""


class EngineClosed(EngineError, RuntimeError):
    """The model, context or engine was used after close()."""


class ModelLoadError(EngineError, RuntimeError):
    """llama.cpp could not load the model or create the context."""
    code = ErrorCode.ModelResolutionFailed


class DecodeError(EngineError, RuntimeError):
    """llama_decode failed (e.g. no free KV cells); the memory state was rolled back."""
