"""Fixtures for the pipeline transport: a real Server with a Gateway on free ports on
127.0.0.1 (clients and configs: pipeclients.py)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeclients import CANNED, MODEL, SMOL, VOICE, start_gateway, write_config  # noqa: E402
from tryll_fast.gateway import load_pipeline_config  # noqa: E402
from wire import MODELS_DIR, start_server  # noqa: E402


@pytest.fixture(scope="module")
def light(tmp_path_factory):
    """A server without models, with the canned agents."""
    tmp = tmp_path_factory.mktemp("pipe-light")
    server = start_server(tmp)
    gateway = start_gateway(server, write_config(tmp, "canned.toml", CANNED))
    yield server, gateway
    server.shutdown(5)


@pytest.fixture(scope="module")
def models(model_file, tmp_path_factory):
    """A server on the real models, with the test agents and the shipped example's (which
    name no model: here they get SmolLM2, the mechanics' model, as the server default)."""
    model_file(SMOL)
    model_file(VOICE)
    tmp = tmp_path_factory.mktemp("pipe-model")
    server = start_server(tmp, models_dir=MODELS_DIR, overrides=[
        "llama.n_slots=8", f"workflow.default_llm={SMOL}"])
    gateway = start_gateway(server, write_config(tmp, "model.toml", MODEL))
    example = start_gateway(server, load_pipeline_config())
    yield server, gateway, example
    server.shutdown(10)
