"""String storages: named, immutable lists and maps of strings (docs/knowledge.md).

Kinds: List (values in order), Map (key -> one text, keys unique, sorted by key) and
Multimap (key -> texts, keys repeat, sorted by key, file order kept among equal keys).
Inline content is `strings` (+ parallel `keys` for maps); a file under the storage root is
`.txt` for a List (UTF-8, a value a line, blank lines and `#` comments skipped) and a JSON
array of `{id, text}` for a Map (`.json`) or a Multimap (`.mm.json` or `.json`; extra keys
such as `metadata` are ignored).

Errors name the field and the rule: 7001 a bad name, 7002 a name the session already
has, 7003 bad content (duplicate Map keys, unequal key and value counts, an unreadable or
malformed file, a limit passed), 7004 a name an embedded storage of the session holds;
3009 / 3010 / 3011 for paths (knowledge/paths.py), 3011 also for a file of the wrong kind.

A storage never changes once made: an agent that compiled a node against one keeps it,
whatever the session destroys or creates later under that name.
"""
from __future__ import annotations

import enum
import json
import threading
from collections import OrderedDict
from pathlib import Path, PurePosixPath

from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.knowledge import paths as root_paths

MAX_NAME_CHARS = 128
MAX_ENTRIES = 100_000
MAX_VALUE_CHARS = 65_536
MAX_FILE_BYTES = 16 << 20
FILE_CACHE_ENTRIES = 64


class Kind(enum.IntEnum):
    List = 0
    Map = 1
    Multimap = 2


SUFFIXES = {Kind.List: (".txt",), Kind.Map: (".json",), Kind.Multimap: (".mm.json", ".json")}


class StringStorage:
    """One storage. `values` in order (List) or in key order (maps); `keys` parallel to
    them for maps, None for a List."""

    __slots__ = ("name", "kind", "values", "keys", "source", "chars", "_map")

    def __init__(self, name: str, kind: Kind, values: tuple[str, ...],
                 keys: tuple[str, ...] | None = None, source: str = "") -> None:
        self.name = name
        self.kind = kind
        self.values = values
        self.keys = keys
        self.source = source
        self.chars = sum(map(len, values)) + (sum(map(len, keys)) if keys else 0)
        self._map: dict | None = None

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        return f"<StringStorage {self.name!r} {self.kind.name} {len(self)} entries>"

    def mapping(self) -> dict[str, str] | dict[str, tuple[str, ...]]:
        """Map: key -> text; Multimap: key -> texts in order."""
        if self.keys is None:
            raise TypeError(f"string storage {self.name!r} is a List, not a map")
        if self._map is None:
            if self.kind == Kind.Map:
                self._map = dict(zip(self.keys, self.values))
            else:
                grouped: dict[str, list[str]] = {}
                for k, v in zip(self.keys, self.values):
                    grouped.setdefault(k, []).append(v)
                self._map = {k: tuple(v) for k, v in grouped.items()}
        return self._map


def check_name(name: str, code: int = ErrorCode.InvalidStringStorageName) -> str:
    """A storage name's rules (string and embedded storages alike; `code` is the kind's)."""
    if not name or not name.strip():
        raise TryllError(code, "name is empty")
    if len(name) > MAX_NAME_CHARS:
        raise TryllError(code, f"name has {len(name)} characters; at most {MAX_NAME_CHARS}")
    if name != name.strip() or any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise TryllError(code, f"name {name!r} has leading or trailing spaces or control "
                               "characters")
    return name


def _bad(what: str, problem: str) -> TryllError:
    return TryllError(ErrorCode.InvalidStringStorageData, f"{what}: {problem}")


def _check_values(values, what: str) -> None:
    if len(values) > MAX_ENTRIES:
        raise _bad(what, f"{len(values)} entries; at most {MAX_ENTRIES}")
    for i, v in enumerate(values):
        if len(v) > MAX_VALUE_CHARS:
            raise _bad(what, f"entry {i} has {len(v)} characters; at most {MAX_VALUE_CHARS}")


def _sorted_map(name: str, kind: Kind, pairs: list[tuple[str, str]], what: str,
                source: str = "") -> StringStorage:
    _check_values([v for _, v in pairs], what)
    for i, (k, _) in enumerate(pairs):
        if not k:
            raise _bad(what, f"entry {i} has an empty key")
    pairs = sorted(pairs, key=lambda kv: kv[0])       # stable: file order among equal keys
    keys = tuple(k for k, _ in pairs)
    if kind == Kind.Map:
        for a, b in zip(keys, keys[1:]):
            if a == b:
                raise _bad(what, f"duplicate key {a!r} (a Map's keys are unique; a Multimap "
                                 "accepts repeats)")
    return StringStorage(name, kind, tuple(v for _, v in pairs), keys, source)


