"""Fixtures for the model tests (helpers live in model_helpers.py)."""
from __future__ import annotations

import pytest

from model_helpers import LocalHttpServer


@pytest.fixture
def http_server():
    with LocalHttpServer() as server:
        yield server


@pytest.fixture
def wheelhouse(tmp_path):
    """A --find-links directory; see model_helpers.offline_pip."""
    directory = tmp_path / "wheelhouse"
    directory.mkdir()
    return directory
