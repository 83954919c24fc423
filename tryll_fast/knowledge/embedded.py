"""Embedded string storages: records (id, text, typed metadata), their embeddings in a
vector index, and the searches Retrieve and ClassifyIntent run (docs/knowledge.md).

Path A (a config file under the storage root naming the records file, the embedding model,
optionally the index file and the metadata schema): the index is built once and written
next to the records with a sidecar saying what it was built from (model, dimensions,
records' sha256); it is reused while that matches, and rebuilt when it is missing, stale,
for another model or unreadable. Loaded files are cached server-wide (StoreFiles), so many
agents and sessions share one index. Path B (inline strings + embedding_model): in memory,
the session's own.

A storage holds a lease on its embedding model for as long as anything references it (the
session, an agent that linked it, the file cache), so a query never waits for a load.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import threading
import weakref
from collections import OrderedDict
from pathlib import Path, PurePosixPath
from typing import Any, Sequence

import numpy as np

from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.knowledge import paths as root_paths
from tryll_fast.knowledge._vindex import IndexError_, VectorIndex
from tryll_fast.knowledge.filters import Filter
from tryll_fast.knowledge.metadata import Columns, Schema, bad
from tryll_fast.knowledge.strings import check_name

log = logging.getLogger("tryll_fast.knowledge")

MAX_RECORDS = 200_000
MAX_TEXT_CHARS = 64 * 1024
MAX_FILE_BYTES = 256 * 1024 * 1024
FILE_CACHE_ENTRIES = 16
INDEX_FORMAT = 1
BUILD_THREADS = 2
MASK_CACHE = 32                 # filter masks kept per storage (filter, variable values)
# USearch's `ef` on search (it searches with at least top_k): on 100 000 clustered vectors
# with a filter passing a fifth of them, 12 keeps recall@10 at 0.99 in 1.3 ms where 64
# reaches 0.999 in 7 ms (benchmarks/test_retrieve_bench.py reports the recall every run)
EXPANSION_SEARCH = 12


class Hit:
    __slots__ = ("row", "distance")

    def __init__(self, row: int, distance: float) -> None:
        self.row = row
        self.distance = distance


class Lexical:
    """BM25 (k1 1.2, b 0.75) over lower-cased word tokens: an inverted index of term ->
    (rows, term counts), scored with numpy per query term."""

    K1, B = 1.2, 0.75
    WORD = re.compile(r"\w+", re.UNICODE)

    def __init__(self, texts: Sequence[str]) -> None:
        self.n = len(texts)
        lengths = np.zeros(self.n, dtype=np.float32)
        postings: dict[str, dict[int, int]] = {}
        for row, text in enumerate(texts):
            words = self.WORD.findall(text.lower())
            lengths[row] = len(words)
            for w in words:
                d = postings.setdefault(w, {})
                d[row] = d.get(row, 0) + 1
        avg = float(lengths.mean()) if self.n else 1.0
        self.norm = (self.K1 * (1 - self.B + self.B * lengths / max(avg, 1e-6))).astype(
            np.float32)
        self.terms: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
        for w, d in postings.items():
            rows = np.fromiter(d.keys(), dtype=np.int64, count=len(d))
            tf = np.fromiter(d.values(), dtype=np.float32, count=len(d))
            idf = math.log(1.0 + (self.n - len(d) + 0.5) / (len(d) + 0.5))
            self.terms[w] = (rows, tf, idf)

    def scores(self, query: str) -> np.ndarray:
        out = np.zeros(self.n, dtype=np.float32)
        for w in set(self.WORD.findall(query.lower())):
            hit = self.terms.get(w)
            if hit is None:
                continue
            rows, tf, idf = hit
            out[rows] += idf * tf * (self.K1 + 1) / (tf + self.norm[rows])
        return out


class EmbeddedStorage:
    """Immutable records with their vector index; thread-safe searches."""

    def __init__(self, name: str, ids: Sequence[str], texts: Sequence[str], columns: Columns,
                 index: VectorIndex, model: str, lease: Any, source: str = "") -> None:
        self.name = name
        self.ids = tuple(ids)
        self.texts = tuple(texts)
        self.columns = columns
        self.index = index
        self.model = model
        self.source = source
        self.dim = index.dim
        self._embedder = lease.obj if lease is not None else None
        self._lexical: Lexical | None = None
        self._masks: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        if lease is not None:
            weakref.finalize(self, lease.release)

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def schema(self) -> Schema:
        return self.columns.schema

    def lexical(self) -> Lexical:
        with self._lock:
            if self._lexical is None:
                self._lexical = Lexical(self.texts)
            return self._lexical

    def embed_query(self, text: str) -> np.ndarray:
        return self._embedder.embed([text])[0]

    def allowed(self, flt: Filter | None, variables) -> np.ndarray | None:
        """The filter's byte per record. The records never change, so a mask depends only
        on the filter and the values of the variables it reads: kept for the next search
        (a turn after a turn with the same player level reuses it)."""
        if flt is None:
            return None
        key = (flt, tuple(variables.get(n) for n in sorted(flt.variables)))
        with self._lock:
            hit = self._masks.get(key)
            if hit is not None:
                self._masks.move_to_end(key)
                return hit
        mask = flt.mask(self.columns, variables)
        mask.flags.writeable = False
        with self._lock:
            self._masks[key] = mask
            while len(self._masks) > MASK_CACHE:
                self._masks.popitem(last=False)
        return mask

    def vector_search(self, query: np.ndarray, count: int, allow: np.ndarray | None,
                      threshold: float) -> list[Hit]:
        """Nearest records, best first; with `allow`, only allowed ones (the index walks
        past the others); `threshold` > 0 drops hits farther than it (cosine distance)."""
        if allow is not None and not allow.any():
            return []
        keys, dist = self.index.search(query, count, allow)
        return [Hit(int(k), float(d)) for k, d in zip(keys, dist)
                if threshold <= 0 or d <= threshold]

    def lexical_search(self, text: str, count: int, allow: np.ndarray | None) -> list[tuple[int, float]]:
        """(row, BM25 score) of records sharing a word with `text`, best first."""
        scores = self.lexical().scores(text)
        if allow is not None:
            scores = np.where(allow, scores, 0.0)
        nonzero = np.flatnonzero(scores > 0)
        if nonzero.size > count:
            part = np.argpartition(-scores[nonzero], count - 1)[:count]
            nonzero = nonzero[part]
        order = nonzero[np.argsort(-scores[nonzero], kind="stable")]
        return [(int(r), float(scores[r])) for r in order]

    def distances(self, query: np.ndarray, rows: Sequence[int]) -> np.ndarray:
        if not rows:
            return np.zeros(0, dtype=np.float32)
        return 1.0 - self.index.vectors(rows) @ query


# ---- building

def _check_texts(texts: Sequence[str], where: str) -> None:
    if not texts:
        raise bad(where, "no records")
    if len(texts) > MAX_RECORDS:
        raise bad(where, f"{len(texts)} records; at most {MAX_RECORDS}")
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t.strip():
            raise bad(f"{where}[{i}]", "the text is empty")
        if len(t) > MAX_TEXT_CHARS:
            raise bad(f"{where}[{i}]", f"{len(t)} characters; at most {MAX_TEXT_CHARS}")


def build_index(embedder, texts: Sequence[str]) -> VectorIndex:
    vectors = embedder.embed(list(texts))
    index = VectorIndex(vectors.shape[1], expansion_search=EXPANSION_SEARCH)
    index.add(vectors, threads=BUILD_THREADS)
    return index


def from_inline(name: str, strings: Sequence[str], model: str, metadata_json: Sequence[str],
                lease) -> EmbeddedStorage:
    """Path B: ids "0", "1", ...; metadata_json parallel with strings (or empty)."""
    texts = list(strings)
    _check_texts(texts, "strings")
    if not model:
        raise bad("embedding_model", "inline strings need an embedding_model")
    objects: list[dict] = []
    if metadata_json:
        if len(metadata_json) != len(texts):
            raise bad("metadata_json", f"{len(metadata_json)} entries for {len(texts)} "
                                       "strings; they are parallel")
        for i, raw in enumerate(metadata_json):
            if not raw.strip():
                objects.append({})
                continue
            try:
                obj = json.loads(raw)
            except ValueError as exc:
                raise bad(f"metadata_json[{i}]", f"not JSON ({exc})") from None
            if not isinstance(obj, dict):
                raise bad(f"metadata_json[{i}]", "must be a JSON object")
            objects.append(obj)
    else:
        objects = [{} for _ in texts]
    schema = Schema.infer(objects, "metadata_json")
    columns = Columns(schema, objects, "metadata_json")
    index = build_index(lease.obj, texts)
    return EmbeddedStorage(name, [str(i) for i in range(len(texts))], texts, columns, index,
                           model, lease)


def _read_bytes(file: Path, shown: str) -> bytes:
    size = file.stat().st_size
    if size > MAX_FILE_BYTES:
        raise bad(shown, f"{size} bytes; at most {MAX_FILE_BYTES}")
    return file.read_bytes()


def _parse_json(raw: bytes, shown: str) -> Any:
    try:
        return json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise bad(shown, "is not UTF-8") from None
    except ValueError as exc:
        raise bad(shown, f"is not JSON ({exc})") from None


def _records(data: Any, shown: str) -> tuple[list[str], list[str], list[dict | None]]:
    if not isinstance(data, list):
        raise bad(shown, "must be a JSON array of {id, text, metadata?}")
    ids, texts, metas = [], [], []
    seen: set[str] = set()
    for i, r in enumerate(data):
        at = f"{shown}[{i}]"
        if not isinstance(r, dict):
            raise bad(at, "must be an object {id, text, metadata?}")
        rid = r.get("id")
        if isinstance(rid, int) and not isinstance(rid, bool):
            rid = str(rid)
        if not isinstance(rid, str) or not rid:
            raise bad(f"{at}.id", "must be a non-empty string or an integer")
        if rid in seen:
            raise bad(f"{at}.id", f"{rid!r} appears twice")
        seen.add(rid)
        text = r.get("text")
        if not isinstance(text, str):
            raise bad(f"{at}.text", "must be a string")
        meta = r.get("metadata")
        if meta is not None and not isinstance(meta, dict):
            raise bad(f"{at}.metadata", "must be an object")
        ids.append(rid)
        texts.append(text)
        metas.append(meta)
    _check_texts(texts, shown)
    return ids, texts, metas


class Config:
    """A Path A config file, read and checked (paths resolved under the root)."""

    def __init__(self, root: Path, relative: str, what: str) -> None:
        self.file = root_paths.resolve(root, relative, suffixes=(".json",), what=what)
        self.relative = relative
        data = _parse_json(_read_bytes(self.file, relative), relative)
        if not isinstance(data, dict):
            raise bad(relative, "a KB config is a JSON object {version, embedding_model, "
                                "records_file, index_file?, fields?}")
        unknown = set(data) - {"version", "embedding_model", "records_file", "index_file",
                               "fields"}
        if unknown:
            raise bad(relative, f"unknown key(s) {', '.join(sorted(unknown))}")
        version = data.get("version", 1)
        if version != 1:
            raise bad(f"{relative}: version", f"{version!r}; this server reads version 1")
        self.model = data.get("embedding_model")
        if not isinstance(self.model, str) or not self.model:
            raise bad(f"{relative}: embedding_model", "must name a catalog embedding model")
        base = PurePosixPath(relative.replace("\\", "/")).parent
        records = data.get("records_file")
        if not isinstance(records, str) or not records:
            raise bad(f"{relative}: records_file", "must be a path relative to the config")
        self.records_relative = str(base / records)
        self.records = root_paths.resolve(root, self.records_relative, suffixes=(".json",),
                                          what=f"{relative}: records_file")
        index = data.get("index_file")
        if index is None:
            name = self.records.name
            stem = name[:-len(".kb.json")] if name.endswith(".kb.json") else name[:-5]
            index = str(PurePosixPath(records).parent / f"{stem}.usearch")
        if not isinstance(index, str) or not index:
            raise bad(f"{relative}: index_file", "must be a path relative to the config")
        index_relative = str(base / index)
        # the index may not exist yet (it is written there), but it stays inside the root
        self.index = root_paths.target(root, str(base / index), f"{relative}: index_file")
        self.schema = Schema.parse(data.get("fields"), f"{relative}: fields")


def from_config(name: str, config: Config, lease) -> EmbeddedStorage:
    """Path A: load the records, reuse the index file when it is fresh, else build and
    write it (a failed write is logged; the storage still works from memory)."""
    embedder = lease.obj
    raw = _read_bytes(config.records, config.records_relative)   # parsed and hashed once
    ids, texts, metas = _records(_parse_json(raw, config.records_relative),
                                 config.records_relative)
    columns = Columns(config.schema, metas, f"{config.records_relative}")
    meta = {"format": INDEX_FORMAT, "model": config.model, "dim": int(embedder.dim),
            "count": len(ids), "records_sha256": hashlib.sha256(raw).hexdigest()}
    index = _fresh_index(config.index, meta)
    if index is None:
        index = build_index(embedder, texts)
        _write_index(index, config.index, meta)
    return EmbeddedStorage(name, ids, texts, columns, index, config.model, lease,
                           source=config.relative)


def _sidecar(index_file: Path) -> Path:
    return index_file.with_name(index_file.name + ".json")


def _fresh_index(index_file: Path, meta: dict) -> VectorIndex | None:
    side = _sidecar(index_file)
    if not index_file.is_file() or not side.is_file():
        return None
    try:
        recorded = json.loads(side.read_text("utf-8"))
    except (OSError, ValueError):
        recorded = None
    if recorded != meta:
        log.info("index is stale, rebuilding", extra={"index": str(index_file)})
        return None
    try:
        index = VectorIndex.load(index_file, expansion_search=EXPANSION_SEARCH)
    except IndexError_ as exc:
        log.warning("index file unreadable, rebuilding", extra={
            "index": str(index_file), "error": str(exc)})
        return None
    if index.dim != meta["dim"] or len(index) != meta["count"]:
        log.warning("index file does not match its records, rebuilding",
                    extra={"index": str(index_file)})
        return None
    return index


def _write_index(index: VectorIndex, index_file: Path, meta: dict) -> None:
    tmp = index_file.with_name(f".{index_file.name}.{os.getpid()}.tmp")
    try:
        index.save(tmp)
        os.replace(tmp, index_file)
        side_tmp = tmp.with_suffix(".json")
        side_tmp.write_text(json.dumps(meta), "utf-8")
        os.replace(side_tmp, _sidecar(index_file))
    except (OSError, IndexError_) as exc:
        log.warning("could not write the index file; it lives in memory only",
                    extra={"index": str(index_file), "error": str(exc)})
        for p in (tmp, tmp.with_suffix(".json")):
            try:
                p.unlink()
            except OSError:
                pass


class StoreFiles:
    """Server-wide cache of Path A storages read for nodes or sessions: keyed by the
    config's real path and the config's and records' sizes and modification times."""

    def __init__(self, root: Path, models) -> None:
        self.root = Path(root)
        self.models = models
        self._lock = threading.Lock()
        self._cache: OrderedDict = OrderedDict()

    def load(self, relative: str, what: str, name: str = "") -> EmbeddedStorage:
        config = Config(self.root, relative, what)
        key = (str(config.file), _stamp(config.file), _stamp(config.records), name)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        lease = lease_embedder(self.models, config.model, f"{relative}: embedding_model")
        try:
            made = from_config(name or relative, config, lease)
        except BaseException:
            lease.release()
            raise
        with self._lock:
            self._cache[key] = made
            while len(self._cache) > FILE_CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return made


    def clear(self) -> None:
        with self._lock:
            self._cache.clear()


