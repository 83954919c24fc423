"""One llama_context with every process-aborting misuse checked in Python first.

llama.cpp answers some mistakes with GGML_ASSERT (the whole server dies) and
others with a bare -1. This wrapper keeps a mirror of each sequence's next
position and refuses, with a named error, anything that would reach those
paths: batches over n_batch, seq ids outside [0, n_seq_max), positions that do
not continue the sequence, sampling an index that produced no logits, partial
copies without a unified KV cache, and any use after close().

Not thread-safe: the scheduler thread is its only user (its decodes run on the
compute thread, compute.py, while the scheduler thread waits).
"""
import ctypes

import llama_cpp.llama_cpp as C
import numpy as np

from tryll_fast.engines.errors import (
    DecodeError, EngineClosed, InvalidRequest, ModelLoadError,
)
from tryll_fast.engines.llama import cpu_share, devices
from tryll_fast.engines.llama.model import LlamaModel

LLAMA_MAX_SEQ = 256  # llama-cparams.h: contexts with more sequences are refused
# KV cache element types a context may use: name -> (ggml_type, bytes per element).
KV_TYPES = {"f16": (1, 2.0), "bf16": (30, 2.0), "f32": (0, 4.0),
            "q8_0": (8, 34 / 32), "q4_0": (2, 18 / 32)}

_I32P = ctypes.POINTER(ctypes.c_int32)


