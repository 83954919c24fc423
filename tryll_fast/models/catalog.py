"""The model catalog: a TOML file of entries, validated completely at load time.

A catalog error names the catalog file, the entry and the field, because whoever reads it is
editing that file by hand. The format is documented in docs/models.md; the default catalog
is catalog.toml beside this module.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

CATALOG_FORMAT = 1

# Roles as the catalog spells them, with the wire enum ModelRole each one maps to.
ROLE_TO_PROTOCOL = MappingProxyType({"llm": 0, "embedding": 1, "stt": 2, "tts": 3, "vad": 4})
ROLES = tuple(ROLE_TO_PROTOCOL)
# Engines are strings here; on the wire they are InferenceEngine values (the original's
# numbering: Mock 0, LlamaCpp 1, SherpaOnnx 6; FasterWhisper 8 and OnnxRuntime 9 are ours).
ENGINE_WIRE_VALUES = MappingProxyType({"llama-cpp": 1, "sherpa-onnx": 6, "faster-whisper": 8,
                                       "onnxruntime": 9, "mock": 0})
ENGINES = tuple(ENGINE_WIRE_VALUES)

# Entry and file names become directory and file names under the models dir, so they are
# restricted to characters that are safe on every filesystem and cannot climb out of it.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_LANGUAGE_RE = re.compile(r"[A-Za-z]{2,8}(-[A-Za-z0-9]{1,8})*")
# A pinned requirement only: an unpinned one could resolve to bytes the sha256 never saw.
_PYPI_RE = re.compile(
    r"pypi:(?P<req>[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.!+_-]+)#(?P<member>[^#]+)")
# Separates the archives of a nested member: "<wheel member>!<member of that zip>".
ARCHIVE_SEP = "!"
# The record file sits beside the entry directories in the models dir.
_RESERVED_ENTRY_NAMES = {"downloads.json"}
# Suffixes the fetcher uses for its own temporary files.
_RESERVED_SUFFIXES = (".part", ".lock", ".tmp")

_ENTRY_KEYS = {
    "name", "role", "engine", "description", "files", "languages", "capabilities",
    "dependencies", "default_sampling", "context_size", "hidden", "default", "main_file",
    "huggingface_repo", "prepare",
}
_FILE_KEYS = {"name", "sha256", "size", "source"}
_CAPABILITIES = {
    "llm": {"chat_template": bool, "embeddings": bool},
    "embedding": {"dimensions": int, "pooling": str},
    "tts": {"sample_rate": int, "num_speakers": int, "expressiveness": bool,
            "supports_speed": bool, "supports_voice_description": bool,
            "supports_reference_clip": bool},
    "stt": {"sample_rate": int, "streaming": bool},
    "vad": {"sample_rate": int},
}
# (type, lowest, highest, lowest_inclusive): the same ranges SamplingOverrides documents.
_SAMPLING = {
    "temperature": (float, 0.0, None, True),
    "top_k": (int, 0, None, True),
    "top_p": (float, 0.0, 1.0, True),
    "min_p": (float, 0.0, 1.0, True),
    "repeat_penalty": (float, 0.0, None, False),
    "presence_penalty": (float, 0.0, 2.0, True),
    "frequency_penalty": (float, 0.0, 2.0, True),
    "seed": (int, 0, 4294967295, True),
    "max_tokens": (int, 0, None, False),
    "stop": (list, None, None, True),
    # DRY, for speech only (the nodes that copy on purpose, tool calls and summaries, run
    # without it): docs/models.md
    "dry_multiplier": (float, 0.0, None, True),
    "dry_base": (float, 1.0, None, False),
    "dry_allowed_length": (int, 1, None, True),
    "dry_last_n": (int, 1, None, True),
}


class CatalogError(ValueError):
    """A catalog file that cannot be used; names the file, the entry and the field."""

    def __init__(self, origin: str, model: str, field_name: str, problem: str) -> None:
        self.origin = origin
        self.model = model
        self.field = field_name
        where = f"model {model!r}" if model else "catalog"
        super().__init__(f"{origin}: {where}: {field_name}: {problem}")


@dataclass(frozen=True)
class Source:
    """Where one file (or one chunk of a file) comes from."""

    kind: str          # "pypi" | "http" | "file"
    location: str      # pinned requirement, URL, or absolute path
    member: str = ""   # pypi: the file's path inside the wheel ("zip!inner" nests)

    def __str__(self) -> str:
        if self.kind == "pypi":
            return f"pypi:{self.location}#{self.member}"
        if self.kind == "file":
            return f"file://{self.location}"
        return self.location


@dataclass(frozen=True)
class ModelFile:
    name: str
    sha256: str
    size: int
    # More than one source: the file is their concatenation, in this order.
    sources: tuple[Source, ...]


@dataclass(frozen=True)
class ModelEntry:
    name: str
    role: str
    engine: str
    description: str
    files: tuple[ModelFile, ...]
    languages: tuple[str, ...] = ()
    capabilities: Mapping[str, Any] = field(default_factory=dict)
    dependencies: tuple[str, ...] = ()
    default_sampling: Mapping[str, Any] = field(default_factory=dict)
    context_size: int = 0
    hidden: bool = False
    default: bool = False
    main_file: str | None = None
    # the model's upstream repository, reported in ModelInfo (files come from `sources`)
    huggingface_repo: str = ""
    # a fetch-time preparation of the main file (engines/registry.py PREPARE), "" = none
    prepare: str = ""

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def protocol_role(self) -> int:
        return ROLE_TO_PROTOCOL[self.role]

    @property
    def prepare_label(self) -> str:
        """The progress label of the entry's preparation step."""
        return f"{self.name}/prepare:{self.prepare}"

    @property
    def prepare_weight(self) -> int:
        """Bytes the preparation counts for in fetch progress: it rewrites the main file."""
        if not self.prepare:
            return 0
        main = self.main_name
        return next((f.size for f in self.files if f.name == main), self.size_bytes)

    @property
    def main_name(self) -> str | None:
        """The file engines open; None means the whole model directory (e.g. CTranslate2)."""
        if self.main_file is not None:
            return self.main_file
        return self.files[0].name if len(self.files) == 1 else None