def _stamp(file: Path) -> tuple[int, int]:
    st = file.stat()
    return st.st_size, st.st_mtime_ns


def lease_embedder(models, model: str, where: str):
    """A lease on the catalog embedding model `model`; 8003 naming `where` otherwise."""
    entry = models.catalog.get(model)
    if entry is None or entry.role != "embedding":
        names = [e.name for e in models.catalog if e.role == "embedding"]
        raise bad(where, f"{model!r} is not an embedding model of the catalog (embedding "
                         f"models: {', '.join(names) or 'none'})")
    try:
        return models.lease(model)
    except TryllError as exc:
        raise bad(where, f"{model!r} cannot be loaded: {exc.message}") from None


class SessionEmbedded:
    """A session's named embedded storages (Create pins one, Destroy unpins it); at most
    max_storages (the server's session.max_embedded_storages)."""

    def __init__(self, files: StoreFiles, models, other_names=lambda: (), *,
                 max_storages: int) -> None:
        self.files = files
        self.models = models
        self.max_storages = max_storages
        self.by_name: dict[str, EmbeddedStorage] = {}
        self._other_names = other_names

    def create(self, req) -> EmbeddedStorage:
        name = check_name(req.name, ErrorCode.InvalidEmbeddedStringStorageName)
        if name in self.by_name:
            raise TryllError(ErrorCode.EmbeddedStringStorageAlreadyExists,
                             f"the session already has an embedded string storage named "
                             f"{name!r}; destroy it first")
        if name in self._other_names():
            raise TryllError(ErrorCode.StorageNameInUse,
                             f"{name!r} names a string storage of this session")
        if len(self.by_name) >= self.max_storages:
            raise TryllError(ErrorCode.SessionLimitReached,
                             f"the session holds {len(self.by_name)} embedded string "
                             f"storages, the most session.max_embedded_storages allows "
                             f"({self.max_storages}); destroy one first")
        strings = list(req.strings)
        if req.config_path and strings:
            raise bad("config_path", "give config_path or strings, not both")
        if req.config_path:
            made = self.files.load(req.config_path, "config_path", name)
        elif strings:
            lease = lease_embedder(self.models, req.embedding_model, "embedding_model")
            try:
                made = from_inline(name, strings, req.embedding_model,
                                   list(req.metadata_json), lease)
            except BaseException:
                lease.release()
                raise
        else:
            raise bad("config_path", "give config_path (a KB config file) or strings")
        self.by_name[name] = made
        return made

    def destroy(self, name: str) -> None:
        if self.by_name.pop(name, None) is None:
            raise TryllError(ErrorCode.InvalidEmbeddedStringStorageName,
                             f"the session has no embedded string storage named {name!r}"
                             + (f" (it has: {', '.join(sorted(self.by_name))})"
                                if self.by_name else ""))

    def resolve(self, ref: str, where: str, code: int, linked: dict | None) -> EmbeddedStorage:
        """A node's embedded_string_storage: what the agent linked, else the session's
        storage by name, else a KB config file under the storage root."""
        key = ("embedded", ref)
        found = linked.get(key) if linked is not None else None
        if found is None:
            found = self.by_name.get(ref)
            if found is None:
                if not ref.lower().endswith(".json"):
                    raise TryllError(code, f"{where}: embedded_string_storage {ref!r} names "
                                           "no embedded string storage of this session (and "
                                           "is not a .json KB config under the storage root)")
                try:
                    found = self.files.load(ref, f"{where}: embedded_string_storage")
                except TryllError as exc:
                    if exc.code == ErrorCode.InvalidEmbeddedStringStorageData:
                        raise TryllError(code, f"{where}: {exc.message}") from None
                    raise
            if linked is not None:
                linked[key] = found
        return found

    def clear(self) -> None:
        self.by_name.clear()
