"""Knowledge: what characters know besides the dialog (docs/knowledge.md).

Owns the storage root's path rules (paths.py: the one place a client's relative path
becomes a file the server opens) and the string storages (named, immutable lists and maps of strings, inline or read from
files under the storage root): their formats, validation, the `loc/<language>/`
preference, the per-session registry and the server-wide cache of storage files; and the
embedded string storages (embedded.py: records with typed metadata (metadata.py), their
embeddings in a USearch HNSW index compiled in (_vindex.pyx), the metadata filter grammar
(filters.py), BM25 for lexical search, index files built once and rebuilt when stale). The
nodes that read them (CannedResponse, HumanMessageGuardrail, IntentToInstruction, Retrieve,
ClassifyIntent) live in workflow/nodes and receive a resolved storage at compile time.
"""
from tryll_fast.knowledge.strings import (
    Kind, SessionStorages, StorageFiles, StringStorage, from_file, from_inline,
    localized_path,
)

__all__ = ["Kind", "SessionStorages", "StorageFiles", "StringStorage", "from_file",
           "from_inline", "localized_path"]
