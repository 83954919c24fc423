"""Model fixtures for the engine tests: real catalog models, fetched once into
build/models by the session fixture `model_file` (tests/conftest.py)."""
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2(model_file) -> Path:
    return Path(model_file("SmolLM2-135M-Instruct"))


@pytest.fixture(scope="session")
def gemma(model_file) -> Path:
    return Path(model_file("Gemma-3-270M"))


@pytest.fixture(scope="session")
def smollm2_model(smollm2):
    """One loaded SmolLM2 shared by the engine tests (engines built on it don't own it)."""
    from tryll_fast.engines.llama import LlamaModel
    model = LlamaModel(smollm2)
    yield model
    model.close()