def from_inline(name: str, kind: int, strings, keys) -> StringStorage:
    """A storage from CreateStringStorageRequest's inline fields."""
    kind = _kind(kind)
    strings = list(strings or ())
    keys = list(keys or ())
    if kind == Kind.List:
        if keys:
            raise _bad("keys", f"{len(keys)} keys given for a List (keys are for Map and "
                               "Multimap)")
        if not strings:
            raise _bad("strings", "empty: give strings or file_path")
        _check_values(strings, "strings")
        return StringStorage(name, kind, tuple(strings))
    if not strings or len(strings) != len(keys):
        raise _bad("keys", f"a {kind.name} needs keys and strings of equal, non-zero "
                           f"length (got {len(keys)} keys, {len(strings)} strings)")
    return _sorted_map(name, kind, list(zip(keys, strings)), "strings")


def _kind(kind: int) -> Kind:
    try:
        return Kind(int(kind))
    except ValueError:
        raise _bad("kind", f"{int(kind)} is not a StringStorageKind (0 List, 1 Map, "
                           "2 Multimap)") from None


def file_kind(path: str) -> Kind:
    """The kind a storage file's name says it holds."""
    low = path.lower()
    if low.endswith(".txt"):
        return Kind.List
    if low.endswith(".mm.json"):
        return Kind.Multimap
    if low.endswith(".json"):
        return Kind.Map
    raise TryllError(ErrorCode.StorageKindMismatch,
                     f"{path!r} is not a string storage file (.txt, .json or .mm.json)")


