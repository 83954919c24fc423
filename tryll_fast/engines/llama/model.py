"""A GGUF model loaded with llama.cpp's low-level API: weights, vocabulary, tokenizer.

The model is read-only once loaded, so tokenize/detokenize may run on any
thread; a lock only orders them against close(), which frees the weights.
"""
import ctypes
import os
import threading
import weakref
from typing import Any

import llama_cpp.llama_cpp as C

from tryll_fast.engines.errors import EngineClosed, InvalidRequest, ModelLoadError
from tryll_fast.engines.llama import devices
from tryll_fast.engines.llama.backend import init_backend
from tryll_fast.engines.llama.lora_gguf import check_lora_file

# Where a DRY match stops: a repeated sequence across a new line, a colon, a quote or an
# asterisk is not a loop (the defaults of the sampler's authors).
DRY_BREAKERS = (b"\n", b":", b"\"", b"*")


def token_to_piece_address() -> int:
    """C address of llama_token_to_piece, for the Cython detokenizer to call directly."""
    return ctypes.cast(C.llama_token_to_piece, ctypes.c_void_p).value


class LlamaModel:
    """One GGUF file in memory. Use as a context manager or call close()."""

    def __init__(self, path, *, placement: str | None = None, n_gpu_layers: int | None = None,
                 use_mmap: bool = True):
        """placement: "ram", "vram" or "auto" (engines/llama/devices.py; None: the
        TRYLL_LLAMA_PLACEMENT environment variable, else "ram"); n_gpu_layers limits how
        many layers a device placement offloads (None or -1: all)."""
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise ModelLoadError(f"model file not found: {path!r}")
        if placement is None:
            placement = os.environ.get("TRYLL_LLAMA_PLACEMENT") or "ram"
        if placement not in devices.PLACEMENTS:
            raise InvalidRequest(f"placement {placement!r} is not one of "
                                 f"{', '.join(devices.PLACEMENTS)}")
        if n_gpu_layers is not None and n_gpu_layers < -1:
            raise InvalidRequest(f"n_gpu_layers={n_gpu_layers} is below -1 (-1 = all)")
        init_backend()
        where = devices.choose(placement, os.path.getsize(path), n_gpu_layers)
        params = C.llama_model_default_params()
        listed = devices.apply(params, where)
        params.use_mmap = use_mmap
        model = C.llama_model_load_from_file(path.encode(), params)
        del listed
        if not model:
            raise ModelLoadError(f"llama.cpp could not load {path!r}")
        self.placement = where
        self.path = path
        self._model = model
        self._vocab = C.llama_model_get_vocab(model)
        self._lock = threading.Lock()
        self._contexts = weakref.WeakSet()  # open contexts: freeing the weights under them crashes
        self._adapters: dict[str, LoraAdapter] = {}     # real path -> the loaded adapter
        # DRY samplers by their settings, cloned per request (dry_sampler)
        self._dry: dict[tuple, Any] = {}
        self.n_vocab = C.llama_vocab_n_tokens(self._vocab)
        self.n_ctx_train = C.llama_model_n_ctx_train(model)
        self.n_layer = C.llama_model_n_layer(model)
        self.n_embd = C.llama_model_n_embd(model)
        self.n_head = C.llama_model_n_head(model)
        self.n_head_kv = C.llama_model_n_head_kv(model)
        self.weights_bytes = C.llama_model_size(model)
        self.n_params = C.llama_model_n_params(model)
        self.bos = C.llama_vocab_bos(self._vocab)
        self.eos = C.llama_vocab_eos(self._vocab)
        self.add_bos = bool(C.llama_vocab_get_add_bos(self._vocab))
        self.architecture = self.meta("general.architecture") or ""
        self.kv_bytes_per_cell = self._kv_bytes_per_cell()
        # the device's share: weights by llama.cpp's layer split, KV by layers offloaded
        if where.device is None:
            self.device_weights_bytes = 0
            self.device_layer_share = 0.0
        else:
            self.device_weights_bytes = devices.device_weight_bytes(
                path, self.n_layer, where.n_gpu_layers)
            on = devices.device_layers(self.n_layer, where.n_gpu_layers)
            self.device_layer_share = len([i for i in on if i < self.n_layer]) / self.n_layer

    # -- raw handles, for the context and samplers of this package only --------------------

    @property
    def handle(self):
        if self._model is None:
            raise EngineClosed(f"model {self.path!r} is closed")
        return self._model

    @property
    def vocab_handle(self):
        if self._model is None:
            raise EngineClosed(f"model {self.path!r} is closed")
        return self._vocab

    @property
    def closed(self) -> bool:
        return self._model is None

    @property
    def device_name(self) -> str:
        """The GPU holding some of the layers ("Vulkan0"); "" in host memory."""
        return self.placement.device.name if self.placement.device is not None else ""

    # -- metadata -------------------------------------------------------------------------

    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as text (None if absent), however long it is."""
        size = 4096
        while True:
            buf = ctypes.create_string_buffer(size)
            n = C.llama_model_meta_val_str(self.handle, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", "replace")
            size = n + 1

    def chat_metadata(self) -> dict:
        """What a chat formatter needs (prompting.chat.ChatFormatter.from_metadata): the
        template, the architecture and name, and the BOS/EOS text from the vocabulary."""
        meta: dict = {}
        for key in ("tokenizer.chat_template", "general.architecture", "general.name"):
            v = self.meta(key)
            if v is not None:
                meta[key] = v
        vocab = self.vocab_handle
        for key, fn in (("tokenizer.ggml.bos_token", C.llama_vocab_bos),
                        ("tokenizer.ggml.eos_token", C.llama_vocab_eos)):
            tok = fn(vocab)
            if tok >= 0:
                meta[key] = (C.llama_vocab_get_text(vocab, tok) or b"").decode("utf-8", "replace")
        meta["tokenizer.ggml.add_bos_token"] = bool(C.llama_vocab_get_add_bos(vocab))
        return meta

    def _kv_bytes_per_cell(self) -> int:
        # One KV cell stores K and V for every layer, F16 by default. Models
        # such as Gemma 3 declare head sizes that differ from n_embd / n_head.
        head = self.n_embd // max(1, self.n_head)
        k = int(self.meta(f"{self.architecture}.attention.key_length") or head)
        v = int(self.meta(f"{self.architecture}.attention.value_length") or head)
        return self.n_layer * self.n_head_kv * (k + v) * 2

    def placement_info(self) -> dict:
        """Where the weights went: placement "ram"/"vram", the device, how many of the
        weights' bytes and what share of the layers (and so of each KV cell) it holds, and
        why a hint was not honoured (note)."""
        return {"placement": self.placement.name, "device": self.device_name,
                "device_weights_bytes": self.device_weights_bytes,
                "device_layer_share": self.device_layer_share, "note": self.placement.note,
                "device_total_bytes": (self.placement.device.total_bytes
                                       if self.placement.device is not None else 0)}

    # -- text <-> tokens ------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        """Token ids of `text`. add_special adds BOS when the model wants one;
        parse_special turns "<|im_start|>" and friends into their control tokens."""
        if not isinstance(text, str):
            raise InvalidRequest(f"tokenize expects str, got {type(text).__name__}")
        raw = text.encode("utf-8")
        cap = len(raw) + 8
        with self._lock:
            vocab = self.vocab_handle
            while True:
                out = (C.llama_token * cap)()
                n = C.llama_tokenize(vocab, raw, len(raw), out, cap, add_special, parse_special)
                if n >= 0:
                    return list(out[:n])
                cap = -n

    def token_to_piece(self, token: int, *, special: bool = False) -> bytes:
        self.check_tokens((token,))
        buf = ctypes.create_string_buffer(64)
        with self._lock:
            vocab = self.vocab_handle
            n = C.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = C.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens, *, special: bool = False) -> str:
        """Whole-sequence detokenization (not for streaming: see TextStream)."""
        tokens = list(tokens)
        self.check_tokens(tokens)
        if not tokens:
            return ""
        arr = (C.llama_token * len(tokens))(*tokens)
        cap = len(tokens) * 8 + 16
        with self._lock:
            vocab = self.vocab_handle
            while True:
                buf = ctypes.create_string_buffer(cap)
                n = C.llama_detokenize(vocab, arr, len(tokens), buf, cap, False, special)
                if n >= 0:
                    return buf.raw[:n].decode("utf-8", "replace")
                cap = -n

    def is_eog(self, token: int) -> bool:
        return bool(C.llama_vocab_is_eog(self.vocab_handle, token))

    @property
    def eog_tokens(self) -> tuple[int, ...]:
        """Every end-of-generation token (EOS, EOT, <end_of_turn>...). llama.cpp
        exposes only a per-token test, so the vocabulary is scanned once."""
        cached = getattr(self, "_eog_tokens", None)
        if cached is None:
            vocab = self.vocab_handle
            cached = tuple(t for t in range(self.n_vocab) if C.llama_vocab_is_eog(vocab, t))
            self._eog_tokens = cached
        return cached

    @property
    def special_tokens(self) -> dict[int, bytes]:
        """Control and user-defined tokens (what parse_special recognizes in text) by id,
        with their text. The tokenizer splits the text at each of them and tokenizes the
        pieces between on their own. The vocabulary is scanned once."""
        cached = getattr(self, "_special_tokens", None)
        if cached is None:
            vocab = self.vocab_handle
            mask = C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_USER_DEFINED
            cached, control, rstrip = {}, set(), set()
            for t in range(self.n_vocab):
                attr = C.llama_vocab_get_attr(vocab, t)
                if attr & mask:
                    text = C.llama_vocab_get_text(vocab, t)
                    if text:
                        cached[t] = bytes(text)
                        if attr & C.LLAMA_TOKEN_ATTR_CONTROL:
                            control.add(t)
                        if attr & C.LLAMA_TOKEN_ATTR_RSTRIP:
                            rstrip.add(t)
            self._special_tokens = cached
            self._control_tokens = frozenset(control)
            self._rstrip_tokens = frozenset(rstrip)
        return cached

    @property
    def control_tokens(self) -> frozenset[int]:
        """The control tokens among special_tokens (roles, BOS/EOS, turn markers): the ones
        a player must not be able to type into a prompt."""
        _ = self.special_tokens
        return self._control_tokens

    @property
    def rstrip_tokens(self) -> frozenset[int]:
        """The special tokens that swallow the whitespace after them when text is tokenized
        (the text that follows one is not tokenized as if it stood alone)."""
        _ = self.special_tokens
        return self._rstrip_tokens

    def check_tokens(self, tokens) -> None:
        """Raise unless every id is in [0, n_vocab): llama_decode rejects others."""
        n = self.n_vocab
        for t in tokens:
            if not isinstance(t, int) or t < 0 or t >= n:
                raise InvalidRequest(f"token id {t!r} outside the vocabulary [0, {n})")

    # -- LoRA adapters --------------------------------------------------------------------

    def acquire_adapter(self, path) -> "LoraAdapter":
        """The LoRA adapter in GGUF file `path`, loaded once per model and shared: each call
        takes a reference (release_adapter gives it back; the last one frees it).
        ModelLoadError names the file and why it is not an adapter for this model."""
        real = os.path.realpath(os.fspath(path))
        with self._lock:
            adapter = self._adapters.get(real)
            if adapter is not None:
                adapter.refs += 1
                return adapter
        check_lora_file(real, self.architecture)     # llama.cpp would only log why
        with self._lock:
            handle = C.llama_adapter_lora_init(self.handle, real.encode())
            if not handle:
                raise ModelLoadError(
                    f"{os.path.basename(real)!r} is not a LoRA adapter for "
                    f"{os.path.basename(self.path)!r}: llama.cpp refused its tensors (names or "
                    "shapes that are not this model's)")
            adapter = self._adapters.get(real)
            if adapter is None:          # another thread may have loaded it meanwhile
                adapter = self._adapters[real] = LoraAdapter(real, handle)
            else:
                C.llama_adapter_lora_free(handle)
            adapter.refs += 1
            return adapter

    def release_adapter(self, adapter: "LoraAdapter") -> None:
        with self._lock:
            adapter.refs -= 1
            if adapter.refs <= 0 and self._adapters.get(adapter.path) is adapter:
                del self._adapters[adapter.path]
                if self._model is not None:
                    C.llama_adapter_lora_free(adapter.handle)
                adapter.handle = None

    @property
    def adapters(self) -> dict[str, int]:
        """Loaded adapters: real path -> references."""
        with self._lock:
            return {p: a.refs for p, a in self._adapters.items()}

    def adapter_info(self) -> list[dict]:
        """Loaded adapters: path, references, bytes (the file's size: its tensors are read
        into host memory whole)."""
        with self._lock:
            return [{"path": a.path, "refs": a.refs, "bytes": a.nbytes}
                    for a in self._adapters.values()]

    # -- samplers -------------------------------------------------------------------------

    def dry_sampler(self, multiplier: float, base: float, allowed_length: int, last_n: int):
        """A new DRY sampler (llama.cpp's llama_sampler_init_dry) with DRY_BREAKERS, for a
        request's chain to own. Building one scans the vocabulary for the breakers' tokens
        (about 35 ms for Qwen's 151k); that is done once per setting and cloned after
        (about 0.2 ms)."""
        key = (float(multiplier), float(base), int(allowed_length), int(last_n))
        with self._lock:
            if self._model is None:
                raise EngineClosed("model used after close()")
            proto = self._dry.get(key)
            if proto is None:
                arr = (ctypes.c_char_p * len(DRY_BREAKERS))(*DRY_BREAKERS)
                proto = C.llama_sampler_init_dry(self._vocab, *key, arr, len(DRY_BREAKERS))
                if not proto:
                    raise InvalidRequest("llama.cpp could not create a DRY sampler")
                self._dry[key] = proto
            return C.llama_sampler_clone(proto)

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Free the weights; refused while a context built on them is open."""
        open_ctx = [c for c in self._contexts if not c.closed]
        if open_ctx:
            raise InvalidRequest(
                f"model {os.path.basename(self.path)!r} still has {len(open_ctx)} open context(s);"
                " close them (or their engines) first")
        with self._lock:
            if self._model is not None:
                for adapter in self._adapters.values():    # freed with the model
                    adapter.handle = None
                self._adapters.clear()
                for proto in self._dry.values():
                    C.llama_sampler_free(proto)
                self._dry.clear()
                C.llama_model_free(self._model)
                self._model = None
                self._vocab = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        state = "closed" if self.closed else f"{self.n_params / 1e6:.0f}M params"
        return f"LlamaModel({os.path.basename(self.path)!r}, {state})"


class LoraAdapter:
    """A LoRA adapter loaded for one model (LlamaModel.acquire_adapter)."""
    __slots__ = ("path", "handle", "refs", "nbytes")

    def __init__(self, path: str, handle) -> None:
        self.path = path
        self.handle = handle
        self.refs = 0
        self.nbytes = os.path.getsize(path)

    def __repr__(self):
        return f"LoraAdapter({os.path.basename(self.path)!r}, refs={self.refs})"

