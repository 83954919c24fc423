"""Mutable knowledge bases: named stores a session writes while it runs, and searches like
an embedded storage (docs/knowledge.md, "Mutable knowledge bases").

A store keeps its records in rows that are only ever appended: an upsert that changes a
record tombstones its row and appends a new one, a delete tombstones. Rows are the keys of
the store's HNSW index, so a reader that took a view (the row lists, the live mask and the
index as they were) stays consistent while writers append. When tombstones outnumber live
records (and there are at least COMPACT_MIN of them) the store is compacted: the live rows
are copied into fresh lists and a fresh index is built from their vectors (no embedding).

Metadata is free-form JSON (int, float, string, bool, array of strings), restricted to the
schema's `metadata_fields` when it declares any. A key's type is fixed by the first record
that carries it (an int key that meets a float becomes float); a record whose value has
another type is rejected with 8104 naming the key. Filters use the Retrieve grammar
(filters.py) and are compiled against the store's current types; a field no record has
carried yet is a field every record lacks, so a predicate on it is false.

Vectors are derived data: a record written by Write is embedded before the reply; records
restored with LoadGameMemory Lazy wait (pending) until the store is first searched, when
they are embedded in batches. Snapshots and game-memory files (memory.fbs) hold the text
and metadata only.

Thread model: writes run on the session's lane, searches on worker threads (Retrieve) or
the lane (Query). Embedding runs outside the store's lock; applying a write, building a view
and walking the index run under it, and the walk is short (the index is small or the
filter mask is prebuilt).
"""
from __future__ import annotations

import bisect
import json
import logging
import math
import secrets
import struct
import threading
import time
import weakref
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from tryll_fast import codec
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.knowledge._vindex import VectorIndex
from tryll_fast.knowledge.embedded import (
    BUILD_THREADS, EXPANSION_SEARCH, MAX_TEXT_CHARS, Hit, Lexical,
)
from tryll_fast.knowledge.filters import Filter, FilterError, compile_filter
from tryll_fast.knowledge.metadata import MAX_FIELDS, Columns, Field, Schema
from tryll_fast.knowledge.strings import check_name

log = logging.getLogger("tryll_fast.knowledge")

MAX_RECORDS = 200_000            # live records per store
MAX_SESSION_BYTES = 512 * 1024 * 1024   # texts, metadata, vectors and indexes of a session
MAX_ID_CHARS = 256
MAX_METADATA_CHARS = 16 * 1024
MAX_WRITE_RECORDS = 10_000       # records in one MutableKbWrite
MAX_TOP_K = 1000
DEFAULT_PAGE = 100
MAX_PAGE = 1000
COMPACT_MIN = 64
INDEX_ROW_BYTES = 256            # an HNSW row's links and bookkeeping (connectivity 16)
EMBED_CHUNK = 256                # pending records embedded per batch (and between lock takes)
SNAPSHOT_FORMAT = 1
# one TMKB buffer stays well inside the codec's 1 MiB limit
PART_BYTES = 768 * 1024
MAX_MEMORY_FILE_BYTES = 1024 * 1024 * 1024
FILE_MAGIC = b"TGMF"
FILE_FORMAT = 1
_HEADER = struct.Struct("<4sIIIQ")    # magic, format, part count, crc32 of the parts, ms


def _bad_record(where: str, problem: str) -> TryllError:
    return TryllError(ErrorCode.InvalidMutableKbRecord, f"{where}: {problem}")


def _bad_query(where: str, problem: str) -> TryllError:
    return TryllError(ErrorCode.InvalidMutableKbQuery, f"{where}: {problem}")


def _bad_snapshot(where: str, problem: str) -> TryllError:
    return TryllError(ErrorCode.InvalidMutableKbSnapshot, f"{where}: {problem}")


# ---- schema

@dataclass(frozen=True)
class KbSchema:
    """What EnsureMutableKb compares: equal schemas reuse a store."""
    schema_name: str
    schema_version: int
    embedding_model: str          # the effective catalog name
    metadata_fields: tuple[str, ...]   # sorted, unique; () = free-form

    def to_wire(self):
        return codec.MutableKbSchema(schema_name=self.schema_name,
                                     schema_version=self.schema_version,
                                     embedding_model_name=self.embedding_model,
                                     metadata_fields=list(self.metadata_fields))

    def differences(self, other: "KbSchema") -> list[str]:
        out = []
        for attr in ("schema_name", "schema_version", "embedding_model", "metadata_fields"):
            a, b = getattr(self, attr), getattr(other, attr)
            if a != b:
                out.append(f"{attr} {a!r} (stored) vs {b!r} (requested)")
        return out


def default_embedding_model(models) -> str | None:
    """The catalog's default embedding model (the first when several are marked)."""
    for entry in models.catalog:
        if entry.role == "embedding" and entry.default:
            return entry.name
    for entry in models.catalog:
        if entry.role == "embedding":
            return entry.name
    return None


