"""Fixtures for the workflow tests: a server with the real SmolLM2 (greedy) and a session."""
from __future__ import annotations

import pytest

from flows import SMOL
from wire import MODELS_DIR, Wire, start_server


@pytest.fixture(scope="module")
def server(model_file, tmp_path_factory):
    model_file(SMOL)
    srv = start_server(tmp_path_factory.mktemp("wf"), models_dir=MODELS_DIR, overrides=[
        "llama.max_n_ctx=4096", "llama.n_slots=12", "llama.n_batch=512",
        "workflow.max_steps_per_turn=16", f"workflow.default_llm={SMOL}",
        # these tests check mechanics on SmolLM2's exact replies to their own prompts; the
        # character frame has its own (test_character_frame.py)
        "workflow.character_frame="])
    yield srv
    srv.shutdown(10)


@pytest.fixture
def w(server):
    wire = Wire(server.address, timeout=120)
    wire.create_session(locale="en")
    yield wire
    wire.close()


