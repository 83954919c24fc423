"""Continuous batching: every step is ONE llama_decode over all active sequences.

A step packs, within n_batch, one token for every sequence that is generating
(first, so streaming latency does not depend on others' prompts) and then
prompt chunks of sequences that are prefilling, in admission order. After the
decode each sequence that asked for logits samples from its own batch index
with its own sampler chain. Requests join (admit) and leave (finish) between
steps; requests beyond the free slots wait, Interactive before Buffered before
Background and FIFO within a class.

Under throttle > 0 a step holds only the most urgent class among the active
sequences: Buffered and Background sequences are left out while an Interactive
one is active, Background ones while a Buffered one is (they are served last);
the engine sleeps between steps. Throttle never changes what a sequence samples
from a given batch. Whatever the throttle, a Background prompt is not decoded
while an Interactive or Buffered request waits for its first token (a summary being prepared must not delay the
reply a player waits for), and its chunks are capped by prefill_while_decoding,
so an Interactive request arriving meanwhile waits for a short step at most.

A request whose prompt leaves out a stretch of its conversation's tokens (the dialog's
oldest turns left the window) keeps the rest of its KV: the stretch's cells are removed
and the later ones moved down (a context shift, when the cache can move cells and
`context_shift` is on), so only what is new is decoded. The moved cells were computed
with the dropped turns before them, as llama.cpp's own server does on a shift; with
context_shift off the prompt is decoded again from the cut.

This object is owned by the engine's scheduler thread; nothing here locks.
"""
import collections
import itertools
import time
from array import array

from tryll_fast.engines.llama.context import LlamaContext
from tryll_fast.engines.llama.conversations import Conversation, SlotTable
from tryll_fast.engines.errors import DecodeError
from tryll_fast.engines.llama.prefix_cache import PrefixCache
from tryll_fast.engines.llama.request import RequestHandle
from tryll_fast.engines.llama.spill import SpillDir
from tryll_fast.engines.llama.sampling import SamplerChain
from tryll_fast.engines.roles import FinishReason, Priority, SamplingParams