def parse_schema(raw, models, where: str = "schema") -> KbSchema:
    """A wire MutableKbSchema (or None) as a KbSchema; 8111 naming the field."""
    name = (raw.schema_name if raw is not None else "") or ""
    version = int(raw.schema_version) if raw is not None else 0
    model = (raw.embedding_model_name if raw is not None else "") or ""
    fields = list(raw.metadata_fields) if raw is not None else []
    if len(name) > 256:
        raise TryllError(ErrorCode.InvalidMutableKbSchema,
                   f"{where}.schema_name has {len(name)} characters; at most 256")
    if not model:
        model = default_embedding_model(models) or ""
        if not model:
            raise TryllError(ErrorCode.InvalidMutableKbSchema,
                       f"{where}.embedding_model_name is empty and the catalog has no "
                       "embedding model")
    entry = models.catalog.get(model)
    if entry is None or entry.role != "embedding":
        names = [e.name for e in models.catalog if e.role == "embedding"]
        raise TryllError(ErrorCode.InvalidMutableKbSchema,
                   f"{where}.embedding_model_name {model!r} is not an embedding model of the "
                   f"catalog (embedding models: {', '.join(names) or 'none'})")
    if len(fields) > MAX_FIELDS:
        raise TryllError(ErrorCode.InvalidMutableKbSchema,
                   f"{where}.metadata_fields has {len(fields)} names; at most {MAX_FIELDS}")
    for i, f in enumerate(fields):
        if not f or f != f.strip() or len(f) > 128 or any(ord(c) < 32 for c in f):
            raise TryllError(ErrorCode.InvalidMutableKbSchema,
                       f"{where}.metadata_fields[{i}] {f!r}: a key is 1..128 characters "
                       "without leading or trailing spaces or control characters")
    return KbSchema(name, version, model, tuple(sorted(set(fields))))


# ---- records

_TYPE_OF = ((bool, "bool"), (int, "int"), (float, "float"), (str, "string"))


def _value_type(value: Any) -> str | None:
    for py, name in _TYPE_OF:
        if isinstance(value, py):
            return name
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "set<string>"
    return None


