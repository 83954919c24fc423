"""LlamaEngine: one model, one llama_context, one scheduler thread; the public API.

Threads: callers (any thread) validate and tokenize their request, then hand
it over through a short critical section; the scheduler thread alone touches
the llama_context, the prefix cache and the conversations. Control calls
(evict, release, memory, status) run on the scheduler thread between steps,
as commands whose result the caller waits for. A step's llama_decode is handed to
the process's compute thread (compute.py) and the scheduler thread waits for it;
decode and sampling are ctypes calls, which release the GIL, so callers and the
network keep running while a step computes.
"""
import concurrent.futures
import contextlib
import functools
import itertools
import logging
import os
import threading
import time

from tryll_fast.engines.llama import model as model_mod
from tryll_fast.engines.llama._detok import TextStream
from tryll_fast.engines.llama.conversations import TIERS
from tryll_fast.engines.llama.lanes import BASE as _BASE, Lane, LaneKey
from tryll_fast.engines.errors import EngineClosed, InvalidRequest
from tryll_fast.engines.llama.model import LlamaModel
from tryll_fast.engines.llama.request import RequestHandle
from tryll_fast.engines.llama.sampling import SamplerChain
from tryll_fast.engines.roles import FinishReason, Priority, SamplingParams
from tryll_fast.engines.llama.scheduler import Request, Scheduler

log = logging.getLogger(__name__)

# Under throttle t the engine pauses step x t / (1 - t) after its steps, so it keeps a
# (1 - t) share of the time: linear in t, as SetInferenceThrottle promises, whatever a step
# costs on the device. From 0.95 up the share stays 1/20, so even 1 ("yield as much as you
# can") keeps text moving.
MAX_PAUSE_PER_STEP = 19.0


def throttle_pause(step_s: float, throttle: float) -> float:
    """Seconds to yield after `step_s` seconds of decoding under `throttle`."""
    if throttle <= 0.0:
        return 0.0
    ratio = MAX_PAUSE_PER_STEP if throttle >= 1.0 else throttle / (1.0 - throttle)
    return step_s * min(ratio, MAX_PAUSE_PER_STEP)


