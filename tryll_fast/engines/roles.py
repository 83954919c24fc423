"""The engine roles: what the workflow and the handlers may ask of an engine, whichever
library runs it, and the engine-neutral values they ask with.

A catalog entry names its engine and its role (models/catalog.py); engines/registry.py maps
an engine name to the roles it implements and the loader that makes an instance. The
workflow depends on these interfaces only; llama.cpp (engines/llama) implements two of them,
LanguageModel and Embeddings; engines/speech implements TextToSpeech.
"""
from __future__ import annotations

import enum
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from tryll_fast.engines.errors import InvalidRequest


class Priority(enum.IntEnum):
    """Queue class, the order requests are admitted and, under throttle, stepped in:
    INTERACTIVE is text a player watches stream (protected last), BUFFERED an interactive
    agent's work nobody watches token by token (a reply spoken or sent whole, a tool call,
    a classification), BACKGROUND a Background agent's work or a summary (slowed first)."""
    INTERACTIVE = 0
    BUFFERED = 1
    BACKGROUND = 2


class FinishReason(str, enum.Enum):
    """Why a generation ended."""
    STOP = "stop"            # end-of-generation token, stop string, or grammar end
    LENGTH = "length"        # max_tokens (0 for a prefill) or the context end
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True)
class SamplingParams:
    """What a request asks of the sampler. temperature <= 0 means greedy."""
    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0            # 0 = off
    top_p: float = 1.0        # 1 = off
    min_p: float = 0.0        # 0 = off
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    # DRY ("don't repeat yourself"): a token that would extend a sequence already in the
    # last dry_last_n tokens (the prompt's tail and the reply) loses
    # multiplier * base ** (match - allowed_length) of its logit once the match is longer
    # than allowed_length tokens. 0 = off.
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_last_n: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    grammar: str | None = None  # GBNF text with a `root` rule
    # Lazy grammar: free text until one of these regexes (std::regex, full match of the
    # text so far) matches; the grammar then applies from the pattern's first capture group.
    grammar_triggers: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False    # ban end-of-generation tokens: exactly max_tokens
    # Scoring instead of generating: the request ends at its first sampling point, and
    # its handle's `scores` are the softmax of the next-token logits over these token ids
    # (in this order); nothing is sampled or emitted (the letter-choice classifiers).
    score_tokens: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self):
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "grammar_triggers", tuple(self.grammar_triggers))
        object.__setattr__(self, "score_tokens", tuple(self.score_tokens))

    def validate(self) -> None:
        def bad(name, value, rule):
            raise InvalidRequest(f"sampling {name}={value!r}: {rule}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 0:
            bad("max_tokens", self.max_tokens, "must be an int >= 0")
        for name in ("temperature", "top_p", "min_p", "repeat_penalty",
                     "presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                bad(name, v, "must be a finite number")
        if not 0.0 < self.top_p <= 1.0:
            bad("top_p", self.top_p, "must be in (0, 1]")
        if not 0.0 <= self.min_p <= 1.0:
            bad("min_p", self.min_p, "must be in [0, 1]")
        if self.repeat_penalty <= 0:
            bad("repeat_penalty", self.repeat_penalty, "must be > 0 (1 = off)")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            bad("top_k", self.top_k, "must be an int >= 0")
        if not isinstance(self.penalty_last_n, int) or self.penalty_last_n < 0:
            bad("penalty_last_n", self.penalty_last_n, "must be an int >= 0")
        if not isinstance(self.dry_multiplier, (int, float)) or not (
                math.isfinite(self.dry_multiplier) and self.dry_multiplier >= 0):
            bad("dry_multiplier", self.dry_multiplier, "must be a finite number >= 0 (0 = off)")
        if not isinstance(self.dry_base, (int, float)) or not (
                math.isfinite(self.dry_base) and self.dry_base > 1):
            bad("dry_base", self.dry_base, "must be a finite number > 1")
        if not isinstance(self.dry_allowed_length, int) or self.dry_allowed_length < 1:
            bad("dry_allowed_length", self.dry_allowed_length, "must be an int >= 1")
        if not isinstance(self.dry_last_n, int) or self.dry_last_n < 1:
            bad("dry_last_n", self.dry_last_n, "must be an int >= 1")
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 2**32):
            bad("seed", self.seed, "must be an int in [0, 2**32)")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                bad("stop", s, "stop strings must be non-empty str")
        if not isinstance(self.ignore_eos, bool):
            bad("ignore_eos", self.ignore_eos, "must be a bool")
        for t in self.score_tokens:
            if not isinstance(t, int) or t < 0:
                bad("score_tokens", t, "must be token ids (ints >= 0)")
        if self.score_tokens and len(set(self.score_tokens)) != len(self.score_tokens):
            bad("score_tokens", self.score_tokens, "must not repeat a token")
        g = self.grammar
        if g is not None and (not isinstance(g, str) or not g.strip()):
            bad("grammar", self.grammar, "must be non-empty GBNF text")
        if self.grammar_triggers and g is None:
            bad("grammar_triggers", self.grammar_triggers, "need a grammar")
        for t in self.grammar_triggers:
            if not isinstance(t, str) or not t:
                bad("grammar_triggers", t, "trigger patterns must be non-empty str")

    @property
    def uses_dry(self) -> bool:
        return self.dry_multiplier > 0

    @property
    def uses_penalties(self) -> bool:
        return (self.penalty_last_n > 0 and (self.repeat_penalty != 1.0
                or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0))


# KV cache element types a context may be asked for (ContextSpec.kv_type).
KV_CACHE_TYPES = ("f16", "bf16", "f32", "q8_0", "q4_0")
# ContextSpec.flash_attn values (llama.cpp's llama_flash_attn_type)
FLASH_ATTN = {"auto": -1, "off": 0, "on": 1}


@dataclass(frozen=True)
class ContextSpec:
    """The context a request runs on, besides the model: LoRA adapters and overrides. The
    default spec is the engine's own context. adapters: (real path, scale) pairs, scale != 0,
    sorted by path; kv_type None, n_batch / n_ubatch / n_threads 0 and flash_attn None mean
    the engine's settings. Hashable: equal specs share one context."""
    adapters: tuple[tuple[str, float], ...] = ()
    kv_type: str | None = None
    n_batch: int = 0
    n_ubatch: int = 0
    flash_attn: int | None = None
    n_threads: int = 0

    @classmethod
    def make(cls, adapters=(), *, kv_type: str | None = None, n_batch: int = 0,
             n_ubatch: int = 0, flash_attn: int | None = None,
             n_threads: int = 0) -> "ContextSpec":
        """A validated spec; adapters: (path, scale) pairs. A scale of 0 turns an adapter
        off (it is left out), so a set whose scales are all 0 is the engine's own context."""
        merged: dict[str, float] = {}
        for i, (path, scale) in enumerate(adapters):
            if isinstance(scale, bool) or not isinstance(scale, (int, float)) \
                    or not math.isfinite(scale):
                raise InvalidRequest(f"adapters[{i}].scale {scale!r} is not a finite number")
            real = os.path.realpath(os.fspath(path))
            if real in merged:
                raise InvalidRequest(f"adapters[{i}]: {os.path.basename(real)!r} is listed "
                                     "twice")
            merged[real] = float(scale)
        if kv_type is not None and kv_type not in KV_CACHE_TYPES:
            raise InvalidRequest(f"kv_type={kv_type!r} is not one of "
                                 f"{', '.join(KV_CACHE_TYPES)}")
        for name, value in (("n_batch", n_batch), ("n_ubatch", n_ubatch),
                            ("n_threads", n_threads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidRequest(f"{name}={value!r} must be an int >= 0 (0 = the engine's)")
        if flash_attn is not None and flash_attn not in FLASH_ATTN.values():
            raise InvalidRequest(f"flash_attn={flash_attn!r} is not one of -1 (auto), 0, 1")
        return cls(tuple(sorted((p, s) for p, s in merged.items() if s != 0.0)),
                   kv_type, n_batch, n_ubatch, flash_attn, n_threads)

    @property
    def is_base(self) -> bool:
        return self == BASE_CONTEXT

    def describe(self) -> str:
        """A short human name: 'base', or the adapters and overrides it differs by."""
        parts = [f"{os.path.basename(p)}@{s:g}" for p, s in self.adapters]
        for name in ("kv_type", "n_batch", "n_ubatch", "flash_attn", "n_threads"):
            value = getattr(self, name)
            if value not in (None, 0) or (name == "flash_attn" and value == 0):
                parts.append(f"{name}={value}")
        return " ".join(parts) or "base"


# The engine's own context: no adapters, no overrides.
BASE_CONTEXT = ContextSpec()


@runtime_checkable
class GenerationHandle(Protocol):
    """One submitted generation (LanguageModel.submit)."""
    text: str
    finish_reason: FinishReason | None
    error: BaseException | None
    stats: Any

    def cancel(self) -> None: ...
    def result(self, timeout: float | None = None) -> str: ...


@runtime_checkable
class LanguageModel(Protocol):
    """A loaded language model that decodes many conversations at once.

    Conversations are keyed by the caller (an agent's node); the engine keeps their KV
    between requests, shares `shared_prefix_len` leading tokens between conversations, and
    calls `on_text` with UTF-8-safe chunks and `on_finish` once, from its own thread."""

    @property
    def n_ctx(self) -> int: ...

    def tokenize(self, text: str, *, add_special: bool = True,
                 parse_special: bool = True) -> list[int]: ...
    def detokenize(self, tokens: Sequence[int]) -> str: ...
    def chat_formatter(self) -> Any: ...
    def submit(self, prompt, *, key=None, sampling: SamplingParams | None = None,
               shared_prefix_len: int = 0, priority: Priority = Priority.INTERACTIVE,
               on_text: Callable[[str], None] | None = None,
               on_finish: Callable[[Any], None] | None = None,
               gate: Any = None, lane: ContextSpec | None = None,
               **kw: Any) -> GenerationHandle: ...
    def prefill(self, key, prompt, *, shared_prefix_len: int = 0, **kw: Any) -> Any: ...
    # A context for a ContextSpec (adapters, overrides): taken before submitting with
    # lane=spec, given back when its user goes; raises EngineError naming what is wrong.
    def open_lane(self, spec: ContextSpec, timeout: float | None = 120) -> ContextSpec: ...
    def close_lane(self, spec: ContextSpec, timeout: float | None = 30) -> None: ...
    def evict(self, key, timeout: float | None = 30, tier: str | None = None) -> None: ...
    def release(self, key, timeout: float | None = 30) -> None: ...
    def conversation(self, key, prefix=None, timeout: float | None = 30) -> dict | None: ...
    def memory(self, timeout: float | None = 30) -> dict: ...
    def set_throttle(self, throttle: float) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class Embeddings(Protocol):
    """A loaded embedding model: L2-normalised float32 vectors, one per text."""

    def embed(self, texts: Sequence[str]) -> Any: ...
    def close(self) -> None: ...


@runtime_checkable
class TextToSpeech(Protocol):
    """A loaded speech synthesiser: sentences in, mono float samples at `sample_rate` and
    the viseme cues of the same run out (engines/speech).

    `submit` queues one sentence with the moment its audio is needed (time.monotonic());
    the engine serves the most urgent first and calls `on_done(request)` once from its
    own thread: request.state is done (request.result holds samples, cue_offsets,
    cue_visemes), cancelled or failed (request.error)."""

    @property
    def sample_rate(self) -> int: ...
    @property
    def num_speakers(self) -> int: ...

    def submit(self, text: str, *, length_scale: float = 1.0, speaker_id: int = 0,
               deadline: float | None = None, priority: Priority = Priority.INTERACTIVE,
               on_done: Callable[[Any], None] | None = None) -> Any: ...
    def set_throttle(self, throttle: float) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class SpeechToText(Protocol):
    """A loaded speech recogniser: a stream per utterance, fed 16 kHz mono float32."""

    def create_stream(self, **options: Any) -> Any: ...
    def close(self) -> None: ...


@runtime_checkable
class VoiceActivity(Protocol):
    """A loaded voice activity detector (rides its speech-to-text model)."""

    def is_speech(self, samples: Any) -> bool: ...
    def close(self) -> None: ...


# The catalog's role names -> the interface an engine of that role implements.
ROLE_INTERFACES: dict[str, type] = {
    "llm": LanguageModel, "embedding": Embeddings, "tts": TextToSpeech,
    "stt": SpeechToText, "vad": VoiceActivity,
}