def check_metadata(raw: str, fields: tuple[str, ...], where: str) -> tuple[dict, str]:
    """The metadata object and its canonical JSON (sorted keys, compact); 8104 naming
    the key or the problem."""
    if not raw or not raw.strip():
        return {}, "{}"
    if len(raw) > MAX_METADATA_CHARS:
        raise _bad_record(f"{where}.metadata_json",
                          f"{len(raw)} characters; at most {MAX_METADATA_CHARS}")
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        raise _bad_record(f"{where}.metadata_json", f"not JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise _bad_record(f"{where}.metadata_json", "must be a JSON object")
    if len(obj) > MAX_FIELDS:
        raise _bad_record(f"{where}.metadata_json", f"{len(obj)} keys; at most {MAX_FIELDS}")
    for key, value in obj.items():
        if fields and key not in fields:
            raise _bad_record(f"{where}.metadata_json.{key}",
                              f"not a key of the store's schema ({', '.join(fields)})")
        t = _value_type(value)
        if t is None:
            raise _bad_record(f"{where}.metadata_json.{key}",
                              f"{value!r} is not an int, float, string, bool or array of "
                              "strings")
        if t == "float" and not math.isfinite(value):
            raise _bad_record(f"{where}.metadata_json.{key}", f"{value!r} is not finite")
        if t == "int" and not -(1 << 63) <= value < (1 << 63):
            raise _bad_record(f"{where}.metadata_json.{key}", f"{value} does not fit in 64 bits")
        if t == "set<string>":
            obj[key] = sorted(set(value))
    return obj, json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def check_id(record_id: str, where: str) -> None:
    if len(record_id) > MAX_ID_CHARS:
        raise _bad_record(f"{where}.id", f"{len(record_id)} characters; at most {MAX_ID_CHARS}")
    if any(ord(c) < 32 or ord(c) == 127 for c in record_id):
        raise _bad_record(f"{where}.id", "contains control characters")


def check_text(text: str, where: str) -> None:
    if not text or not text.strip():
        raise _bad_record(f"{where}.text", "is empty")
    if len(text) > MAX_TEXT_CHARS:
        raise _bad_record(f"{where}.text", f"{len(text)} characters; at most {MAX_TEXT_CHARS}")


@dataclass
class WriteResult:
    id: str
    status: int                   # codec.MutableKbWriteStatus
    error_code: int = 0
    message: str = ""

    def to_wire(self):
        return codec.MutableKbWriteResult(id=self.id, status=self.status,
                                          error_code=self.error_code, message=self.message)


@dataclass
class Record:
    id: str
    text: str
    metadata_json: str            # canonical


Status = codec.MutableKbWriteStatus


class MutableKb:
    """One store. Thread-safe; see the module docstring."""

    def __init__(self, name: str, schema: KbSchema, embedder: Any, lease: Any = None,
                 *, expansion_search: int = EXPANSION_SEARCH) -> None:
        self.name = name
        self.schema = schema
        self._embedder = embedder
        self.dim = int(embedder.dim)
        self._ef = expansion_search
        self._lock = threading.RLock()
        self._embed_lock = threading.Lock()     # one pending-embedding pass at a time
        # one write at a time from planning to applying (the lane and WriteToMemory's
        # workers both write), so each result says what that write did
        self._write_lock = threading.Lock()
        self.version = 0
        self._reset()
        if lease is not None:
            weakref.finalize(self, lease.release)

    def _reset(self) -> None:
        self._ids: list[str] = []
        self._texts: list[str] = []
        self._metas: list[dict] = []
        self._meta_json: list[str] = []
        self._live = bytearray()
        self._has_vec = bytearray()
        self._vectors = np.zeros((16, self.dim), dtype=np.float32)
        self._row_of: dict[str, int] = {}
        self._sorted: list[str] = []
        self._types: dict[str, str] = {}
        self._index = VectorIndex(self.dim, expansion_search=self._ef)
        self._tombstones = 0
        self._pending = 0
        self._bytes = 0
        self._view: KbView | None = None
        self._filters: dict = {}

    # ---- reading

    def __len__(self) -> int:
        return len(self._row_of)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"live": len(self._row_of), "tombstoned": self._tombstones,
                    "size_bytes": self.size_bytes(), "pending": self._pending}

    def size_bytes(self) -> int:
        """Texts and metadata, the vectors, and the index's graph (estimated per row:
        USearch reports its reserved arena, 16 MiB even for a handful of records)."""
        with self._lock:
            return self._bytes + len(self._ids) * (2 * self.dim * 4 + INDEX_ROW_BYTES)

    def get(self, record_id: str) -> Record | None:
        with self._lock:
            row = self._row_of.get(record_id)
            if row is None:
                return None
            return Record(record_id, self._texts[row], self._meta_json[row])

    def page(self, cursor: str, size: int) -> tuple[list[Record], str]:
        """Live records with ids after `cursor` in id order (code point order), at most
        `size`; the next cursor is the last id returned, empty after the last page. A
        record written between pages shows up on a later page when its id sorts after the
        cursor, and no record is returned twice."""
        with self._lock:
            start = bisect.bisect_right(self._sorted, cursor) if cursor else 0
            ids = self._sorted[start:start + size]
            out = [Record(i, self._texts[self._row_of[i]], self._meta_json[self._row_of[i]])
                   for i in ids]
            more = start + size < len(self._sorted)
        return out, (ids[-1] if ids and more else "")

    def records(self) -> list[Record]:
        """Every live record in id order (a consistent copy)."""
        with self._lock:
            return [Record(i, self._texts[self._row_of[i]], self._meta_json[self._row_of[i]])
                    for i in self._sorted]

    # ---- writing

    def write(self, records: Sequence[Any], where: str = "records") -> list[WriteResult]:
        """Upsert (id, text, metadata_json) records; one WriteResult each, in order.

        A record that fails validation is Rejected (8104) and the others still apply. The
        texts that need vectors are embedded in one batch before anything changes."""
        if len(records) > MAX_WRITE_RECORDS:
            raise _bad_record(where, f"{len(records)} records; at most {MAX_WRITE_RECORDS} "
                                     "per write")
        with self._write_lock:
            return self._write(records, where)

    def _write(self, records: Sequence[Any], where: str) -> list[WriteResult]:
        results: list[WriteResult] = []
        accepted: list[tuple[int, Record, dict]] = []
        with self._lock:
            planned: dict[str, tuple[str, str]] = {}     # id -> (text, meta) after this write
            types = dict(self._types)
            live = len(self._row_of)
            for i, rec in enumerate(records):
                at = f"{where}[{i}]"
                rid = rec.id or ""
                try:
                    if rid:
                        check_id(rid, at)
                    text = rec.text or ""
                    check_text(text, at)
                    meta, meta_json = check_metadata(rec.metadata_json or "",
                                                     self.schema.metadata_fields, at)
                    _check_types(meta, types, at)
                except TryllError as exc:
                    results.append(WriteResult(rid, Status.Rejected, exc.code, exc.message))
                    continue
                if not rid:
                    rid = self._new_id(planned)
                before = planned.get(rid)
                if before is None:
                    row = self._row_of.get(rid)
                    before = (self._texts[row], self._meta_json[row]) if row is not None \
                        else None
                if before == (text, meta_json):
                    results.append(WriteResult(rid, Status.Unchanged))
                    continue
                if before is None and live >= MAX_RECORDS:
                    results.append(WriteResult(
                        rid, Status.Rejected, ErrorCode.MutableKbLimitExceeded,
                        f"{at}: store {self.name!r} holds {MAX_RECORDS} records, the most a "
                        "store may"))
                    continue
                _merge_types(meta, types)
                live += before is None
                planned[rid] = (text, meta_json)
                results.append(WriteResult(rid, Status.Inserted if before is None
                                           else Status.Updated))
                accepted.append((len(results) - 1, Record(rid, text, meta_json), meta))
            known_vec = {}
            for _, r, _ in accepted:                  # a metadata-only change keeps its vector
                row = self._row_of.get(r.id)
                if row is not None and self._texts[row] == r.text and self._has_vec[row]:
                    known_vec[r.id] = self._vectors[row].copy()
        need = sorted({r.text for _, r, _ in accepted if r.id not in known_vec})
        vectors = dict(zip(need, self._embedder.embed(need))) if need else {}
        with self._lock:
            rows: list[int] = []
            vecs: list[np.ndarray] = []
            for _, r, meta in accepted:
                v = known_vec.get(r.id)
                row = self._append(r, meta, v if v is not None else vectors[r.text])
                rows.append(row)
                vecs.append(self._vectors[row])
            if rows:
                self._index.add(np.stack(vecs), threads=1, keys=np.array(rows))
                self._changed()
        return results

    def _new_id(self, planned: dict) -> str:
        while True:
            rid = f"m-{int(time.time() * 1000):x}-{secrets.token_hex(4)}"
            if rid not in self._row_of and rid not in planned:
                return rid

    def _append(self, r: Record, meta: dict, vector: np.ndarray | None) -> int:
        """Append a row for r (tombstoning the row it replaces); the caller adds the vector
        to the index. Under the lock."""
        old = self._row_of.get(r.id)
        if old is not None:
            self._tombstone(old)
        else:
            bisect.insort(self._sorted, r.id)
        row = len(self._ids)
        self._ids.append(r.id)
        self._texts.append(r.text)
        self._metas.append(meta)
        self._meta_json.append(r.metadata_json)
        self._live.append(1)
        if row >= self._vectors.shape[0]:
            grown = np.zeros((max(16, self._vectors.shape[0] * 2), self.dim), dtype=np.float32)
            grown[:row] = self._vectors[:row]
            self._vectors = grown
        if vector is not None:
            self._vectors[row] = vector
            self._has_vec.append(1)
        else:
            self._has_vec.append(0)
            self._pending += 1
        self._row_of[r.id] = row
        self._bytes += _record_bytes(r)
        _merge_types(meta, self._types)
        return row

    def _tombstone(self, row: int) -> None:
        self._live[row] = 0
        self._tombstones += 1
        if not self._has_vec[row]:
            self._pending -= 1
            self._has_vec[row] = 2          # never embedded: nothing to add later

    def delete(self, ids: Iterable[str]) -> int:
        n = 0
        with self._write_lock, self._lock:
            for rid in ids:
                row = self._row_of.pop(rid, None)
                if row is None:
                    continue
                self._tombstone(row)
                del self._sorted[bisect.bisect_left(self._sorted, rid)]
                n += 1
            if n:
                self._changed()
        return n

    def clear(self) -> int:
        with self._write_lock, self._lock:
            n = len(self._row_of)
            self._reset()
            self.version += 1
        return n

    def _changed(self) -> None:
        self.version += 1
        self._view = None
        if self._tombstones >= COMPACT_MIN and self._tombstones > len(self._row_of):
            self._compact()

    def _compact(self) -> None:
        """Copy the live rows into fresh lists and index (views taken before keep theirs)."""
        keep = [r for r in range(len(self._ids)) if self._live[r]]
        old = (self._ids, self._texts, self._metas, self._meta_json, self._has_vec,
               self._vectors)
        ids, texts, metas, meta_json, has_vec, vectors = old
        self._ids = [ids[r] for r in keep]
        self._texts = [texts[r] for r in keep]
        self._metas = [metas[r] for r in keep]
        self._meta_json = [meta_json[r] for r in keep]
        self._has_vec = bytearray(has_vec[r] for r in keep)
        self._vectors = np.zeros((max(16, len(keep) * 2), self.dim), dtype=np.float32)
        if keep:
            self._vectors[:len(keep)] = vectors[keep]
        self._live = bytearray(b"\x01" * len(keep))
        self._row_of = {rid: row for row, rid in enumerate(self._ids)}
        self._types = {}
        for m in self._metas:
            _merge_types(m, self._types)
        self._tombstones = 0
        self._index = VectorIndex(self.dim, expansion_search=self._ef)
        with_vec = [r for r in range(len(keep)) if self._has_vec[r] == 1]
        if with_vec:
            self._index.add(self._vectors[with_vec], threads=BUILD_THREADS,
                            keys=np.array(with_vec))
        log.debug("mutable KB %r compacted to %d rows", self.name, len(keep))

    def load_records(self, records: Sequence[Record], metas: Sequence[dict],
                     embed_now: bool) -> None:
        """Fill an empty store (LoadGameMemory, Import): validated records in id order."""
        with self._lock:
            for r, m in zip(records, metas):
                self._append(r, m, None)
            self.version += 1
        if embed_now:
            self.embed_pending()

    # ---- embedding pending records

    @property
    def pending(self) -> int:
        return self._pending

    def embed_pending(self) -> None:
        """Embed every record still without a vector (Lazy loads), EMBED_CHUNK at a time."""
        if not self._pending:
            return
        with self._embed_lock:
            while True:
                with self._lock:
                    todo = [r for r in range(len(self._ids))
                            if self._has_vec[r] == 0][:EMBED_CHUNK]
                    texts = [self._texts[r] for r in todo]
                    generation = self._ids
                if not todo:
                    return
                vectors = self._embedder.embed(texts)
                with self._lock:
                    if self._ids is not generation:      # compacted or cleared meanwhile
                        continue
                    fresh = [i for i, r in enumerate(todo) if self._has_vec[r] == 0]
                    if not fresh:
                        continue
                    rows = [todo[i] for i in fresh]
                    for i, r in zip(fresh, rows):
                        self._vectors[r] = vectors[i]
                        self._has_vec[r] = 1
                        if self._live[r]:
                            self._pending -= 1
                    self._index.add(vectors[fresh], threads=1, keys=np.array(rows))
                    self.version += 1
                    self._view = None

    # ---- searching

    def view(self) -> KbView:
        """A consistent, read-only view for searches (embeds pending records first)."""
        self.embed_pending()
        with self._lock:
            if self._view is None or self._view.version != self.version:
                self._view = KbView(self)
            return self._view

    def filter_schema(self, text: str) -> Schema:
        """The schema a filter is checked against now (see _filter_schema)."""
        with self._lock:
            return _filter_schema(dict(self._types), text)

    def compile_filter(self, text: str, var_kind: Callable[[str], str | None],
                       view: KbView) -> Filter | None:
        """The filter compiled against this view's field types (kept per types)."""
        if not text or not text.strip():
            return None
        key = (text, view.types_key)
        with self._lock:
            hit = self._filters.get(key)
        if hit is not None:
            return hit
        flt = compile_filter(text, view.schema_for(text), var_kind)
        with self._lock:
            if len(self._filters) > 64:
                self._filters.clear()
            self._filters[key] = flt
        return flt

    def query(self, text: str, top_k: int, max_distance: float, filter_text: str
              ) -> list[tuple[Record, float]]:
        """MutableKbQuery: nearest live records, best first; 8110 naming a bad value."""
        if not text or not text.strip():
            raise _bad_query("query_text", "is empty")
        if len(text) > MAX_TEXT_CHARS:
            raise _bad_query("query_text", f"{len(text)} characters; at most {MAX_TEXT_CHARS}")
        if not 1 <= top_k <= MAX_TOP_K:
            raise _bad_query("top_k", f"{top_k} must be between 1 and {MAX_TOP_K}")
        if not (math.isfinite(max_distance) and 0.0 <= max_distance <= 2.0):
            raise _bad_query("max_distance", f"{max_distance!r} must be a cosine distance "
                                             "between 0 and 2 (0: no threshold)")
        view = self.view()
        try:
            flt = self.compile_filter(filter_text, lambda name: None, view)
        except FilterError as exc:
            raise _bad_query("filter_json", str(exc)) from None
        allow = view.allowed(flt, None)
        hits = view.vector_search(view.embed_query(text), top_k, allow, max_distance)
        return [(Record(view.ids[h.row], view.texts[h.row], view.meta_json[h.row]),
                 h.distance) for h in hits]