def from_file(name: str, kind: int | None, file: Path, shown: str) -> StringStorage:
    """A storage read from `file` (already resolved under the storage root; `shown` is the
    path as the client wrote it). kind None: the file's own kind."""
    own = file_kind(file.name)
    kind = own if kind is None else _kind(kind)
    if own != kind and not (kind == Kind.Multimap and own == Kind.Map):
        raise TryllError(ErrorCode.StorageKindMismatch,
                         f"file_path {shown!r} holds a {own.name} ({', '.join(SUFFIXES[own])}); "
                         f"a {kind.name} reads {' or '.join(SUFFIXES[kind])}")
    what = f"file_path {shown!r}"
    try:
        size = file.stat().st_size
        if size > MAX_FILE_BYTES:
            raise _bad(what, f"{size} bytes; at most {MAX_FILE_BYTES}")
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(what, f"not UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise _bad(what, f"cannot be read: {exc.strerror or exc}") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if kind == Kind.List:
        values = [line.strip() for line in text.splitlines()]
        values = [v for v in values if v and not v.startswith("#")]
        if not values:
            raise _bad(what, "no values (every line is blank or a # comment)")
        _check_values(values, what)
        return StringStorage(name, kind, tuple(values), None, shown)
    try:
        records = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(what, f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") \
            from None
    if not isinstance(records, list):
        raise _bad(what, "expected a JSON array of {\"id\", \"text\"} objects")
    pairs = []
    for i, r in enumerate(records):
        if not isinstance(r, dict):
            raise _bad(what, f"[{i}] is not an object")
        key, value = r.get("id"), r.get("text")
        if isinstance(key, int) and not isinstance(key, bool):
            key = str(key)
        if not isinstance(key, str):
            raise _bad(what, f"[{i}].id is missing or not a string")
        if not isinstance(value, str):
            raise _bad(what, f"[{i}].text is missing or not a string")
        pairs.append((key, value))
    if not pairs:
        raise _bad(what, "an empty array")
    return _sorted_map(name, kind, pairs, what, shown)


def localized_path(relative: str, locale: str) -> list[str]:
    """The paths to try for a linked file, best first: `loc/<tag>/` beside it (the whole
    BCP-47 tag, then its language alone), then the file itself."""
    out = []
    if locale:
        p = PurePosixPath(relative)
        for tag in dict.fromkeys((locale, locale.split("-")[0])):
            out.append(str(p.parent / "loc" / tag / p.name))
    out.append(relative)
    return out


class StorageFiles:
    """Server-wide cache of storage files read for nodes (many agents link the same
    barks file): keyed by the real path, its size and modification time, so an edited file
    is read again. At most FILE_CACHE_ENTRIES, least recently used dropped."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._cache: OrderedDict = OrderedDict()

    def resolve(self, relative: str, locale: str, what: str) -> tuple[Path, str]:
        """The real file for `relative`, the `loc/<language>/` translation when there is
        one; returns (file, the relative path used)."""
        try:                        # the path as written is checked first (3009 first)
            own = root_paths.resolve(self.root, relative, suffixes=(), what=what)
            missing = None
        except TryllError as exc:
            if exc.code != ErrorCode.StorageFileNotFound:
                raise
            own, missing = None, exc
        for candidate in localized_path(relative, locale)[:-1]:
            try:
                return root_paths.resolve(self.root, candidate, suffixes=(), what=what), \
                    candidate
            except TryllError as exc:
                if exc.code != ErrorCode.StorageFileNotFound:
                    raise
        if own is None:
            raise missing
        return own, relative

    def load(self, relative: str, locale: str, what: str,
             kind: int | None = None) -> StringStorage:
        file, used = self.resolve(relative, locale, what)
        st = file.stat()
        key = (str(file), st.st_size, st.st_mtime_ns, kind)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        made = from_file(used, kind, file, used)
        with self._lock:
            self._cache[key] = made
            while len(self._cache) > FILE_CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return made


class SessionStorages:
    """A session's named string storages (CreateStringStorage pins one, Destroy unpins).
    max_storages and max_chars are a runaway client's bounds: the server's
    session.max_string_storages and session.max_string_storage_chars."""

    def __init__(self, files: StorageFiles, other_names=lambda: (), *,
                 max_storages: int, max_chars: int) -> None:
        self.files = files
        self.max_storages = max_storages
        self.max_chars = max_chars
        self.by_name: dict[str, StringStorage] = {}
        # names held by the session's other storages (embedded): 7004 when reused
        self._other_names = other_names

    def create(self, req, locale: str) -> StringStorage:
        name = check_name(req.name)
        if name in self.by_name:
            raise TryllError(ErrorCode.StringStorageAlreadyExists,
                             f"the session already has a string storage named {name!r}; "
                             "destroy it first (storages are immutable)")
        if name in self._other_names():
            raise TryllError(ErrorCode.StorageNameInUse,
                             f"{name!r} names an embedded string storage of this session")
        if len(self.by_name) >= self.max_storages:
            raise TryllError(ErrorCode.SessionLimitReached,
                             f"the session holds {len(self.by_name)} string storages, the "
                             f"most session.max_string_storages allows ({self.max_storages}); "
                             "destroy one first")
        if req.file_path and (req.strings or req.keys):
            raise _bad("file_path", "give strings (and keys) or file_path, not both")
        if req.file_path:
            loaded = self.files.load(req.file_path, locale, "file_path", req.kind)
            made = StringStorage(name, loaded.kind, loaded.values, loaded.keys,
                                 loaded.source)
        else:
            made = from_inline(name, req.kind, req.strings, req.keys)
        held = sum(st.chars for st in self.by_name.values())
        if held + made.chars > self.max_chars:
            raise TryllError(ErrorCode.SessionLimitReached,
                             f"{made.chars} characters; the session's string storages hold "
                             f"{held} and session.max_string_storage_chars allows "
                             f"{self.max_chars} in all")
        self.by_name[name] = made
        return made

    def destroy(self, name: str) -> None:
        if self.by_name.pop(name, None) is None:
            raise TryllError(ErrorCode.InvalidStringStorageName,
                             f"the session has no string storage named {name!r}"
                             + (f" (it has: {', '.join(sorted(self.by_name))})"
                                if self.by_name else ""))

    def resolve(self, ref: str, kinds: tuple[Kind, ...], where: str, locale: str,
                code: int, linked: dict | None = None) -> StringStorage:
        """A node's `string_storage`: what the agent already linked under `ref` (in
        `linked`, which the new link joins), else a session storage by name, else a file
        under the storage root (with the session locale's translation preferred). `code`
        is the error for a reference that names nothing (3003 at CreateAgent, 3007
        later)."""
        found = linked.get(ref) if linked is not None else None
        if found is None:
            found = self._lookup(ref, where, locale, code)
            if linked is not None:
                linked[ref] = found
        if found.kind not in kinds:
            raise TryllError(ErrorCode.StorageKindMismatch,
                             f"{where}: string_storage {ref!r} is a {found.kind.name}; this "
                             f"node reads a {' or '.join(k.name for k in kinds)}")
        return found

    def _lookup(self, ref: str, where: str, locale: str, code: int) -> StringStorage:
        found = self.by_name.get(ref)
        if found is None:
            low = ref.lower()
            if not low.endswith((".txt", ".json")):
                raise TryllError(code, f"{where}: string_storage {ref!r} names no string "
                                       "storage of this session (and is not a .txt or "
                                       ".json path under the storage root)")
            try:
                found = self.files.load(ref, locale, f"{where}: string_storage")
            except TryllError as exc:
                if exc.code == ErrorCode.InvalidStringStorageData:
                    raise TryllError(code, exc.message) from None
                raise
        return found

    def clear(self) -> None:
        self.by_name.clear()