def common_prefix_len(a, b) -> int:
    """How many leading items two sequences (token lists, their bytes) share: bisected
    slice compares, which run in C (a token-by-token loop cost ~0.1 ms on a 3 000-token
    dialog, every turn; this ~0.04 ms)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


# A context shift is worth it only when this many of the old tokens line up again.
CUT_MIN_KEEP = 16


def find_cut(old, new, start: int) -> tuple[int, int]:
    """Where `old` (a conversation's tokens) continues `new` (its next prompt) once the
    tokens old[start:end] are cut out, as when a dialog's oldest turns leave the window:
    (end, n) with old[end:end + n] == new[start:start + n], n the longest such run (at
    least CUT_MIN_KEEP tokens; the first end with it), or (0, 0) when there is none."""
    if len(old) - start <= CUT_MIN_KEEP or len(new) - start < CUT_MIN_KEEP:
        return 0, 0
    ob = array("i", old).tobytes()
    nb = array("i", new[start:]).tobytes()
    needle = nb[:4 * CUT_MIN_KEEP]
    best = (0, 0)
    at = ob.find(needle, 4 * (start + 1))
    while at >= 0:
        if at % 4 == 0:
            n = common_prefix_len(ob[at:], nb) // 4
            if n > best[1]:
                best = (at // 4, n)
        at = ob.find(needle, at + 1)
    return best


class Request:
    """Scheduler-side state of one request (the caller sees its RequestHandle)."""

    __slots__ = ("handle", "key", "anonymous", "prompt", "params", "chain", "stream",
                 "priority", "shared_prefix_len", "gate", "conv", "todo", "done", "next_token",
                 "register_at", "order", "finished", "t_admit", "t_prefilled", "t_first")

    def __init__(self, handle: RequestHandle, key, anonymous: bool, prompt: list[int],
                 params: SamplingParams, chain: SamplerChain, stream, shared_prefix_len: int,
                 gate=None):
        self.handle = handle
        self.key = key
        self.anonymous = anonymous
        self.prompt = prompt
        self.params = params
        self.chain = chain
        self.stream = stream
        self.priority = handle.priority
        self.shared_prefix_len = shared_prefix_len
        self.gate = gate                # .paused -> sample nothing new this step
        self.conv: Conversation | None = None
        self.todo: list[int] = []       # prompt suffix this request must decode
        self.done = 0                   # of todo
        self.next_token: int | None = None  # sampled, to be decoded next step
        self.register_at = 0            # share prompt[:register_at] once decoded
        self.order = 0
        self.finished = False
        self.t_admit = self.t_prefilled = self.t_first = 0.0

    @property
    def generates(self) -> bool:
        return self.params.max_tokens > 0


class Scheduler:
    def __init__(self, ctx: LlamaContext, n_slots: int, prefix_cell_budget: int,
                 spill: SpillDir | None = None, evict_to: str = "file"):
        self.ctx = ctx
        self.model = ctx.model
        # A set test per sampled token instead of a ctypes call (which would also drop and
        # retake the GIL between sampling and handing the text to its consumer).
        self._eog = frozenset(self.model.eog_tokens)
        conv_ids = list(range(n_slots))
        cache_ids = list(range(n_slots, ctx.n_seq_max))
        self.cache = PrefixCache(ctx, cache_ids, prefix_cell_budget)
        self.slots = SlotTable(ctx, self.cache, conv_ids, spill, evict_to)
        self.waiting = {prio: collections.deque() for prio in Priority}
        self.running: list[Request] = []
        self.throttle = 0.0
        # prompt tokens a step may carry while sequences are generating (0 = n_batch)
        self.prefill_while_decoding = 0
        self.context_shift = True     # keep the KV after a cut in the prompt (module doc)
        self._order = itertools.count()
        self.steps = 0
        self.step_tokens = 0
        self.step_s = 0.0     # wall time of steps (plan, decode, sampling, delivery)
        self.decode_s = 0.0   # of which inside llama_decode
        self.throttle_pauses = 0  # steps followed by a throttle pause

    # -- queue ----------------------------------------------------------------------------

    def enqueue(self, req: Request) -> None:
        self.waiting[req.priority].append(req)

    def has_work(self) -> bool:
        return bool(self.running or any(self.waiting.values()))

    def sweep_cancelled(self) -> None:
        for r in self.running:
            if r.handle.cancelled:
                self._finish(r, FinishReason.CANCELLED)
        self._drop_finished()

    def admit(self) -> int:
        """Start queued requests while slots allow; returns how many started."""
        started = 0
        for prio in Priority:
            q = self.waiting[prio]
            for r in list(q):
                if r.handle.cancelled:
                    q.remove(r)
                    r.chain.free()
                    r.handle._finish(FinishReason.CANCELLED)
                    continue
                if self._prefix_in_flight(r):
                    continue  # attach it once the request prefilling it has shared it
                conv = self.slots.get_or_create(r.key, r.anonymous)
                if conv.busy:
                    continue  # one request per conversation at a time, in order
                was_saved = conv.stored is not None
                if not self.slots.acquire(conv):
                    continue
                q.remove(r)
                r.handle.stats.restored = was_saved and bool(conv.tokens)
                self._start(r, conv)
                started += 1
        self._drop_finished()
        return started

    def _prefix_in_flight(self, r: Request) -> bool:
        """Is another running request about to share the prefix this one declares?"""
        k = r.shared_prefix_len
        if k == 0 or self.cache.capacity == 0:
            return False
        head = r.prompt[:k]
        for other in self.running:
            if other.register_at >= k and other.prompt[:k] == head and other.conv.key != r.key:
                return True
        return False

    def _start(self, r: Request, conv: Conversation) -> None:
        now = time.perf_counter()
        conv.busy = True
        r.conv = conv
        r.order = next(self._order)
        r.t_admit = now
        st = r.handle.stats
        st.queue_wait_s = now - r.handle.t_submit
        st.admitted_order = r.order
        st.prompt_tokens = len(r.prompt)
        prompt = r.prompt
        # a generating request must decode at least its last prompt token to get logits
        limit = len(prompt) - 1 if r.generates else len(prompt)
        own = min(common_prefix_len(conv.tokens, prompt), limit)
        if self.context_shift and own < len(conv.tokens) and own >= conv.shared_len:
            end, n = find_cut(conv.tokens, prompt, own)
            if n and self.slots.cut(conv, own, end):
                st.shifted_tokens = end - own
                # llama.cpp rotates the moved keys at the next decode, and a sequence's
                # saved state does not carry a pending shift: decode at least one token
                own = min(own + n, len(prompt) - 1)
        shared, entry = self.cache.lookup(prompt) if self.cache.entries else (0, None)
        shared = min(shared, limit)
        if entry is not None and shared > own:
            self.slots.attach(conv, entry, shared, prompt)
            st.prefix_tokens = shared
        else:
            self.slots.truncate(conv, own)
            st.cached_tokens = own
        r.todo = prompt[len(conv.tokens):]
        k = r.shared_prefix_len
        if k > conv.shared_len and self.cache.lookup(prompt[:k])[0] < k:
            if len(conv.tokens) >= k:
                self.slots.share_as_prefix(conv, k)
            else:
                r.register_at = k
        if r.params.uses_penalties or r.params.uses_dry:
            r.chain.accept_history(prompt)
        self.running.append(r)
        if not r.todo:  # a prefill whose tokens are all cached already
            r.t_prefilled = now
            self._finish(r, FinishReason.LENGTH)

    # -- one step -------------------------------------------------------------------------

    def _plan(self):
        active = [r for r in self.running if not r.finished]
        if self.throttle > 0 and active:
            first = min(r.priority for r in active)
            active = [r for r in active if r.priority == first]
        budget = self.ctx.n_batch
        entries, plan = [], []
        for r in active:
            if r.next_token is not None and budget > 0:
                if r.gate is not None and r.gate.paused:
                    continue  # its consumer is not reading: produce nothing more for now
                entries.append((r.conv.seq_id, [r.next_token], True))
                plan.append((r, 0))
                budget -= 1
        if entries and self.prefill_while_decoding:
            # Streams are waiting for this step: a long prompt decoded alongside them
            # would stall every one of them for the whole chunk.
            budget = min(budget, self.prefill_while_decoding)
        interactive_prefill = any(r.next_token is None and r.priority < Priority.BACKGROUND
                                  for r in active)
        for r in active:
            if r.next_token is None and budget > 0:
                n = min(budget, len(r.todo) - r.done)
                if r.priority == Priority.BACKGROUND:
                    if interactive_prefill:
                        continue
                    if self.prefill_while_decoding:
                        n = min(n, self.prefill_while_decoding)
                chunk = r.todo[r.done:r.done + n]
                last = r.done + n == len(r.todo)
                entries.append((r.conv.seq_id, chunk, last and r.generates))
                plan.append((r, n))
                budget -= n
        return entries, plan

    def step(self) -> bool:
        """One llama_decode over every active sequence; False if there was nothing to do."""
        t_step = time.perf_counter()
        entries, plan = self._plan()
        if not entries:
            return False
        try:
            t_dec = time.perf_counter()
            idx = self.ctx.decode(entries)
            self.decode_s += time.perf_counter() - t_dec
        except DecodeError as e:
            if not self.make_room():
                # Nothing idle left to free: give up the newest, least urgent
                # request so the others fit on the next step.
                victim = max((r for r, _ in plan), key=lambda r: (r.priority, r.order))
                self._finish(victim, FinishReason.ERROR, f"KV cache full: {e}")
                self._drop_finished()
            return True  # retry with room next step
        self.steps += 1
        self.step_tokens += sum(len(t) for _, t, _ in entries)
        if self.slots.shifted:
            self.slots.shifted.clear()    # the decode rotated every moved key
        now = time.perf_counter()
        for (r, n), i in zip(plan, idx):
            conv = r.conv
            if n == 0:
                conv.tokens.append(r.next_token)
                r.next_token = None
            else:
                conv.tokens.extend(r.todo[r.done:r.done + n])
                r.done += n
                r.handle.stats.prefilled_tokens += n
                if r.register_at and len(conv.tokens) >= r.register_at:
                    self.slots.share_as_prefix(conv, r.register_at)
                    r.register_at = 0
                if r.done < len(r.todo):
                    continue
                r.t_prefilled = now
                if not r.generates:
                    self._finish(r, FinishReason.LENGTH)
                    continue
            self._sample(r, i)
        self._drop_finished()
        self.step_s += time.perf_counter() - t_step
        return True

    def _sample(self, r: Request, batch_index: int) -> None:
        if r.params.score_tokens:
            r.handle.scores = self.ctx.softmax_over(batch_index, r.params.score_tokens)
            r.handle.stats.first_token_s = time.perf_counter() - r.handle.t_submit
            self._finish(r, FinishReason.STOP)
            return
        tok = self.ctx.sample(r.chain.handle, batch_index)
        h = r.handle
        h.t_sample_ns = time.perf_counter_ns()   # consumers measure their delivery from here
        st = h.stats
        if st.tokens_generated == 0:
            r.t_first = time.perf_counter()
            st.first_token_s = r.t_first - h.t_submit
        st.tokens_generated += 1
        h._tokens.append(tok)
        if tok in self._eog:
            self._finish(r, FinishReason.STOP)
            return
        text = r.stream.feed_token(tok)
        if text and not self._emit(r, text):
            return
        if r.stream.stopped:
            self._finish(r, FinishReason.STOP)
        elif st.tokens_generated >= r.params.max_tokens:
            self._finish(r, FinishReason.LENGTH)
        elif len(r.conv.tokens) >= self.ctx.n_ctx_seq:
            self._finish(r, FinishReason.LENGTH)  # no position left for the sampled token
        else:
            r.next_token = tok

    def _emit(self, r: Request, text: str) -> bool:
        try:
            r.handle._emit(text)
            return True
        except Exception as e:  # a consumer's callback must not take the engine down
            self._finish(r, FinishReason.ERROR, f"on_text callback raised {e!r}")
            return False

    def _finish(self, r: Request, reason: FinishReason, error: str | None = None) -> None:
        if r.finished:
            return
        r.finished = True
        now = time.perf_counter()
        if reason in (FinishReason.STOP, FinishReason.LENGTH):
            tail = r.stream.finish()
            if tail:
                try:
                    r.handle._emit(tail)
                except Exception as e:
                    reason, error = FinishReason.ERROR, f"on_text callback raised {e!r}"
        st = r.handle.stats
        if r.t_admit:
            st.prefill_s = (r.t_prefilled or now) - r.t_admit
        if r.t_first:
            st.decode_s = now - r.t_first
        r.chain.free()
        conv = r.conv
        if conv is not None:
            conv.busy = False
            conv.last_used = time.monotonic()
            if conv.anonymous:
                self.slots.release(conv)
        r.handle._finish(reason, error)

    def _drop_finished(self) -> None:
        if any(r.finished for r in self.running):
            self.running = [r for r in self.running if not r.finished]

    # -- memory ---------------------------------------------------------------------------

    def make_room(self) -> bool:
        """Free KV cells held by nothing active: idle prefixes, idle conversations."""
        freed = self.cache.evict_idle()
        for conv in list(self.slots.convs.values()):
            if conv.resident and not conv.busy and conv.tokens:
                self.slots.evict(conv)
                freed += 1
        freed += self.cache.evict_idle()
        return freed > 0

    def cancel_key(self, key) -> None:
        for r in self.running:
            if r.key == key:
                self._finish(r, FinishReason.CANCELLED)
        self._drop_finished()
        for q in self.waiting.values():
            for r in [r for r in q if r.key == key]:
                q.remove(r)
                r.chain.free()
                r.handle._finish(FinishReason.CANCELLED)

    def shutdown(self) -> None:
        for r in self.running:
            self._finish(r, FinishReason.CANCELLED, "engine closed")
        self.running = []
        for q in self.waiting.values():
            while q:
                r = q.popleft()
                r.chain.free()
                r.handle._finish(FinishReason.CANCELLED, "engine closed")

    def memory(self) -> dict:
        ctx = self.ctx
        bpc = ctx.kv_bytes_per_cell
        seqs = self.slots.describe()
        prefixes = self.cache.describe()
        prefix_cells = sum(p["own_cells"] for p in prefixes)
        used = sum(s["private_cells"] for s in seqs.values()) + prefix_cells
        host = sum(s["host_bytes"] for s in seqs.values())
        spill = self.slots.spill
        return {
            "model": {"path": self.model.path, "architecture": self.model.architecture,
                      "weights_bytes": self.model.weights_bytes, "n_params": self.model.n_params},
            "context": {"n_ctx": ctx.n_ctx, "n_seq_max": ctx.n_seq_max, "n_batch": ctx.n_batch,
                        "kv_bytes_per_cell": bpc, "kv_cells_total": ctx.n_ctx,
                        "kv_bytes_total": ctx.n_ctx * bpc, "kv_cells_used": used,
                        "kv_bytes_used": used * bpc},
            "sequences": seqs,
            "prefixes": prefixes,
            "prefix_cells": prefix_cells,
            "host_bytes": host,         # evicted states held in RAM (tier "host")
            "spill": {"dir": str(spill.path) if spill.path else None,
                      "bytes": spill.bytes, "files": spill.files,
                      "peak_bytes": spill.peak_bytes, "writes": spill.writes,
                      "restores": spill.restores, "failures": spill.failures},
            "spill_bytes": spill.bytes,  # evicted states on disk (tier "file"), not RAM
        }

    def status(self) -> dict:
        return {
            "running": len(self.running),
            "waiting_interactive": len(self.waiting[Priority.INTERACTIVE]),
            "waiting_buffered": len(self.waiting[Priority.BUFFERED]),
            "waiting_background": len(self.waiting[Priority.BACKGROUND]),
            "free_slots": len(self.slots.free),
            "conversations": len(self.slots.convs),
            "prefixes": len(self.cache.entries),
            "throttle": self.throttle,
            "steps": self.steps,
            "step_tokens": self.step_tokens,
            "step_s": self.step_s,
            "decode_s": self.decode_s,
            "throttle_pauses": self.throttle_pauses,
            # plan + sampling + detokenize + delivery, per step
            "overhead_per_step_s": (self.step_s - self.decode_s) / max(1, self.steps),
        }