def _check_types(meta: dict, types: dict[str, str], where: str) -> None:
    for key, value in meta.items():
        t = _value_type(value)
        old = types.get(key)
        if old is None or old == t or {old, t} == {"int", "float"}:
            continue
        raise _bad_record(f"{where}.metadata_json.{key}",
                          f"is {_A[t]} here; the store's records carry it as {_A[old]}")


_A = {"int": "an int", "float": "a float", "string": "a string", "bool": "a bool",
      "set<string>": "an array of strings"}


def _merge_types(meta: dict, types: dict[str, str]) -> None:
    for key, value in meta.items():
        t = _value_type(value)
        old = types.get(key)
        types[key] = "float" if {old, t} == {"int", "float"} else (old or t)


def _record_bytes(r: Record) -> int:
    return len(r.id.encode()) + len(r.text.encode()) + len(r.metadata_json.encode()) + 64


class KbView:
    """A store's rows as they were when the view was taken: the interface Retrieve and
    ClassifyIntent search (the same as an EmbeddedStorage's)."""

    def __init__(self, kb: MutableKb) -> None:
        n = len(kb._ids)
        self.kb = kb
        self.name = kb.name
        self.version = kb.version
        self.ids = kb._ids
        self.texts = kb._texts
        self.meta_json = kb._meta_json
        self._metas = kb._metas
        self.n = n
        self.live = np.frombuffer(bytes(kb._live[:n]), dtype=np.uint8).astype(bool)
        self._vectors = kb._vectors
        self._index = kb._index
        self._lock = kb._lock
        self.types = dict(kb._types)
        self.types_key = tuple(sorted(self.types.items()))
        self._columns: dict = {}
        self._lexical: Lexical | None = None
        self.dim = kb.dim

    def __len__(self) -> int:
        return int(self.live.sum())

    @property
    def schema(self) -> Schema:
        return Schema([Field(k, t, None, True) for k, t in sorted(self.types.items())])

    def schema_for(self, filter_text: str) -> Schema:
        return _filter_schema(self.types, filter_text)

    def columns_for(self, schema: Schema) -> Columns:
        key = tuple((f.name, f.type) for f in schema.fields)
        cols = self._columns.get(key)
        if cols is None:
            objects = [m if self.live[i] else None for i, m in enumerate(self._metas[:self.n])]
            cols = Columns(schema, objects, "metadata")
            self._columns[key] = cols
        return cols

    @property
    def columns(self) -> Columns:
        return self.columns_for(self.schema)

    def embed_query(self, text: str) -> np.ndarray:
        return self.kb._embedder.embed([text])[0]

    def allowed(self, flt: Filter | None, variables) -> np.ndarray:
        """Live rows passing the filter (the index holds tombstoned rows too)."""
        if flt is None:
            return self.live
        cols = self.columns_for(self.schema_for(flt.text))
        return self.live & flt.mask(cols, variables)

    def vector_search(self, query: np.ndarray, count: int, allow: np.ndarray | None,
                      threshold: float) -> list[Hit]:
        allow = self.live if allow is None else allow
        if not allow.any():
            return []
        with self._lock:
            keys, dist = self._index.search(query, count, allow)
        return [Hit(int(k), float(d)) for k, d in zip(keys, dist)
                if threshold <= 0 or d <= threshold]

    def lexical(self) -> Lexical:
        if self._lexical is None:
            self._lexical = Lexical(self.texts[:self.n])
        return self._lexical

    def lexical_search(self, text: str, count: int, allow: np.ndarray | None
                       ) -> list[tuple[int, float]]:
        scores = self.lexical().scores(text)
        scores = np.where(self.live if allow is None else allow, scores, 0.0)
        nonzero = np.flatnonzero(scores > 0)
        order = nonzero[np.argsort(-scores[nonzero], kind="stable")][:count]
        return [(int(r), float(scores[r])) for r in order]

    def distances(self, query: np.ndarray, rows: Sequence[int]) -> np.ndarray:
        if not len(rows):
            return np.zeros(0, dtype=np.float32)
        return 1.0 - self._vectors[list(rows)] @ query


