"""The engines this build runs: for each catalog engine name, the roles it implements, the
loader that makes an instance for a catalog entry, and its backend warm-up.

The model manager loads every entry through `loaders()` (an entry whose engine is not here
is 6008 EngineNotAvailable); the server warms backends named by a session's engine hints
through `warm()`. An engine package registers itself by adding an `EngineSpec` to ENGINES;
nothing above the engines imports an engine package directly.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

# loader(entry, path, options) -> the loaded object; it must have close(), may have memory().
Loader = Callable[[Any, Path, Mapping[str, Any]], Any]

# llama-cpp's default cap on an entry's context_size (its KV cache: n_ctx cells shared by
# every sequence); engine_options["llama-cpp"]["max_n_ctx"] overrides it.
DEFAULT_MAX_N_CTX = 4096


@dataclass(frozen=True)
class EngineSpec:
    name: str                       # as the catalog spells it ("llama-cpp")
    roles: frozenset[str]           # catalog roles it implements (engines/roles.py)
    load: Loader
    warm: Callable[[], None]        # initialise the backend ahead of the first load
    # its loader takes options["placement"] ("ram" / "vram" / "auto", engines/llama/devices.py)
    placeable: bool = False


# prepare(main file, progress(fraction)) -> the file it wrote beside it. Run by the fetcher
# once an entry's files are verified (the catalog's `prepare` names one of PREPARE).
Preparer = Callable[[Path, Callable[[float], None]], Path]


def _load_llama(entry, path: Path, options: Mapping[str, Any]):
    opts = dict(options)
    cap = int(opts.pop("max_n_ctx", DEFAULT_MAX_N_CTX))
    if "adaptive_threads" in opts:     # process-wide: every decode goes through one thread
        from tryll_fast.engines.llama.cpu_share import set_adaptive
        set_adaptive(opts.pop("adaptive_threads"))
    if entry.role == "embedding":
        # embedding models are small and run between turns: host memory, always
        from tryll_fast.engines.llama.embeddings import Embedder
        return Embedder(str(path), **{k: v for k, v in opts.items() if k == "n_threads"})
    from tryll_fast.engines.llama.engine import LlamaEngine
    n_ctx = min(entry.context_size or cap, cap)
    return LlamaEngine(str(path), n_ctx=n_ctx, **opts)


def _warm_llama() -> None:
    from tryll_fast.engines.llama.backend import init_backend
    init_backend()


def _load_onnx_voice(entry, path: Path, options: Mapping[str, Any]):
    from tryll_fast.engines.speech.engine import SpeechEngine
    from tryll_fast.engines.speech.piper import PiperVoice
    opts = dict(options)
    voice = PiperVoice(path, n_threads=int(opts.pop("n_threads", 2)))
    return SpeechEngine(voice, **opts)


def _warm_onnx() -> None:
    import onnxruntime  # noqa: F401 - the import is the warm-up (about 0.2 s)
    from tryll_fast.engines.speech import espeak
    espeak.warm()


def _prepare_piper(main_file: Path, progress: Callable[[float], None]) -> Path:
    from tryll_fast.engines.speech.prepare import prepare_piper
    return prepare_piper(main_file, progress)


def _prepare_bert_gguf(main_file: Path, progress: Callable[[float], None]) -> Path:
    from tryll_fast.engines.llama.bert_gguf import prepare_bert_gguf
    return prepare_bert_gguf(main_file, progress)


def _load_whisper(entry, path: Path, options: Mapping[str, Any]):
    from tryll_fast.engines.speech.stt import WhisperEngine
    opts = dict(options)
    deps = opts.pop("dependencies", {})
    vad = next((obj for obj in deps.values() if hasattr(obj, "detector")), None)
    language = entry.languages[0].split("-")[0] if entry.languages else "en"
    return WhisperEngine(path, vad=vad, language=language, **opts)


def _warm_whisper() -> None:
    import faster_whisper  # noqa: F401 - the import is the warm-up (CTranslate2)


def _load_silero(entry, path: Path, options: Mapping[str, Any]):
    from tryll_fast.engines.speech.vad import SileroVad
    return SileroVad(path)


def _warm_sherpa() -> None:
    import sherpa_onnx  # noqa: F401


ENGINES: dict[str, EngineSpec] = {
    "llama-cpp": EngineSpec("llama-cpp", frozenset({"llm", "embedding"}), _load_llama,
                            _warm_llama, placeable=True),
    "onnxruntime": EngineSpec("onnxruntime", frozenset({"tts"}), _load_onnx_voice,
                              _warm_onnx),
    "faster-whisper": EngineSpec("faster-whisper", frozenset({"stt"}), _load_whisper,
                                 _warm_whisper),
    "sherpa-onnx": EngineSpec("sherpa-onnx", frozenset({"vad"}), _load_silero, _warm_sherpa),
}

PREPARE: dict[str, Preparer] = {
    "piper": _prepare_piper,
    "bert-gguf": _prepare_bert_gguf,
}


def placeable() -> frozenset[str]:
    """Engine names whose loaders honour a placement hint."""
    return frozenset(name for name, spec in ENGINES.items() if spec.placeable)


def loaders() -> dict[str, Loader]:
    """Engine name -> loader, for the model manager."""
    return {name: spec.load for name, spec in ENGINES.items()}


def preparer(name: str) -> Preparer:
    """The fetch-time preparation a catalog entry names (KeyError if this build has none)."""
    return PREPARE[name]


def warm(engine: str) -> bool:
    """Initialise `engine`'s backend now; False if this build does not run it."""
    spec = ENGINES.get(engine)
    if spec is None:
        return False
    spec.warm()
    return True
