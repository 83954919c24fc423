"""Voice input fixtures: a server with the real Whisper tiny.en + Silero VAD, and the Piper
voice to make speech with (the helpers that stream it are in mic.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from mic import STT, VOICE
from wire import MODELS_DIR, Wire, start_server


@pytest.fixture(scope="session")
def speaker(model_file):
    """The project's own voice, run directly: text -> float samples at 22 050 Hz."""
    from tryll_fast.engines.speech.piper import PiperVoice
    v = PiperVoice(Path(model_file(VOICE)), n_threads=1)
    yield v
    v.close()


@pytest.fixture(scope="module")
def server(model_file, tmp_path_factory):
    model_file(STT)
    tmp = tmp_path_factory.mktemp("vi")
    srv = start_server(tmp, models_dir=MODELS_DIR)
    storage = Path(srv.config.storage_root)
    storage.mkdir(parents=True, exist_ok=True)
    yield srv
    srv.shutdown(10)


@pytest.fixture
def w(server):
    wire = Wire(server.address, timeout=60)
    wire.create_session(locale="en")
    yield wire
    wire.close()