def _filter_schema(types: dict[str, str], filter_text: str) -> Schema:
    """The store's typed fields plus, for fields the filter names that no record has
    carried yet, the type the filter compares them with (every record lacks them)."""
    fields = _guess_field_types(filter_text)
    fields.update(types)
    return Schema([Field(k, t, None, True) for k, t in sorted(fields.items())])


def _guess_field_types(text: str) -> dict[str, str]:
    """{field: type} for `knowledge` operands, from what each is compared with."""
    try:
        tree = json.loads(text)
    except ValueError:
        return {}
    out: dict[str, str] = {}

    def literal(o) -> str | None:
        if isinstance(o, dict) and len(o) == 1 and "value" in o:
            v = o["value"]
            if isinstance(v, list):
                return None
            return _value_type(v)
        return None

    def walk(n) -> None:
        if isinstance(n, list):
            for x in n:
                walk(x)
            return
        if not isinstance(n, dict):
            return
        op = n.get("op")
        if op in ("eq", "ne", "lt", "le", "gt", "ge"):
            for a, b in (("lhs", "rhs"), ("rhs", "lhs")):
                o = n.get(a)
                if isinstance(o, dict) and isinstance(o.get("knowledge"), str):
                    out.setdefault(o["knowledge"], literal(n.get(b)) or
                                   ("float" if op not in ("eq", "ne") else "string"))
        elif op == "in":
            needle, hay = n.get("needle"), n.get("haystack")
            if isinstance(needle, dict) and isinstance(needle.get("knowledge"), str):
                elem = None
                if isinstance(hay, dict) and isinstance(hay.get("value"), list) and hay["value"]:
                    elem = _value_type(hay["value"][0])
                out.setdefault(needle["knowledge"], elem or "string")
            if isinstance(hay, dict) and isinstance(hay.get("knowledge"), str):
                out.setdefault(hay["knowledge"], "set<string>")
        for v in n.values():
            if isinstance(v, (dict, list)):
                walk(v)

    walk(tree)
    return out


