"""Knowledge fixtures: a server with no model (string storages and the nodes that read
them need none) over a storage root of the test's own, and a session on it."""
from __future__ import annotations

from pathlib import Path

import pytest

from wire import Wire, start_server


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("kn"))
    Path(srv.config.storage_root).mkdir(parents=True, exist_ok=True)
    yield srv
    srv.shutdown(10)


@pytest.fixture
def root(server) -> Path:
    return Path(server.config.storage_root)


@pytest.fixture
def w(server):
    wire = Wire(server.address, timeout=30)
    wire.create_session(locale="en")
    yield wire
    wire.close()
