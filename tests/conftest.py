"""Shared fixtures: the parsed schema, the compiled codec, the official runtime."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reference  # noqa: E402


@pytest.fixture(scope="session")
def schema():
    return reference.load_schema()


@pytest.fixture(scope="session")
def codec():
    from tryll_fast import codec
    return codec


@pytest.fixture(scope="session")
def ref(schema, tmp_path_factory):
    """flatc's official Python object API, generated for this run."""
    out = reference.generate_python(str(tmp_path_factory.mktemp("flatc_python")))
    return reference.Reference(schema, out)


@pytest.fixture(scope="session")
def model_file():
    """get(name) -> pathlib.Path of a catalog model (file, or directory for multi-file models).

    Fetched on first use into <repo>/build/models, which outlives the session so later runs
    on the same machine reuse it; concurrent workers wait for each other's fetch.
    """
    from tryll_fast.models import ensure_model

    models_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "build", "models")

    def get(name):
        return ensure_model(name, models_dir)

    return get