# ---- snapshots (TMKB) and game-memory files

def encode_parts(kb_name: str, schema: KbSchema, records: Sequence[Record],
                 limit: int = PART_BYTES) -> list[bytes]:
    """The store as TMKB buffers of at most about `limit` bytes each (one when it fits)."""
    groups: list[list[Record]] = [[]]
    size = 0
    for r in records:
        b = _record_bytes(r)
        if groups[-1] and size + b > limit:
            groups.append([])
            size = 0
        groups[-1].append(r)
        size += b
    now = int(time.time() * 1000)
    return [codec.encode_root(codec.PersistedKb(
        format_version=SNAPSHOT_FORMAT, store_name=kb_name, schema_name=schema.schema_name,
        schema_version=schema.schema_version, embedding_model_name=schema.embedding_model,
        metadata_fields=list(schema.metadata_fields), part=i, parts=len(groups),
        records=[codec.PersistedKbRecord(id=r.id, text=r.text, metadata_json=r.metadata_json)
                 for r in group], written_at_ms=now))
        for i, group in enumerate(groups)]


@dataclass
class Parsed:
    """A store read from a snapshot or file, validated, not yet embedded."""
    name: str
    schema_name: str
    schema_version: int
    model: str
    fields: tuple[str, ...]
    records: list[Record]
    metas: list[dict]