class LlamaEngine:
    """Batched generation for many conversations on one model.

    n_slots conversation sequences can be resident at once (more wait, or idle ones
    are evicted); n_prefix_slots more seq ids hold shared prefixes. An evicted
    conversation's state goes to a file under spill_dir (evict_to="file", the
    default: its memory is given back; None = `$XDG_CACHE_HOME/tryll_fast/kv`) or
    stays in host memory (evict_to="host"), and is restored by its next request.
    The KV cache has n_ctx cells shared by all of them. A step carries at most
    n_batch tokens; while sequences are generating, prompts get at most
    prefill_while_decoding of them (0 = no cap), so a new long prompt cannot stall the
    streams already running. context_shift keeps a conversation's KV past a stretch its
    next prompt leaves out (scheduler.py's module doc).
    """

    def __init__(self, model, *, n_ctx: int = 4096, n_slots: int = 8, n_prefix_slots: int = 2,
                 n_batch: int = 512, n_threads: int = 2, n_threads_batch: int = 2,
                 prefix_cell_budget: int | None = None, throttle: float = 0.0,
                 flash_attn_type: int = -1, prefill_while_decoding: int = 0,
                 evict_to: str = "file", spill_dir: str | os.PathLike | None = None,
                 placement: str | None = None, n_gpu_layers: int | None = None,
                 context_shift: bool = True):
        if n_slots < 1 or n_prefix_slots < 0:
            raise InvalidRequest(
                f"n_slots={n_slots} must be >= 1, n_prefix_slots={n_prefix_slots} >= 0")
        if not isinstance(prefill_while_decoding, int) or prefill_while_decoding < 0:
            raise InvalidRequest(f"prefill_while_decoding={prefill_while_decoding!r} must be "
                                 "an int >= 0 (0 = n_batch)")
        if evict_to not in TIERS:
            raise InvalidRequest(f"evict_to={evict_to!r} is not one of {', '.join(TIERS)}")
        if n_batch < n_slots:
            # every generating sequence needs its token in each step's batch
            raise InvalidRequest(f"n_batch={n_batch} must be >= n_slots={n_slots}")
        self._owns_model = not isinstance(model, LlamaModel)
        self.model = (LlamaModel(model, placement=placement, n_gpu_layers=n_gpu_layers)
                      if self._owns_model else model)
        # key -> a new Lane with this engine's settings
        self._new_lane = functools.partial(
            Lane, {"n_ctx": n_ctx, "n_batch": n_batch, "n_threads": n_threads,
                   "n_threads_batch": n_threads_batch, "flash_attn_type": flash_attn_type},
            self.model, n_slots=n_slots, n_prefix_slots=n_prefix_slots,
            prefix_cell_budget=prefix_cell_budget, spill_root=spill_dir, evict_to=evict_to)
        try:
            base = self._new_lane(_BASE)
        except BaseException:
            if self._owns_model:
                self.model.close()
            raise
        base.refs = 1
        # lane key -> lane; the base lane first. Changed on the scheduler thread only.
        self._lanes: dict[LaneKey, Lane] = {base.key: base}
        self._rotation = 0
        # conversation key -> the lane holding it (scheduler thread)
        self._key_lane: dict = {}
        self.ctx = base.ctx
        self._sched = base.sched
        self._sched.prefill_while_decoding = prefill_while_decoding
        self._sched.context_shift = bool(context_shift)
        self._piece_fn = model_mod.token_to_piece_address()
        self._ids = itertools.count(1)
        self._cv = threading.Condition()
        self._incoming: list[Request] = []
        self._commands: list = []
        self._nudged = False
        self._formatter = None
        self._hold = 0
        self._closing = False
        self._closed = False
        # (when the last throttled round of steps ended, how long it decoded): the pause
        # runs from there, its length read from the throttle as it is now, so a throttle
        # lowered meanwhile ends it sooner and a raised one makes it longer
        self._paused_after = (0.0, 0.0)
        self.set_throttle(throttle)
        name = f"llama-scheduler-{os.path.basename(self.model.path)}"
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # -- text -----------------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool = True,
                 parse_special: bool = True) -> list[int]:
        self._check_open()
        return self.model.tokenize(text, add_special=add_special, parse_special=parse_special)

    def detokenize(self, tokens) -> str:
        self._check_open()
        return self.model.detokenize(tokens)

    def chat_formatter(self):
        """The model's chat formatter (its GGUF template or a fallback), built once."""
        with self._cv:
            if self._formatter is None:
                from tryll_fast.prompting.chat import ChatFormatter
                self._formatter = ChatFormatter.from_metadata(self.model.chat_metadata())
            return self._formatter

    @property
    def n_ctx(self) -> int:
        return self.ctx.n_ctx

    # -- requests -------------------------------------------------------------------------

    def submit(self, prompt, *, key=None, sampling: SamplingParams | None = None,
               priority: Priority = Priority.INTERACTIVE, shared_prefix_len: int = 0,
               on_text=None, on_finish=None, gate=None, lane: LaneKey | None = None,
               **sampling_fields) -> RequestHandle:
        """Queue a generation; returns at once with a handle.

        prompt: text (tokenized with special tokens parsed, BOS as the model
        wants) or a list of token ids. key: the conversation (agent x node)
        whose KV is kept and reused by later requests with the same key; None
        means a one-off sequence freed when done. shared_prefix_len: the
        prompt's first tokens that other conversations will repeat verbatim
        (system prompt, lore, tool schema); they become a shared prefix.
        on_text(chunk) runs on the scheduler thread for every text chunk;
        on_finish(handle) runs there once the request ended (any reason).
        gate: backpressure, an object whose `paused` attribute the scheduler reads
        before each step (a transport Connection): while it is true the request
        samples no new token (it keeps its slot and KV); call wake() when it
        clears.
        lane: the context to run on (open_lane(); None = the engine's own). A conversation
        key submitted to another lane than before is re-decoded there: its KV was computed
        under the other lane's adapters.
        """
        self._check_open()
        if lane is None:
            lane = _BASE
        elif lane not in self._lanes:
            raise InvalidRequest(f"lane {lane.describe()!r} is not open (open_lane() first)")
        if sampling is None:
            sampling = SamplingParams(**sampling_fields)
        elif sampling_fields:
            raise InvalidRequest("pass either sampling= or sampling fields, not both")
        sampling.validate()
        if sampling.score_tokens:
            if sampling.max_tokens < 1:
                raise InvalidRequest("score_tokens needs max_tokens >= 1 (the prompt's last "
                                     "token must be decoded for its logits)")
            self.model.check_tokens(list(sampling.score_tokens))
        tokens = self._prompt_tokens(prompt)
        if not isinstance(priority, Priority):
            try:
                priority = Priority(priority)
            except ValueError:
                raise InvalidRequest(f"priority {priority!r} is not a Priority") from None
        if not isinstance(shared_prefix_len, int) or not 0 <= shared_prefix_len <= len(tokens):
            raise InvalidRequest(
                f"shared_prefix_len={shared_prefix_len!r} outside [0, {len(tokens)}]"
                " (prompt tokens)")
        if key is not None:
            try:
                hash(key)
            except TypeError:
                raise InvalidRequest(f"conversation key {key!r} is not hashable") from None
        anonymous = key is None
        rid = next(self._ids)
        if anonymous:
            key = ("anonymous", rid)
        chain = SamplerChain(self.model, sampling)
        try:
            stream = TextStream(sampling.stop, self.model.vocab_handle, self._piece_fn)
        except BaseException:
            chain.free()
            raise
        handle = RequestHandle(rid, None if anonymous else key, priority, on_text, on_finish)
        handle._wake = self._nudge
        req = Request(handle, key, anonymous, tokens, sampling, chain, stream, shared_prefix_len,
                      gate)
        with self._cv:
            if self._closing:
                chain.free()
                raise EngineClosed("engine is closed")
            self._incoming.append((lane, req))
            self._cv.notify()
        return handle

    def generate(self, prompt, *, timeout: float | None = None, **kw) -> str:
        """submit() and wait for the whole text."""
        return self.submit(prompt, **kw).result(timeout)

    def prefill(self, key, prompt, *, shared_prefix_len: int = 0,
                priority: Priority = Priority.BACKGROUND,
                lane: LaneKey | None = None) -> RequestHandle:
        """Decode a prompt into the conversation's KV without generating."""
        if key is None:
            raise InvalidRequest("prefill needs a conversation key (its KV is what is kept)")
        return self.submit(prompt, key=key, sampling=SamplingParams(max_tokens=0),
                           priority=priority, shared_prefix_len=shared_prefix_len, lane=lane)

    def _prompt_tokens(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            tokens = self.model.tokenize(prompt)
        elif isinstance(prompt, (list, tuple)):
            tokens = list(prompt)
            self.model.check_tokens(tokens)
        else:
            raise InvalidRequest(
                f"prompt must be str or a list of token ids, not {type(prompt).__name__}")
        if not tokens:
            raise InvalidRequest("empty prompt")
        if len(tokens) > self.ctx.n_ctx_seq:
            raise InvalidRequest(
                f"prompt of {len(tokens)} tokens exceeds the context (n_ctx={self.ctx.n_ctx_seq})")
        return tokens

    # -- control (run on the scheduler thread) --------------------------------------------

    def evict(self, key, timeout: float | None = 30, tier: str | None = None) -> None:
        """Free an idle conversation's KV cells now, its state kept in a file (tier "file")
        or in host memory ("host"; None = the engine's evict_to) and restored by its next
        request."""
        if tier is not None and tier not in TIERS:
            raise InvalidRequest(f"tier={tier!r} is not one of {', '.join(TIERS)}")

        def run():
            sched = self._lane_of(key).sched
            conv = sched.slots.get(key)
            if conv is None:
                raise InvalidRequest(f"no conversation {key!r}")
            sched.slots.evict(conv, tier)
        self._call(run, timeout)

    def release(self, key, timeout: float | None = 30) -> None:
        """Cancel the conversation's requests and free its KV and saved state."""
        def run():
            self._release_key(self._lane_of(key), key)
            self._key_lane.pop(key, None)
        self._call(run, timeout)

    def conversation(self, key, prefix=None, timeout: float | None = 30) -> dict | None:
        """What the engine holds for a conversation (None: nothing): its token count,
        whether its KV is in a seq slot or saved (`saved`; `stored`: "file" or "host"), whether
        it is busy, and whether its tokens start with `prefix` (a token list)."""
        def run():
            lane = self._lane_of(key)
            conv = lane.sched.slots.get(key)
            if conv is None:
                return None
            held = conv.tokens
            return {"tokens": len(held), "resident": conv.resident,
                    "saved": conv.stored is not None, "stored": conv.stored,
                    "busy": conv.busy, "lane": lane.key.describe(),
                    "holds_prefix": prefix is not None and len(held) >= len(prefix)
                    and held[:len(prefix)] == list(prefix)}
        return self._call(run, timeout)

    def clear_prefixes(self, timeout: float | None = 30) -> int:
        """Drop every shared prefix nobody is attached to; returns how many."""
        return self._call(lambda: sum(lane.sched.cache.evict_idle()
                                      for lane in self._lanes.values()), timeout)

    def memory(self, timeout: float | None = 30) -> dict:
        """Plain-dict accounting: model weights, KV cells/bytes per context, sequence, prefix.
        The engine's own context at the top level; every other lane's under "lanes", each
        with the same keys and a "lane" describing it."""
        def run():
            out = self._sched.memory()
            out["lane"] = self._lanes[_BASE].describe()
            out["lanes"] = [dict(lane.sched.memory(), lane=lane.describe())
                            for key, lane in self._lanes.items() if not key.is_base]
            out["adapters"] = self.model.adapter_info()
            out["placement"] = self.model.placement_info()
            return out
        return self._call(run, timeout)

    def status(self, timeout: float | None = 30) -> dict:
        """The engine's own context's scheduler counters; the other lanes' under "lanes"."""
        def run():
            out = self._sched.status()
            out["throttle_pause_left_s"] = max(0.0, self._pause_left(time.perf_counter()))
            out["lanes"] = {lane.key.describe(): lane.sched.status()
                            for key, lane in self._lanes.items() if not key.is_base}
            return out
        return self._call(run, timeout)

    # -- lanes ----------------------------------------------------------------------------

    def open_lane(self, key: LaneKey, timeout: float | None = 120) -> LaneKey:
        """Take a reference to the lane for `key`, making its context (and loading its
        adapters) the first time; close_lane() gives it back. Raises ModelLoadError or
        InvalidRequest naming what llama.cpp cannot make of it."""
        if not isinstance(key, LaneKey):
            raise InvalidRequest(f"lane key {key!r} is not a LaneKey")

        def run():
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._new_lane(key)
                lane.sched.throttle = self._sched.throttle
                lane.sched.prefill_while_decoding = self._sched.prefill_while_decoding
                lane.sched.context_shift = self._sched.context_shift
                self._lanes[key] = lane
                log.info("llama lane opened: %s on %s", key.describe(),
                         os.path.basename(self.model.path))
            lane.refs += 1
            return key
        return self._call(run, timeout)

    def close_lane(self, key: LaneKey, timeout: float | None = 30) -> None:
        """Give back a reference from open_lane(); the last one frees the lane's context,
        its conversations and its adapter references (the base lane is never closed)."""
        def run():
            lane = self._lanes.get(key)
            if lane is None or key.is_base:
                return
            lane.refs -= 1
            if lane.refs > 0:
                return
            del self._lanes[key]
            for k in [k for k, v in self._key_lane.items() if v == key]:
                del self._key_lane[k]
            lane.close()
            log.info("llama lane closed: %s", key.describe())
        self._call(run, timeout)

    def lanes(self, timeout: float | None = 30) -> list[dict]:
        """Every open lane: its key described, adapters, context settings, users."""
        return self._call(lambda: [lane.describe() for lane in self._lanes.values()], timeout)

    def _lane_of(self, key) -> Lane:
        return self._lanes.get(self._key_lane.get(key, _BASE)) or self._lanes[_BASE]

    @staticmethod
    def _release_key(lane: Lane, key) -> None:
        lane.sched.cancel_key(key)
        conv = lane.sched.slots.get(key)
        if conv is not None:
            lane.sched.slots.release(conv)

    def set_throttle(self, throttle: float) -> None:
        """0 = full speed; towards 1 the scheduler sleeps longer between steps."""
        if not isinstance(throttle, (int, float)) or not 0.0 <= throttle <= 1.0:
            raise InvalidRequest(f"throttle={throttle!r} outside [0, 1]")
        for lane in self._lanes.values():
            lane.sched.throttle = float(throttle)
        self._nudge()              # a pause under way is now shorter or longer

    def _pause_left(self, now: float) -> float:
        end, busy = self._paused_after
        return end + throttle_pause(busy, self._sched.throttle) - now

    @property
    def throttle(self) -> float:
        return self._sched.throttle

    @property
    def prefill_while_decoding(self) -> int:
        """Prompt tokens a step may carry while sequences generate (0 = n_batch)."""
        return self._sched.prefill_while_decoding

    @prefill_while_decoding.setter
    def prefill_while_decoding(self, n: int) -> None:
        if not isinstance(n, int) or n < 0:
            raise InvalidRequest(f"prefill_while_decoding={n!r} must be an int >= 0")
        for lane in self._lanes.values():
            lane.sched.prefill_while_decoding = n

    @contextlib.contextmanager
    def hold(self):
        """No step starts while held: requests submitted inside start in the same step."""
        with self._cv:
            self._hold += 1
        try:
            yield self
        finally:
            with self._cv:
                self._hold -= 1
                self._cv.notify()

    def _call(self, fn, timeout):
        self._check_open()
        if threading.current_thread() is self._thread:
            return fn()
        fut = concurrent.futures.Future()
        with self._cv:
            if self._closing:
                raise EngineClosed("engine is closed")
            self._commands.append((fn, fut))
            self._cv.notify()
        return fut.result(timeout)

    def _nudge(self) -> None:
        with self._cv:
            self._nudged = True
            self._cv.notify()

    def wake(self) -> None:
        """Any thread: a gate opened (or anything else worth a new step); cheap."""
        self._nudge()

    def _check_open(self) -> None:
        if self._closing:
            raise EngineClosed("engine is closed")

    # -- the scheduler thread -------------------------------------------------------------

    def _has_work(self) -> bool:
        return any(lane.sched.has_work() for lane in self._lanes.values())

    def _route(self, lane_key: LaneKey, r: Request) -> None:
        lane = self._lanes.get(lane_key)
        if lane is None:                       # closed between submit() and now
            r.chain.free()
            r.handle._finish(FinishReason.ERROR, f"lane {lane_key.describe()!r} was closed")
            return
        if not r.anonymous:
            old = self._key_lane.get(r.key, _BASE)
            if old != lane_key:                # its KV was computed under other adapters
                prev = self._lanes.get(old)
                if prev is not None:
                    self._release_key(prev, r.key)
                if lane_key.is_base:
                    del self._key_lane[r.key]
                else:
                    self._key_lane[r.key] = lane_key
        lane.sched.enqueue(r)

    def _posted(self) -> bool:
        """Another thread left something for the loop (under self._cv)."""
        return bool(self._closing or self._commands or self._incoming or self._nudged)

    def _loop(self) -> None:
        idle_wait = None
        while True:
            with self._cv:
                while not (self._posted() or (self._hold == 0 and self._has_work())):
                    self._cv.wait()
                if idle_wait and not self._posted():
                    self._cv.wait(idle_wait)
                if self._closing:
                    return
                incoming, self._incoming = self._incoming, []
                commands, self._commands = self._commands, []
                held = self._hold > 0
                self._nudged = False
            try:
                for lane_key, r in incoming:
                    self._route(lane_key, r)
                for fn, fut in commands:
                    try:
                        fut.set_result(fn())
                    except BaseException as e:
                        fut.set_exception(e)
                lanes = list(self._lanes.values())
                for lane in lanes:
                    lane.sched.sweep_cancelled()
                if held:
                    idle_wait = None
                    continue
                # Under throttle the device is the game's until the pause ends; commands,
                # new requests and cancels are still taken in meanwhile (they wake the wait)
                pause_left = self._pause_left(time.perf_counter())
                if pause_left > 0:
                    idle_wait = pause_left
                    continue
                # one step per lane with work, the first lane rotating: lanes share the
                # thread (and llama.cpp's threads) step by step, none waits for another's
                # requests to end
                n = len(lanes)
                first = self._rotation % n
                self._rotation += 1
                stepped_any = False
                busy = 0.0
                for i in range(n):
                    s = lanes[(first + i) % n].sched
                    if not s.has_work():
                        continue
                    s.admit()
                    t0 = time.perf_counter()
                    stepped = s.step()
                    stepped_any = stepped_any or stepped
                    if stepped and s.throttle > 0:
                        busy += time.perf_counter() - t0
                        s.throttle_pauses += 1
                if busy:
                    self._paused_after = (time.perf_counter(), busy)
                # nothing to decode but work queued (e.g. a conversation busy): don't spin
                idle_wait = None if stepped_any or not self._has_work() else 0.01
            except Exception as e:  # a bug must fail requests, not silently kill the thread
                log.exception("llama scheduler step failed")
                for lane in list(self._lanes.values()):
                    s = lane.sched
                    for r in list(s.running):
                        s._finish(r, FinishReason.ERROR, f"scheduler error: {e!r}")
                    s._drop_finished()

    # -- lifetime -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the scheduler, cancel what is left, free context and (owned) model."""
        if threading.current_thread() is self._thread:
            raise InvalidRequest("close() called from the scheduler thread (an on_text callback?)")
        with self._cv:
            if self._closed:
                return
            self._closing = True
            self._cv.notify()
        self._thread.join()
        with self._cv:
            leftover, self._incoming = self._incoming, []
            commands, self._commands = self._commands, []
        for _, r in leftover:
            self._sched.enqueue(r)                 # cancelled with the base lane's
        for _, fut in commands:
            fut.set_exception(EngineClosed("engine is closed"))
        for key in [k for k in self._lanes if not k.is_base]:
            self._lanes.pop(key).close()
        self._lanes[_BASE].close()
        if self._owns_model:
            self.model.close()
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closing

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

