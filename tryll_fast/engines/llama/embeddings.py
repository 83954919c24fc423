"""Pooled sentence embeddings from a GGUF model, for retrieval.

`Embedder` owns a dedicated llama.cpp context with `embeddings=True`; it never shares the
chat scheduler's context (an embedding decode would otherwise have to be interleaved with
generation steps). Several texts go into one `llama_decode`, one sequence id each;
llama.cpp pools per sequence and the vectors come back L2-normalised as float32 numpy
arrays.

Two kinds of model: a sentence encoder (all-MiniLM-L6-v2, a BERT GGUF written at fetch by
bert_gguf.py) pools the way its GGUF declares (mean), and is the retrieval model; a chat
model has no pooling of its own and is mean-pooled here, which gives coarse embeddings
(docs/models.md): good enough to rank related above unrelated text, not for retrieval.
"""
from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, Sequence

import numpy as np

from tryll_fast.engines.errors import EngineError
from tryll_fast.engines.llama import cpu_share, devices
from tryll_fast.engines.llama.bert_gguf import gguf_path_for
from tryll_fast.engines.llama.backend import init_backend

__all__ = ["Embedder", "EmbeddingError"]

class EmbeddingError(EngineError, RuntimeError):
    """The embedding model or context failed (a 4001 under a request, like every engine
    error)."""