class LlamaContext:
    """A KV cache of n_ctx cells shared by n_seq_max sequences (kv_unified)."""

    def __init__(self, model: LlamaModel, *, n_ctx: int = 4096, n_seq_max: int = 8,
                 n_batch: int = 512, n_threads: int = 2, n_threads_batch: int = 2,
                 kv_unified: bool = True, flash_attn_type: int = -1,
                 n_ubatch: int | None = None, kv_type: str = "f16"):
        if kv_type not in KV_TYPES:
            raise InvalidRequest(f"kv_type={kv_type!r} is not one of {', '.join(KV_TYPES)}")
        if KV_TYPES[kv_type][1] < 2 and flash_attn_type == 0:
            # llama.cpp refuses it too, but only with a log line and a NULL context
            raise InvalidRequest(f"a {kv_type} KV cache needs flash attention, which is off")
        if n_ubatch is not None and not 1 <= n_ubatch <= n_batch:
            raise InvalidRequest(f"n_ubatch={n_ubatch} outside [1, n_batch={n_batch}]")
        if not 1 <= n_seq_max <= LLAMA_MAX_SEQ:
            raise InvalidRequest(f"n_seq_max={n_seq_max} outside [1, {LLAMA_MAX_SEQ}]")
        if n_batch < 1:
            raise InvalidRequest(f"n_batch={n_batch} must be >= 1")
        if n_ctx < 16:
            raise InvalidRequest(f"n_ctx={n_ctx} must be >= 16")
        if n_threads < 1 or n_threads_batch < 1:
            raise InvalidRequest(f"n_threads={n_threads}/{n_threads_batch} must be >= 1")
        self.model = model
        p = C.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = n_batch
        p.n_ubatch = n_batch if n_ubatch is None else n_ubatch
        p.type_k = p.type_v = KV_TYPES[kv_type][0]
        p.n_seq_max = n_seq_max
        p.n_threads = n_threads
        p.n_threads_batch = n_threads_batch
        p.kv_unified = kv_unified
        # Rolling a tail back past the sliding window is silently wrong
        # with a window-sized SWA cache; we roll back on every new turn.
        p.swa_full = True
        p.flash_attn_type = flash_attn_type
        p.no_perf = True
        if not model.device_name:
            devices.keep_on_host(p)
        ctx = C.llama_init_from_model(model.handle, p)
        if not ctx:
            raise ModelLoadError(
                f"llama.cpp refused a context (n_ctx={n_ctx}, n_seq_max={n_seq_max}, "
                f"kv_type={kv_type})")
        self._ctx = ctx
        model._contexts.add(self)
        self._mem = C.llama_get_memory(ctx)
        self.kv_unified = kv_unified
        # whether cached cells can move to other positions (RoPE re-applied by llama.cpp on
        # the next decode): what a context shift needs
        self.can_shift = bool(C.llama_memory_can_shift(self._mem))
        self.n_ctx = C.llama_n_ctx(ctx)
        # with a unified cache every sequence may use the whole context
        self.n_ctx_seq = C.llama_n_ctx_seq(ctx)
        self.n_batch = C.llama_n_batch(ctx)
        self.n_seq_max = C.llama_n_seq_max(ctx)
        self.kv_type = kv_type
        self.n_threads = n_threads
        self.n_threads_batch = n_threads_batch
        self.threads_now = [n_threads, n_threads_batch]    # what the next decode runs with
        self.flash_attn_type = flash_attn_type
        # the model's figure is for F16 elements; quantized types are per 32-element block
        self.kv_bytes_per_cell = round(model.kv_bytes_per_cell / 2 * KV_TYPES[kv_type][1])
        self.n_ubatch = C.llama_n_ubatch(ctx)
        # set to stop the running decode (cpu_share.py: one starved at low priority)
        self._abort = cpu_share.abort_flag(C, ctx)
        self.adapters: tuple = ()
        self._next_pos = [0] * self.n_seq_max
        self._outputs: frozenset[int] = frozenset()
        self._alloc_batch(self.n_batch)

    def _alloc_batch(self, n: int) -> None:
        # The batch arrays are numpy buffers we own (no llama_batch_init/free to
        # pair up); each token carries one seq id, stored in _seq and pointed to
        # by _seq_ptrs[i], so filling a batch is a few slice assignments.
        self._tok = np.zeros(n, np.int32)
        self._pos = np.zeros(n, np.int32)
        self._nseq = np.ones(n, np.int32)
        self._seq = np.zeros(n, np.int32)
        self._logits = np.zeros(n, np.int8)
        base = self._seq.ctypes.data
        self._seq_ptrs = (_I32P * n)(*[ctypes.cast(base + 4 * i, _I32P) for i in range(n)])
        self._batch = C.llama_batch(
            n_tokens=0,
            token=self._tok.ctypes.data_as(_I32P),
            embd=None,
            pos=self._pos.ctypes.data_as(_I32P),
            n_seq_id=self._nseq.ctypes.data_as(_I32P),
            seq_id=ctypes.cast(self._seq_ptrs, ctypes.POINTER(_I32P)),
            logits=self._logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8)),
        )

    # -- guards ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def _live(self):
        if self._ctx is None:
            raise EngineClosed("llama context used after close()")
        if self.model.closed:
            raise EngineClosed("llama context used after its model was closed")
        return self._ctx

    def check_seq(self, seq_id: int) -> None:
        if not isinstance(seq_id, int) or not 0 <= seq_id < self.n_seq_max:
            raise InvalidRequest(f"seq id {seq_id!r} outside [0, n_seq_max={self.n_seq_max})")

    def next_pos(self, seq_id: int) -> int:
        """Tokens held by the sequence = the position its next token must take."""
        self.check_seq(seq_id)
        return self._next_pos[seq_id]

    # -- decoding -------------------------------------------------------------------------

    def decode(self, entries) -> list[int]:
        """Decode [(seq_id, tokens, want_logits_for_last_token), ...] in ONE llama_decode.

        Positions continue each sequence. Returns, per entry, the batch index to
        sample from (or -1 when no logits were asked for).
        """
        total = sum(len(t) for _, t, _ in entries)
        if total == 0:
            raise InvalidRequest("empty batch: nothing to decode")
        if total > self.n_batch:
            raise InvalidRequest(f"batch of {total} tokens exceeds n_batch={self.n_batch}")
        planned = {}
        for seq_id, tokens, _ in entries:
            self.check_seq(seq_id)
            self.model.check_tokens(tokens)
            start = planned.get(seq_id, self._next_pos[seq_id])
            end = start + len(tokens)
            if end > self.n_ctx_seq:
                raise InvalidRequest(
                    f"seq {seq_id} would reach position {end} beyond n_ctx={self.n_ctx_seq}")
            planned[seq_id] = end
        ctx = self._live()
        out = []
        o = 0
        cursor = {s: self._next_pos[s] for s in planned}
        for seq_id, tokens, want in entries:
            n = len(tokens)
            if n == 0:
                out.append(-1)
                continue
            p = cursor[seq_id]
            self._tok[o:o + n] = tokens
            self._pos[o:o + n] = np.arange(p, p + n, dtype=np.int32)
            self._seq[o:o + n] = seq_id
            self._logits[o:o + n] = 0
            if want:
                self._logits[o + n - 1] = 1
            out.append(o + n - 1 if want else -1)
            cursor[seq_id] = p + n
            o += n
        self._batch.n_tokens = total
        self._outputs = frozenset()
        # on the process's compute thread (compute.py), with the threads and priority the
        # machine's load leaves it (cpu_share.py); ctypes releases the GIL
        rc = cpu_share.decode(C, ctx, self._batch, (self.n_threads, self.n_threads_batch),
                              self.threads_now,
                              self._abort if total <= self.n_ubatch else None)
        if rc != 0:
            self._resync(planned)
            raise DecodeError(f"llama_decode returned {rc} for {total} tokens"
                              + (" (no free KV cells)" if rc == 1 else ""))
        for s, end in planned.items():
            self._next_pos[s] = end
        self._outputs = frozenset(i for i in out if i >= 0)
        return out

    def decode_raw(self, tokens, positions, seq_ids, logits) -> list[int]:
        """Decode an explicit batch; refuses what llama.cpp would abort or reject on.

        A token asking for logits ends a run; returns decode()'s indices per run."""
        n = len(tokens)
        if not (n == len(positions) == len(seq_ids) == len(logits)):
            raise InvalidRequest("tokens, positions, seq_ids and logits differ in length")
        if n == 0:
            raise InvalidRequest("empty batch: nothing to decode")
        if n > self.n_batch:
            raise InvalidRequest(f"batch of {n} tokens exceeds n_batch={self.n_batch}")
        expect = {}
        for pos, s in zip(positions, seq_ids):
            self.check_seq(s)
            want = expect.get(s, self._next_pos[s])
            if pos != want:
                raise InvalidRequest(
                    f"seq {s}: position {pos} does not continue the sequence (expected {want})")
            expect[s] = pos + 1
        entries = []
        # regroup into runs so the checked path does the work
        for t, s, lg in zip(tokens, seq_ids, logits):
            if entries and entries[-1][0] == s and not entries[-1][2]:
                entries[-1][1].append(t)
                entries[-1][2] = bool(lg)
            else:
                entries.append([s, [t], bool(lg)])
        return self.decode([tuple(e) for e in entries])

    def _resync(self, planned) -> None:
        # After a failed decode llama.cpp restores (or partly keeps) the cells;
        # trust its positions, not our plan.
        for s in planned:
            self._next_pos[s] = C.llama_memory_seq_pos_max(self._mem, s) + 1

    def sample(self, chain, batch_index: int) -> int:
        """llama_sampler_sample on the logits of one output of the last decode."""
        ctx = self._live()
        if batch_index not in self._outputs:
            raise InvalidRequest(
                f"batch index {batch_index} produced no logits in the last decode")
        return cpu_share.sample(C, chain, ctx, batch_index)

    def softmax_over(self, batch_index: int, tokens) -> tuple[float, ...]:
        """The softmax of one output's logits restricted to `tokens` (read in place, only
        those entries), in their order."""
        ctx = self._live()
        if batch_index not in self._outputs:
            raise InvalidRequest(
                f"batch index {batch_index} produced no logits in the last decode")
        self.model.check_tokens(tokens)     # ptr[t] must stay inside the logits row
        ptr = C.llama_get_logits_ith(ctx, batch_index)
        z = np.fromiter((ptr[t] for t in tokens), np.float64, len(tokens))
        z = np.exp(z - z.max())
        return tuple(float(v) for v in z / z.sum())

    def logits(self, batch_index: int) -> np.ndarray:
        """A copy of one output's logits (valid only until the next decode)."""
        ctx = self._live()
        if batch_index not in self._outputs:
            raise InvalidRequest(
                f"batch index {batch_index} produced no logits in the last decode")
        ptr = C.llama_get_logits_ith(ctx, batch_index)
        return np.ctypeslib.as_array(ptr, shape=(self.model.n_vocab,)).copy()

    # -- KV memory ------------------------------------------------------------------------

    def seq_rm(self, seq_id: int, keep: int = 0) -> None:
        """Drop the sequence's tokens at positions >= keep (keep=0: the whole sequence)."""
        self.check_seq(seq_id)
        if keep < 0:
            raise InvalidRequest(f"keep={keep} must be >= 0")
        self._live()
        if keep >= self._next_pos[seq_id]:
            return
        if not C.llama_memory_seq_rm(self._mem, seq_id, keep, -1):
            raise DecodeError(f"llama.cpp could not remove positions >= {keep} of seq {seq_id}")
        # the logits of the last decode stay valid: other sequences still sample from them
        self._next_pos[seq_id] = keep

    def seq_cut(self, seq_id: int, start: int, end: int) -> bool:
        """Drop the sequence's positions [start, end) and move the later ones down by
        end - start (a context shift); False, changing nothing, when the cache cannot move
        cells. The cells moved must not be shared with another sequence: llama.cpp moves a
        cell for every sequence that holds it."""
        self.check_seq(seq_id)
        if not 0 <= start < end <= self._next_pos[seq_id]:
            raise InvalidRequest(f"seq_cut [{start}, {end}) of seq {seq_id}, which holds "
                                 f"{self._next_pos[seq_id]} tokens")
        self._live()
        if not self.can_shift:
            return False
        if not C.llama_memory_seq_rm(self._mem, seq_id, start, end):
            raise DecodeError(f"llama.cpp could not remove positions [{start}, {end}) of "
                              f"seq {seq_id}")
        C.llama_memory_seq_add(self._mem, seq_id, end, -1, start - end)
        self._next_pos[seq_id] -= end - start
        return True

    def seq_cp(self, src: int, dst: int, n: int) -> None:
        """Make dst (empty) hold src's first n tokens; shares the cells when kv_unified."""
        self.check_seq(src)
        self.check_seq(dst)
        if src == dst:
            raise InvalidRequest(f"seq_cp from seq {src} onto itself")
        if not 0 < n <= self._next_pos[src]:
            raise InvalidRequest(f"seq_cp of {n} tokens: seq {src} holds {self._next_pos[src]}")
        if self._next_pos[dst] != 0:
            raise InvalidRequest(f"seq_cp into seq {dst}, which is not empty")
        p0, p1 = 0, n
        if not self.kv_unified:
            # Separate streams copy whole buffers: llama_kv_cache::seq_cp
            # GGML_ASSERTs unless the range is "full", spelled (-1, -1).
            if n != self._next_pos[src]:
                raise InvalidRequest("a partial seq_cp needs kv_unified=True")
            p0, p1 = -1, -1
        self._live()
        C.llama_memory_seq_cp(self._mem, src, dst, p0, p1)
        self._next_pos[dst] = n

    def seq_pos_max(self, seq_id: int) -> int:
        """llama.cpp's own answer (-1 if empty); the tests check the mirror against it."""
        self.check_seq(seq_id)
        self._live()
        return C.llama_memory_seq_pos_max(self._mem, seq_id)

    def state_seq_get(self, seq_id: int) -> bytes:
        """Serialise one sequence's KV to host memory."""
        return bytes(self.state_seq_buffer(seq_id))

    def state_seq_buffer(self, seq_id: int):
        """Serialise one sequence's KV into a ctypes buffer (no copy into bytes: the file
        tier writes it out and drops it)."""
        self.check_seq(seq_id)
        ctx = self._live()
        size = C.llama_state_seq_get_size(ctx, seq_id)
        buf = (ctypes.c_uint8 * size)()
        got = C.llama_state_seq_get_data(ctx, buf, size, seq_id)
        if got == 0 and self._next_pos[seq_id] > 0:
            raise DecodeError(f"llama_state_seq_get_data failed for seq {seq_id}")
        if got != size:
            buf = (ctypes.c_uint8 * got).from_buffer_copy(memoryview(buf)[:got])
        return buf

    def state_seq_set(self, seq_id: int, data) -> int:
        """Load a saved sequence (bytes, or a ctypes c_uint8 array used in place) into an
        empty seq id; returns the tokens it holds."""
        self.check_seq(seq_id)
        if self._next_pos[seq_id] != 0:
            raise InvalidRequest(f"restore into seq {seq_id}, which is not empty")
        ctx = self._live()
        if isinstance(data, ctypes.Array):
            buf = data
        else:
            buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if C.llama_state_seq_set_data(ctx, buf, len(data), seq_id) == 0:
            C.llama_memory_seq_rm(self._mem, seq_id, -1, -1)
            raise DecodeError(f"llama_state_seq_set_data failed for seq {seq_id} (KV full?)")
        self._next_pos[seq_id] = C.llama_memory_seq_pos_max(self._mem, seq_id) + 1
        self._outputs = frozenset()
        return self._next_pos[seq_id]

    def set_adapters(self, adapters) -> None:
        """Apply LoRA adapters, a sequence of (LoraAdapter, scale), to every later decode.
        Set once per context: llama.cpp re-plans its compute graph on every change."""
        ctx = self._live()
        n = len(adapters)
        handles = (C.llama_adapter_lora_p_ctypes * n)(*[a.handle for a, _ in adapters])
        scales = (ctypes.c_float * n)(*[s for _, s in adapters])
        if C.llama_set_adapters_lora(ctx, handles if n else None, n, scales if n else None):
            raise DecodeError("llama_set_adapters_lora failed")
        self.adapters = tuple(adapters)

    def clear(self) -> None:
        self._live()
        C.llama_memory_clear(self._mem, True)
        self._next_pos = [0] * self.n_seq_max
        self._outputs = frozenset()

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        if self._ctx is not None:
            C.llama_free(self._ctx)
            self._ctx = None
            self._mem = None
            self._outputs = frozenset()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
