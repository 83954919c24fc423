"""Per-request sampling parameters and the llama_sampler chain built from them.

Chain order: penalties -> grammar -> top_k -> top_p -> min_p -> temperature -> dist
(or greedy when temperature <= 0). The grammar comes before any truncation so
top-k/top-p choose among allowed tokens only; a token the grammar forbids is
never sampled, which matters because llama.cpp throws (and so aborts) if a
grammar is made to accept one.
"""
import ctypes
import math
from dataclasses import dataclass, field

import llama_cpp.llama_cpp as C

from tryll_fast.engines.llama.errors import EngineClosed, InvalidRequest
from tryll_fast.engines.llama.model import LlamaModel

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed per chain


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
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    grammar: str | None = None  # GBNF text with a `root` rule
    # Lazy grammar: free text until one of these regexes (std::regex, full match of the
    # text so far) matches; the grammar then applies from the pattern's first capture group.
    grammar_triggers: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False    # ban end-of-generation tokens: exactly max_tokens

    def __post_init__(self):
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "grammar_triggers", tuple(self.grammar_triggers))

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
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 2**32):
            bad("seed", self.seed, "must be an int in [0, 2**32)")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                bad("stop", s, "stop strings must be non-empty str")
        if not isinstance(self.ignore_eos, bool):
            bad("ignore_eos", self.ignore_eos, "must be a bool")
        g = self.grammar
        if g is not None and (not isinstance(g, str) or not g.strip()):
            bad("grammar", self.grammar, "must be non-empty GBNF text")
        if self.grammar_triggers and g is None:
            bad("grammar_triggers", self.grammar_triggers, "need a grammar")
        for t in self.grammar_triggers:
            if not isinstance(t, str) or not t:
                bad("grammar_triggers", t, "trigger patterns must be non-empty str")

    @property
    def uses_penalties(self) -> bool:
        return (self.penalty_last_n > 0 and (self.repeat_penalty != 1.0
                or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0))


class SamplerChain:
    """An owned llama_sampler chain; free() (or the scheduler) releases it."""

    def __init__(self, model: LlamaModel, params: SamplingParams):
        params.validate()
        vocab = model.vocab_handle
        cp = C.llama_sampler_chain_default_params()
        cp.no_perf = True
        chain = C.llama_sampler_chain_init(cp)
        if not chain:
            raise InvalidRequest("llama.cpp could not create a sampler chain")
        self._chain = chain
        self._penalties = None
        try:
            if params.ignore_eos:
                eog = model.eog_tokens
                biases = (C.llama_logit_bias * len(eog))(
                    *[C.llama_logit_bias(t, float("-inf")) for t in eog])
                self._add(C.llama_sampler_init_logit_bias(model.n_vocab, len(eog), biases))
            if params.uses_penalties:
                self._penalties = self._add(C.llama_sampler_init_penalties(
                    model.n_vocab, params.penalty_last_n, params.repeat_penalty,
                    params.frequency_penalty, params.presence_penalty))
            if params.grammar is not None and params.grammar_triggers:
                pats = [t.encode() for t in params.grammar_triggers]
                arr = (ctypes.c_char_p * len(pats))(*pats)
                g = C.llama_sampler_init_grammar_lazy_patterns(
                    vocab, params.grammar.encode(), b"root", arr, len(pats), None, 0)
                if not g:
                    raise InvalidRequest(
                        "lazy grammar does not parse (GBNF with a `root` rule and std::regex "
                        "trigger patterns expected)")
                self._add(g)
            elif params.grammar is not None:
                g = C.llama_sampler_init_grammar(vocab, params.grammar.encode(), b"root")
                if not g:
                    raise InvalidRequest(
                        "grammar does not parse (GBNF with a `root` rule expected)")
                self._add(g)
            if params.temperature <= 0:
                self._add(C.llama_sampler_init_greedy())
            else:
                if params.top_k > 0:
                    self._add(C.llama_sampler_init_top_k(params.top_k))
                if params.top_p < 1.0:
                    self._add(C.llama_sampler_init_top_p(params.top_p, 1))
                if params.min_p > 0.0:
                    self._add(C.llama_sampler_init_min_p(params.min_p, 1))
                self._add(C.llama_sampler_init_temp(params.temperature))
                seed = DEFAULT_SEED if params.seed is None else params.seed
                self._add(C.llama_sampler_init_dist(seed))
        except BaseException:
            self.free()
            raise

    def _add(self, sampler):
        if not sampler:
            raise InvalidRequest("llama.cpp could not create a sampler")
        # the chain takes ownership: freeing the chain frees every element
        C.llama_sampler_chain_add(self._chain, sampler)
        return sampler

    @property
    def handle(self):
        if self._chain is None:
            raise EngineClosed("sampler chain used after free()")
        return self._chain

    def accept_history(self, tokens) -> None:
        """Feed prompt tokens to the penalties only (never to the grammar)."""
        if self._penalties is not None:
            for t in tokens:
                C.llama_sampler_accept(self._penalties, t)

    def free(self) -> None:
        if self._chain is not None:
            C.llama_sampler_free(self._chain)
            self._chain = None
