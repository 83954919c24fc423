"""The llama_sampler chain built from a request's SamplingParams (engines/roles.py).

Chain order: penalties -> DRY -> grammar -> top_k -> top_p -> min_p -> temperature -> dist
(or greedy when temperature <= 0). The grammar comes before any truncation so
top-k/top-p choose among allowed tokens only; a token the grammar forbids is
never sampled, which matters because llama.cpp throws (and so aborts) if a
grammar is made to accept one.
"""
import ctypes

import llama_cpp.llama_cpp as C

from tryll_fast.engines.errors import EngineClosed, InvalidRequest
from tryll_fast.engines.llama.model import LlamaModel
from tryll_fast.engines.roles import SamplingParams

DEFAULT_SEED = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a random seed per chain


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
        self._dry = None
        self._params = params
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
            if params.uses_dry:
                self._dry = self._add(model.dry_sampler(
                    params.dry_multiplier, params.dry_base, params.dry_allowed_length,
                    params.dry_last_n))
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

    def accept_history(self, prompt) -> None:
        """Feed the prompt's tail to the penalties and DRY, each its own window (never to
        the grammar)."""
        p = self._params
        if self._penalties is not None:
            for t in prompt[-p.penalty_last_n:]:
                C.llama_sampler_accept(self._penalties, t)
        if self._dry is not None:
            for t in prompt[-p.dry_last_n:]:
                C.llama_sampler_accept(self._dry, t)

    def free(self) -> None:
        if self._chain is not None:
            C.llama_sampler_free(self._chain)
            self._chain = None
