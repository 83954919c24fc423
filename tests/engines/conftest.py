"""Model fixtures for the engine tests.

`smollm2` / `gemma` come from the session fixture `model_file` (tests/conftest.py)
when it exists. The /tmp/models fallback is for development only, until that
fixture lands; CI must not rely on it.
"""
from pathlib import Path

import pytest

_DEV_FALLBACK = {
    "SmolLM2-135M-Instruct": Path("/tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf"),
    "Gemma-3-270M": Path("/tmp/models/gemma-3-270m-q4_k_m.gguf"),
}


def _model_path(request, name: str) -> Path:
    try:
        model_file = request.getfixturevalue("model_file")
    except pytest.FixtureLookupError:
        path = _DEV_FALLBACK[name]  # development fallback only (see module docstring)
        if not path.exists():
            pytest.skip(f"{name} not available at {path}")
        return path
    return Path(model_file(name))


@pytest.fixture(scope="session")
def smollm2(request) -> Path:
    return _model_path(request, "SmolLM2-135M-Instruct")


@pytest.fixture(scope="session")
def gemma(request) -> Path:
    return _model_path(request, "Gemma-3-270M")


@pytest.fixture(scope="session")
def smollm2_model(smollm2):
    """One loaded SmolLM2 shared by the engine tests (engines built on it don't own it)."""
    from tryll_fast.engines.llama import LlamaModel
    model = LlamaModel(smollm2)
    yield model
    model.close()