def parse_part(data: bytes, where: str):
    """Verify one TMKB buffer: (its header fields, its records validated); 8106."""
    if not data:
        raise _bad_snapshot(where, "empty")
    try:
        snap = codec.decode_root(codec.PersistedKb, bytes(data))
        version = int(snap.format_version)
        name = snap.store_name or ""
        head = (name, snap.schema_name or "", int(snap.schema_version),
                snap.embedding_model_name or "", tuple(snap.metadata_fields),
                int(snap.part), int(snap.parts))
        raw = [(r.id or "", r.text or "", r.metadata_json or "") for r in snap.records]
    except (codec.CodecError, UnicodeDecodeError) as exc:
        raise _bad_snapshot(where, f"not a valid TMKB buffer ({exc})") from None
    if version == 0:
        raise _bad_snapshot(f"{where}.format_version", "0 (absent): a writer stores 1")
    if version > SNAPSHOT_FORMAT:
        raise _bad_snapshot(f"{where}.format_version",
                            f"{version} is newer than this server reads ({SNAPSHOT_FORMAT})")
    try:
        check_name(name, ErrorCode.InvalidMutableKbSnapshot)
    except TryllError as exc:
        raise _bad_snapshot(f"{where}.store_name", exc.message) from None
    part, parts = head[5], head[6]
    if parts < 1 or part >= parts:
        raise _bad_snapshot(f"{where}.part", f"part {part} of {parts}")
    records, metas = [], []
    seen: set[str] = set()
    fields = tuple(sorted(set(head[4])))
    for i, (rid, text, meta_raw) in enumerate(raw):
        at = f"{where}.records[{i}]"
        try:
            if not rid:
                raise _bad_record(f"{at}.id", "is empty")
            check_id(rid, at)
            check_text(text, at)
            meta, meta_json = check_metadata(meta_raw, fields, at)
        except TryllError as exc:
            raise _bad_snapshot(at, exc.message) from None
        if rid in seen:
            raise _bad_snapshot(f"{at}.id", f"{rid!r} appears twice")
        seen.add(rid)
        records.append(Record(rid, text, meta_json))
        metas.append(meta)
    return head, records, metas


def join_parts(parts: Sequence[tuple], where: str) -> list[Parsed]:
    """Consecutive parts of each store, in order, into Parsed stores; 8106 on a gap."""
    out: list[Parsed] = []
    names: set[str] = set()
    i = 0
    while i < len(parts):
        head, records, metas = parts[i]
        name, total = head[0], head[6]
        if head[5] != 0:
            raise _bad_snapshot(f"{where}[{i}]", f"store {name!r} starts at part {head[5]}")
        if name in names:
            raise _bad_snapshot(f"{where}[{i}]", f"store {name!r} appears twice")
        names.add(name)
        recs, ms = list(records), list(metas)
        for k in range(1, total):
            if i + k >= len(parts):
                raise _bad_snapshot(where, f"store {name!r} has {k} of its {total} parts "
                                           "(the file is truncated)")
            h, r, m = parts[i + k]
            if h[0] != name or h[5] != k or h[6] != total or h[1:5] != head[1:5]:
                raise _bad_snapshot(f"{where}[{i + k}]", f"expected part {k} of store "
                                                        f"{name!r}")
            recs += r
            ms += m
        if len({r.id for r in recs}) != len(recs):
            raise _bad_snapshot(where, f"store {name!r} repeats a record id across parts")
        if len(recs) > MAX_RECORDS:
            raise _bad_snapshot(where, f"store {name!r} has {len(recs)} records; at most "
                                       f"{MAX_RECORDS}")
        out.append(Parsed(name, head[1], head[2], head[3], head[4], recs, ms))
        i += total
    return out


def encode_file(stores: Sequence[tuple[str, KbSchema, list[Record]]]) -> bytes:
    body = bytearray()
    count = 0
    for name, schema, records in stores:
        for buf in encode_parts(name, schema, records):
            body += struct.pack("<I", len(buf))
            body += buf
            count += 1
    header = _HEADER.pack(FILE_MAGIC, FILE_FORMAT, count, zlib.crc32(body) & 0xFFFFFFFF,
                          int(time.time() * 1000))
    return header + bytes(body)


def parse_file(data: bytes, shown: str) -> list[Parsed]:
    """A game-memory file's stores, validated completely; 8106 naming the problem."""
    if len(data) < _HEADER.size:
        raise _bad_snapshot(shown, f"{len(data)} bytes: shorter than the header "
                                   "(truncated)")
    magic, fmt, count, crc, _ = _HEADER.unpack_from(data)
    if magic != FILE_MAGIC:
        raise _bad_snapshot(shown, "not a game-memory file (no TGMF header)")
    if fmt == 0 or fmt > FILE_FORMAT:
        raise _bad_snapshot(shown, f"format {fmt}; this server reads 1..{FILE_FORMAT}")
    body = memoryview(data)[_HEADER.size:]
    if zlib.crc32(body) & 0xFFFFFFFF != crc:
        raise _bad_snapshot(shown, "checksum mismatch (the file is truncated or corrupted)")
    parts = []
    pos = 0
    for k in range(count):
        if pos + 4 > len(body):
            raise _bad_snapshot(shown, f"part {k} of {count} is missing (truncated)")
        (n,) = struct.unpack_from("<I", body, pos)
        pos += 4
        if n == 0 or pos + n > len(body):
            raise _bad_snapshot(shown, f"part {k} of {count}: {n} bytes past the end")
        parts.append(parse_part(bytes(body[pos:pos + n]), f"{shown} part {k}"))
        pos += n
    if pos != len(body):
        raise _bad_snapshot(shown, f"{len(body) - pos} bytes after the last part")
    return join_parts(parts, shown)