class Catalog:
    """Validated entries in file order; dependencies always name existing entries."""

    def __init__(self, entries: Iterable[ModelEntry], origin: str = "<catalog>") -> None:
        self.origin = origin
        self.entries: dict[str, ModelEntry] = {e.name: e for e in entries}

    def __iter__(self):
        return iter(self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __getitem__(self, name: str) -> ModelEntry:
        return self.entries[name]

    def get(self, name: str) -> ModelEntry | None:
        return self.entries.get(name)

    def visible(self) -> list[ModelEntry]:
        """What ListModels reports: every entry not marked hidden."""
        return [e for e in self.entries.values() if not e.hidden]

    def defaults(self) -> list[ModelEntry]:
        return [e for e in self.entries.values() if e.default]

    def with_dependencies(self, names: Iterable[str]) -> list[ModelEntry]:
        """The named entries and everything they need, dependencies first, each once.

        Raises KeyError for a name the catalog lacks; loading already rejected cycles.
        """
        ordered: dict[str, ModelEntry] = {}

        def visit(name: str) -> None:
            if name in ordered:
                return
            entry = self.entries[name]
            for dep in entry.dependencies:
                visit(dep)
            ordered[name] = entry

        for name in names:
            visit(name)
        return list(ordered.values())


def default_catalog_path() -> Path:
    return Path(str(resources.files(__package__).joinpath("catalog.toml")))


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Read and validate a catalog file (the packaged default when path is None)."""
    path = Path(path) if path is not None else default_catalog_path()
    origin = str(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise CatalogError(origin, "", "file", f"cannot read: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(origin, "", "syntax", str(exc)) from exc
    return parse_catalog(data, origin)


def parse_catalog(data: Mapping[str, Any], origin: str = "<catalog>") -> Catalog:
    """Validate an already-parsed TOML document (tests build these as dicts)."""
    unknown = set(data) - {"format", "model"}
    if unknown:
        raise CatalogError(origin, "", sorted(unknown)[0], "unknown top-level key")
    fmt = data.get("format")
    if fmt != CATALOG_FORMAT:
        raise CatalogError(origin, "", "format", f"expected {CATALOG_FORMAT}, got {fmt!r}")
    raw_entries = data.get("model", [])
    if not isinstance(raw_entries, list):
        raise CatalogError(origin, "", "model", "must be an array of tables ([[model]])")

    entries: dict[str, ModelEntry] = {}
    for index, raw in enumerate(raw_entries):
        entry = _parse_entry(raw, index, origin)
        if entry.name in entries:
            raise CatalogError(origin, entry.name, "name", "duplicate entry name")
        entries[entry.name] = entry
    _check_dependencies(entries, origin)
    return Catalog(entries.values(), origin)


def _parse_entry(raw: Any, index: int, origin: str) -> ModelEntry:
    label = f"#{index + 1}"
    if not isinstance(raw, dict):
        raise CatalogError(origin, label, "model", "must be a table")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise CatalogError(origin, label, "name",
                           f"missing or not a safe name (letters, digits, . _ -): {name!r}")
    if name in _RESERVED_ENTRY_NAMES:
        raise CatalogError(origin, name, "name", "reserved for the downloads record")

    def fail(field_name: str, problem: str):
        raise CatalogError(origin, name, field_name, problem)

    unknown = set(raw) - _ENTRY_KEYS
    if unknown:
        fail(sorted(unknown)[0], "unknown field")
    role = raw.get("role")
    if role not in ROLES:
        fail("role", f"unknown role {role!r} (expected one of {', '.join(ROLES)})")
    engine = raw.get("engine")
    if engine not in ENGINES:
        fail("engine", f"unknown engine {engine!r} (expected one of {', '.join(ENGINES)})")
    description = raw.get("description", "")
    if not isinstance(description, str):
        fail("description", "must be a string")

    files = _parse_files(raw.get("files"), fail)
    languages = _string_list(raw.get("languages", []), "languages", fail)
    for lang in languages:
        if not _LANGUAGE_RE.fullmatch(lang):
            fail("languages", f"not a BCP-47 tag: {lang!r}")
    dependencies = _string_list(raw.get("dependencies", []), "dependencies", fail)
    if len(set(dependencies)) != len(dependencies):
        fail("dependencies", "lists an entry twice")

    context_size = raw.get("context_size", 0)
    if not _is_int(context_size) or context_size < 0:
        fail("context_size", f"must be an integer >= 0, got {context_size!r}")
    if role == "llm" and context_size == 0:
        fail("context_size", "required (> 0) for an llm")

    capabilities = _parse_capabilities(raw.get("capabilities", {}), role, fail)
    sampling = _parse_sampling(raw.get("default_sampling", {}), role, context_size, fail)

    flags = {}
    for key in ("hidden", "default"):
        value = raw.get(key, False)
        if not isinstance(value, bool):
            fail(key, f"must be true or false, got {value!r}")
        flags[key] = value

    main_file = raw.get("main_file")
    if main_file is not None and main_file not in {f.name for f in files}:
        fail("main_file", f"{main_file!r} is not one of the entry's files")
    upstream = raw.get("huggingface_repo", "")
    if not isinstance(upstream, str) or (upstream and not _REPO_RE.fullmatch(upstream)):
        fail("huggingface_repo", f"must be an owner/name string, got {upstream!r}")
    prepare = raw.get("prepare", "")
    if not isinstance(prepare, str) or (prepare and not _NAME_RE.fullmatch(prepare)):
        fail("prepare", f"must be the name of a preparation step, got {prepare!r}")
    if prepare and main_file is None and len(files) != 1:
        fail("prepare", "needs main_file: the step prepares one file")

    return ModelEntry(
        name=name, role=role, engine=engine, description=description, files=files,
        languages=tuple(languages), capabilities=MappingProxyType(capabilities),
        dependencies=tuple(dependencies), default_sampling=MappingProxyType(sampling),
        context_size=context_size, hidden=flags["hidden"], default=flags["default"],
        main_file=main_file, huggingface_repo=upstream, prepare=prepare,
    )


def _parse_files(raw: Any, fail) -> tuple[ModelFile, ...]:
    if not isinstance(raw, list) or not raw:
        fail("files", "must be a non-empty array of tables ([[model.files]])")
    files: list[ModelFile] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        where = f"files[{i}]"
        if not isinstance(item, dict):
            fail(where, "must be a table")
        unknown = set(item) - _FILE_KEYS
        if unknown:
            fail(f"{where}.{sorted(unknown)[0]}", "unknown field")
        name = item.get("name")
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            fail(f"{where}.name", f"missing or not a plain file name: {name!r}")
        if name.endswith(_RESERVED_SUFFIXES):
            fail(f"{where}.name", f"{name!r} ends with a suffix the fetcher reserves")
        if name in seen:
            fail(f"{where}.name", f"duplicate file name {name!r}")
        seen.add(name)
        where = f"files[{name}]"
        sha = item.get("sha256")
        if sha is None:
            fail(f"{where}.sha256", "missing")
        if not isinstance(sha, str) or not _SHA256_RE.fullmatch(sha):
            fail(f"{where}.sha256", f"must be 64 lowercase hex digits, got {sha!r}")
        size = item.get("size")
        if not _is_int(size) or size <= 0:
            fail(f"{where}.size", f"must be an integer > 0, got {size!r}")
        raw_sources = item.get("source")
        if isinstance(raw_sources, str):
            raw_sources = [raw_sources]
        if not isinstance(raw_sources, list) or not raw_sources:
            fail(f"{where}.source", "missing: a source string or an array of chunk sources")
        sources = tuple(_parse_source(s, f"{where}.source", fail) for s in raw_sources)
        files.append(ModelFile(name=name, sha256=sha, size=size, sources=sources))
    return tuple(files)


def _parse_source(text: Any, where: str, fail) -> Source:
    if not isinstance(text, str):
        fail(where, f"must be a string, got {text!r}")
    if text.startswith("pypi:"):
        m = _PYPI_RE.fullmatch(text)
        if not m:
            fail(where, f"expected 'pypi:<dist>==<version>#<member path>', got {text!r}")
        member = m["member"]
        # "a/model.zip!b/file": a member of a zip archive that is itself a wheel member.
        for part in member.split(ARCHIVE_SEP):
            if not part or part.startswith("/") or ".." in part.split("/"):
                fail(where, f"member path must be relative inside the wheel: {member!r}")
        return Source("pypi", m["req"], member)
    if text.startswith(("https://", "http://")):
        if len(text.split("/", 3)) < 4 or not text.split("/", 3)[2]:
            fail(where, f"URL has no host or path: {text!r}")
        return Source("http", text)
    if text.startswith("file://"):
        path = text[len("file://"):]
        if not path.startswith("/"):
            fail(where, f"file:// needs an absolute path (file:///...), got {text!r}")
        return Source("file", path)
    fail(where, f"unsupported source {text!r} (pypi:, https://, http://, file://)")
    raise AssertionError  # unreachable: fail() raises


def _parse_capabilities(raw: Any, role: str, fail) -> dict[str, Any]:
    if not isinstance(raw, dict):
        fail("capabilities", "must be a table")
    allowed = _CAPABILITIES[role]
    out: dict[str, Any] = {}
    for key, value in raw.items():
        kind = allowed.get(key)
        if kind is None:
            fail(f"capabilities.{key}", f"not a capability of a {role} model "
                 f"(known: {', '.join(sorted(allowed))})")
        ok = _is_int(value) and value >= 0 if kind is int else isinstance(value, kind)
        if not ok:
            expected = "an integer >= 0" if kind is int else kind.__name__
            fail(f"capabilities.{key}", f"must be {expected}, got {value!r}")
        out[key] = value
    return out


def _parse_sampling(raw: Any, role: str, context_size: int, fail) -> dict[str, Any]:
    if not isinstance(raw, dict):
        fail("default_sampling", "must be a table")
    if raw and role != "llm":
        fail("default_sampling", f"only llm entries sample, this one is {role}")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        spec = _SAMPLING.get(key)
        where = f"default_sampling.{key}"
        if spec is None:
            fail(where, f"unknown setting (known: {', '.join(_SAMPLING)})")
        kind, low, high, low_inclusive = spec
        if kind is list:
            out[key] = tuple(_string_list(value, where, fail))
            continue
        if kind is float and _is_int(value):
            value = float(value)
        if not (isinstance(value, float) if kind is float else _is_int(value)):
            fail(where, f"must be {'a number' if kind is float else 'an integer'}, got {value!r}")
        too_low = low is not None and (value < low if low_inclusive else value <= low)
        if too_low or (high is not None and value > high):
            bound = f"{'>=' if low_inclusive else '>'} {low}"
            if high is not None:
                bound += f" and <= {high}"
            fail(where, f"{value!r} out of range (must be {bound})")
        out[key] = value
    max_tokens = out.get("max_tokens")
    if max_tokens is not None and context_size and max_tokens >= context_size:
        fail("default_sampling.max_tokens", f"{max_tokens} must be < context_size {context_size}")
    return out


def _check_dependencies(entries: Mapping[str, ModelEntry], origin: str) -> None:
    for entry in entries.values():
        for dep in entry.dependencies:
            if dep == entry.name:
                raise CatalogError(origin, entry.name, "dependencies", "depends on itself")
            if dep not in entries:
                raise CatalogError(origin, entry.name, "dependencies", f"{dep!r} names no entry")
    # Depth-first with colours: a grey node met again closes a cycle.
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in entries[name].dependencies:
            if state.get(dep) == 1:
                cycle = " -> ".join(path[path.index(dep):] + [dep]) if dep in path else dep
                raise CatalogError(origin, name, "dependencies", f"cycle: {cycle}")
            if dep not in state:
                visit(dep, path + [dep])
        state[name] = 2

    for name in entries:
        if name not in state:
            visit(name, [name])


def _string_list(value: Any, where: str, fail) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        fail(where, f"must be an array of non-empty strings, got {value!r}")
    return list(value)


def _is_int(value: Any) -> bool:
    # bool is an int subclass; `size = true` must not pass as 1.
    return isinstance(value, int) and not isinstance(value, bool)
