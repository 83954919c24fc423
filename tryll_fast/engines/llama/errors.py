"""Errors raised by the llama engine instead of letting llama.cpp abort the process.

Every llama.cpp call that can GGML_ASSERT (and so kill the whole server, every
session with it) is checked in Python first; the check raises one of these,
naming the offending value and the limit it broke.
"""


class EngineError(Exception):
    """Base of every error the engine raises on purpose."""


class InvalidRequest(EngineError, ValueError):
    """The caller passed something the engine must refuse (bad ids, sizes, parameters)."""


class EngineClosed(EngineError, RuntimeError):
    """The model, context or engine was used after close()."""


class ModelLoadError(EngineError, RuntimeError):
    """llama.cpp could not load the model or create the context."""


class DecodeError(EngineError, RuntimeError):
    """llama_decode failed (e.g. no free KV cells); the memory state was rolled back."""
