"""What a caller holds for one generation: priority, stats, and a future-like handle.

The scheduler thread writes into the handle (text chunks, tokens, stats) and
never reads from it; consumers read through a queue.SimpleQueue and an Event,
so draining a stream never takes the scheduler's lock.
"""

import logging
import queue
import threading
import time
from dataclasses import asdict, dataclass

from tryll_fast.engines.errors import EngineError
from tryll_fast.engines.roles import FinishReason, Priority

log = logging.getLogger(__name__)

@dataclass
class RequestStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0      # reused from the conversation's own KV (longest common prefix)
    shifted_tokens: int = 0     # cells a context shift dropped (older turns that left the window)
    prefix_tokens: int = 0      # attached from the shared prefix cache
    prefilled_tokens: int = 0   # prompt tokens this request actually decoded
    tokens_generated: int = 0
    restored: bool = False      # the conversation came back from host memory
    admitted_order: int = -1    # rank among all admissions of this engine (queue order)
    queue_wait_s: float = 0.0   # submit -> admitted to a slot
    prefill_s: float = 0.0      # admitted -> prompt fully decoded
    first_token_s: float = 0.0  # submit -> first sampled token
    decode_s: float = 0.0       # first token -> finish
    total_s: float = 0.0
    finish_reason: str | None = None

    def as_dict(self) -> dict:
        return asdict(self)

_END = object()

class RequestHandle:
    """Future-like view of one request: wait(), cancel(), text, tokens, stats, stream()."""

    def __init__(self, request_id: int, key, priority: Priority, on_text=None, on_finish=None):
        self.id = request_id
        self.key = key
        self.priority = priority
        self.stats = RequestStats()
        self.error: str | None = None
        self._on_text = on_text
        self._on_finish = on_finish
        self._chunks: list[str] = []
        self._tokens: list[int] = []
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._done = threading.Event()
        self._cancel = threading.Event()
        self._wake = None  # set by the engine: nudges the scheduler on cancel()
        self.t_submit = time.perf_counter()
        self.t_sample_ns = 0     # perf_counter_ns() when the latest token was sampled
        # SamplingParams.score_tokens: their probabilities at the first sampling point
        self.scores: tuple[float, ...] | None = None

    # -- consumer side --------------------------------------------------------------------

    def wait(self, timeout: float | None = None) -> bool:
        """True once the request finished (for any reason)."""
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> str:
        """The whole text; raises EngineError if the request failed or timed out."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.id} still running after {timeout} s")
        if self.error is not None:
            raise EngineError(self.error)
        return self.text

    def cancel(self) -> None:
        """Stop generation before the scheduler's next step (no-op once finished)."""
        self._cancel.set()
        if self._wake is not None:
            self._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def text(self) -> str:
        return "".join(self._chunks)

    @property
    def tokens(self) -> list[int]:
        return list(self._tokens)

    @property
    def finish_reason(self) -> str | None:
        return self.stats.finish_reason

    def stream(self, timeout: float | None = None):
        """Yield text chunks as they are produced, until the request ends."""
        while True:
            try:
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"request {self.id}: no text for {timeout} s") from None
            if item is _END:
                return
            yield item

    __iter__ = stream

    # -- scheduler side -------------------------------------------------------------------

    def _emit(self, text: str) -> None:
        self._chunks.append(text)
        self._queue.put(text)
        if self._on_text is not None:
            self._on_text(text)

    def _finish(self, reason: FinishReason, error: str | None = None) -> None:
        now = time.perf_counter()
        st = self.stats
        st.finish_reason = reason.value
        st.total_s = now - self.t_submit
        self.error = error
        self._queue.put(_END)
        self._done.set()
        if self._on_finish is not None:
            try:
                self._on_finish(self)
            except Exception:  # a consumer's callback must not take the engine down
                log.exception("on_finish callback of request %d failed", self.id)

    def __repr__(self):
        state = self.stats.finish_reason or "pending"
        return f"<RequestHandle {self.id} key={self.key!r} {state}>"