class Embedder:
    """Pooled, L2-normalised embeddings through a dedicated llama.cpp context.

    `model` is a path to a GGUF file (loaded and freed by this object), the
    model.safetensors of a BERT entry (its GGUF beside it, written at fetch), or an
    already loaded model: a `llama_model` pointer or an object with a `.handle` property
    (`LlamaModel`); a borrowed model is not freed by `close()` and must outlive it.
    `n_batch` is the token budget of one `llama_decode` (and its micro-batch),
    `n_seq_max` the texts per decode; a text is truncated to `max_tokens` (<= n_batch),
    keeping a sentence encoder's closing [SEP].
    With a chat model the compute buffer grows with n_batch times the vocabulary,
    because llama.cpp still runs the LM head on every token (Gemma 3, 262k tokens: ~1 MiB
    per token of n_batch; SmolLM2: ~0.2 MiB); an encoder has no LM head.
    """

    def __init__(self, model: Any, *, n_batch: int = 256, n_seq_max: int = 16,
                 max_tokens: int = 256, n_threads: int = 2,
                 normalize: bool = True) -> None:
        import llama_cpp.llama_cpp as C

        self._C = C
        self._lock = threading.Lock()
        init_backend()
        self._owns_model = False
        if isinstance(model, (str, os.PathLike)):
            path = os.fspath(model)
            if path.endswith(".safetensors"):
                path = os.fspath(gguf_path_for(path))
                if not os.path.isfile(path):
                    raise EmbeddingError(f"{path} is missing: the model was not prepared at "
                                         "fetch (fetch it again: tryll-fast models fetch)")
            if not os.path.isfile(path):
                raise EmbeddingError(f"model file not found: {path!r}")
            mparams = C.llama_model_default_params()
            # host memory in every build: a GPU build's default would offload every layer
            listed = devices.apply(mparams, devices.HOST)
            handle = C.llama_model_load_from_file(path.encode(), mparams)
            del listed
            if not handle:
                raise EmbeddingError(f"llama.cpp could not load {path!r}")
            self._owns_model = True
        else:
            handle = getattr(model, "handle", model)
        self._model = handle
        self._vocab = C.llama_model_get_vocab(handle)
        self.dim = int(C.llama_model_n_embd(handle))
        self.n_batch = int(n_batch)
        # More sequences than batch tokens makes llama.cpp abort the process (its output
        # buffer holds n_batch rows), and a sequence needs a token anyway.
        self.n_seq_max = max(1, min(int(n_seq_max), self.n_batch))
        self.max_tokens = min(int(max_tokens), self.n_batch)
        self.normalize = normalize
        self._add_special = True  # BOS where the vocabulary asks for one, [CLS]/[SEP] in BERT
        # A WordPiece text ends with [SEP]; a truncated one keeps it, as the encoder saw
        # every text in training.
        self._keep_last = C.llama_vocab_type(self._vocab) == C.LLAMA_VOCAB_TYPE_WPM
        self.pooling = _declared_pooling(C, handle)
        if self.pooling == "rank":
            self._free_model()
            raise EmbeddingError("the model is a reranker (rank pooling), not an embedder")

        cp = C.llama_context_default_params()
        devices.keep_on_host(cp)
        cp.n_ctx = self.n_batch
        cp.n_batch = self.n_batch
        # One decode = one micro-batch: with llama-cpp-python 0.3.36, a decode that
        # llama.cpp splits into several micro-batches returns wrong pooled vectors
        # (cosine 0.7 to the same text embedded alone), so never let it split.
        cp.n_ubatch = self.n_batch
        cp.n_seq_max = self.n_seq_max
        cp.n_threads = n_threads
        cp.n_threads_batch = n_threads
        cp.embeddings = True
        # The model's own pooling when its GGUF declares one (a sentence encoder was trained
        # with it); a chat model declares none and is mean-pooled.
        cp.pooling_type = (C.LLAMA_POOLING_TYPE_UNSPECIFIED if self.pooling is not None
                           else C.LLAMA_POOLING_TYPE_MEAN)
        cp.kv_unified = True  # texts share the n_ctx cells instead of n_ctx/n_seq_max each
        ctx = C.llama_init_from_model(handle, cp)
        if not ctx:
            self._free_model()
            raise EmbeddingError("llama.cpp could not create an embedding context")
        self._ctx = ctx
        self.n_threads = n_threads
        self._threads_now = [n_threads, n_threads]
        # n_ubatch == n_batch: every decode is one micro-batch, so a stopped one is rerun
        self._abort = cpu_share.abort_flag(C, ctx)
        self._batch = C.llama_batch_init(self.n_batch, 0, self.n_seq_max)
        self._tok_buf = (C.llama_token * (self.max_tokens + 8))()

    # ---- queries

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` as embedded (truncated to max_tokens)."""
        data = text.encode("utf-8")
        C = self._C
        n = C.llama_tokenize(self._vocab, data, len(data), self._tok_buf,
                             len(self._tok_buf), self._add_special, False)
        if n < 0:  # longer than the buffer: tokenize fully, then truncate
            buf = (C.llama_token * (-n))()
            n = C.llama_tokenize(self._vocab, data, len(data), buf, -n,
                                 self._add_special, False)
            return self._truncate(list(buf[:n]))
        return self._truncate(list(self._tok_buf[:n]))

    def _truncate(self, toks: list[int]) -> list[int]:
        if len(toks) <= self.max_tokens:
            return toks
        if self._keep_last:
            return toks[:self.max_tokens - 1] + toks[-1:]
        return toks[:self.max_tokens]

    # ---- embedding

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """A (len(texts), dim) float32 array, one pooled vector per text."""
        if isinstance(texts, str):
            raise TypeError("embed() takes a sequence of strings; use embed_one()")
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        with self._lock:
            if self._ctx is None:
                raise EmbeddingError("Embedder is closed")
            toks = [self.tokenize(t) for t in texts]
            group: list[int] = []
            used = 0
            for i, t in enumerate(toks):
                if not t:
                    raise EmbeddingError(f"text {i} has no tokens")
                if group and (used + len(t) > self.n_batch or len(group) >= self.n_seq_max):
                    self._decode_group(group, toks, out)
                    group, used = [], 0
                group.append(i)
                used += len(t)
            if group:
                self._decode_group(group, toks, out)
        if self.normalize:
            norms = np.linalg.norm(out, axis=1, keepdims=True)
            out /= np.maximum(norms, 1e-12)
        return out

    def embed_one(self, text: str) -> np.ndarray:
        return self.embed([text])[0]

    def _decode_group(self, group: list[int], toks: list[list[int]], out: np.ndarray) -> None:
        C = self._C
        b = self._batch
        k = 0
        for seq, i in enumerate(group):
            for pos, tok in enumerate(toks[i]):
                b.token[k] = tok
                b.pos[k] = pos
                b.n_seq_id[k] = 1
                b.seq_id[k][0] = seq
                b.logits[k] = 1  # embedding mode wants every token as an output
                k += 1
        b.n_tokens = k
        C.llama_memory_clear(C.llama_get_memory(self._ctx), True)
        # on a compute thread (compute.py), as the machine's load leaves it (cpu_share.py)
        rc = cpu_share.decode(C, self._ctx, b, (self.n_threads, self.n_threads),
                              self._threads_now, self._abort)
        if rc != 0:
            raise EmbeddingError(f"llama_decode failed ({rc}) on {len(group)} texts")
        for seq, i in enumerate(group):
            ptr = C.llama_get_embeddings_seq(self._ctx, seq)
            if not ptr:
                raise EmbeddingError("llama.cpp returned no pooled embedding")
            out[i] = np.ctypeslib.as_array(ptr, shape=(self.dim,))

    # ---- lifetime

    def _free_model(self) -> None:
        if self._owns_model and self._model:
            self._C.llama_model_free(self._model)
        self._model = None

    def close(self) -> None:
        with self._lock:
            if self._ctx is None:
                return
            self._C.llama_batch_free(self._batch)
            self._C.llama_free(self._ctx)
            self._ctx = None
            self._free_model()

    def __enter__(self) -> Embedder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


_POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def _declared_pooling(C, model) -> str | None:
    """The pooling the GGUF declares (`<arch>.pooling_type`), None when it declares none."""
    def meta(key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = C.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
        return buf.value.decode() if n >= 0 else None

    arch = meta("general.architecture")
    value = meta(f"{arch}.pooling_type") if arch else None
    if value is None or not value.strip().isdigit():
        return None
    name = _POOLING_NAMES.get(int(value))
    return None if name in (None, "none") else name