# ---- the session's stores

class SessionMemory:
    """A session's mutable knowledge bases by name; at most max_stores (the server's
    session.max_mutable_kbs)."""

    def __init__(self, models, *, max_stores: int) -> None:
        self.models = models
        self.max_stores = max_stores
        self.stores: dict[str, MutableKb] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> MutableKb:
        kb = self.stores.get(name)
        if kb is None:
            check_name(name, ErrorCode.InvalidMutableKbName)
            known = ", ".join(sorted(self.stores)[:20]) or "none"
            raise TryllError(ErrorCode.MutableKbNotFound,
                             f"the session has no mutable KB named {name!r} (it has: {known}; "
                             "EnsureMutableKb creates one)")
        return kb

    def _lease(self, model: str):
        try:
            return self.models.lease(model)
        except TryllError as exc:
            raise TryllError(ErrorCode.InvalidMutableKbSchema,
                       f"embedding model {model!r} cannot be loaded: {exc.message}") from None

    def ensure(self, name: str, raw_schema) -> tuple[MutableKb, bool]:
        check_name(name, ErrorCode.InvalidMutableKbName)
        schema = parse_schema(raw_schema, self.models)
        with self._lock:
            kb = self.stores.get(name)
            if kb is not None:
                diff = kb.schema.differences(schema)
                if diff:
                    raise TryllError(ErrorCode.MutableKbSchemaMismatch,
                                     f"mutable KB {name!r} exists with another schema: "
                                     + "; ".join(diff))
                return kb, False
            if len(self.stores) >= self.max_stores:
                raise TryllError(ErrorCode.MutableKbLimitExceeded,
                                 f"the session holds {len(self.stores)} mutable KBs, the "
                                 f"most session.max_mutable_kbs allows ({self.max_stores})")
        lease = self._lease(schema.embedding_model)
        kb = MutableKb(name, schema, lease.obj, lease)
        with self._lock:
            self.stores.setdefault(name, kb)
            return self.stores[name], self.stores[name] is kb

    def check_room(self, kb: MutableKb, records: Sequence[Any]) -> None:
        extra = sum(len(r.text or "") + len(r.metadata_json or "") + kb.dim * 4 + 256
                    for r in records)
        used = sum(store.size_bytes() for store in self.stores.values())
        if used + extra > MAX_SESSION_BYTES:
            raise TryllError(ErrorCode.MutableKbLimitExceeded,
                             f"the session's mutable KBs hold {used} bytes; this write would "
                             f"pass the {MAX_SESSION_BYTES}-byte limit")

    def build(self, parsed: Parsed, embed_now: bool, warnings: list[str]) -> MutableKb:
        """A new store from a parsed snapshot (not registered yet)."""
        model = parsed.model
        entry = self.models.catalog.get(model) if model else None
        if entry is None or entry.role != "embedding":
            fallback = default_embedding_model(self.models)
            if fallback is None:
                raise _bad_snapshot(parsed.name, f"embedding model {model!r} is not in the "
                                                 "catalog and there is no other")
            warnings.append(f"store {parsed.name!r} was written under embedding model "
                            f"{model!r}, which this server does not have: its records are "
                            f"embedded with {fallback!r}")
            model = fallback
        schema = KbSchema(parsed.schema_name, parsed.schema_version, model, parsed.fields)
        lease = self._lease(model)
        types: dict[str, str] = {}
        try:
            for i, m in enumerate(parsed.metas):
                _check_types(m, types, f"{parsed.name} records[{i}]")
                _merge_types(m, types)
        except TryllError as exc:
            lease.release()
            raise _bad_snapshot(parsed.name, exc.message) from None
        kb = MutableKb(parsed.name, schema, lease.obj, lease)
        kb.load_records(parsed.records, parsed.metas, embed_now)
        return kb

    def replace_all(self, stores: Sequence[MutableKb]) -> None:
        with self._lock:
            self.stores = {kb.name: kb for kb in stores}

    def put(self, kb: MutableKb) -> None:
        with self._lock:
            if kb.name not in self.stores and len(self.stores) >= self.max_stores:
                raise TryllError(ErrorCode.MutableKbLimitExceeded,
                                 f"the session holds {len(self.stores)} mutable KBs, the "
                                 f"most session.max_mutable_kbs allows ({self.max_stores})")
            self.stores[kb.name] = kb

    def clear(self) -> None:
        with self._lock:
            self.stores = {}


class KbRef:
    """A node's reference to a session mutable KB by name: resolved on every search, so
    a store LoadGameMemory replaced is the one read."""

    def __init__(self, memory: SessionMemory, name: str) -> None:
        self.memory = memory
        self.name = name

    def current(self) -> MutableKb | None:
        return self.memory.stores.get(self.name)
