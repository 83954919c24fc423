"""The speech engine: one voice, one synthesis thread, sentences served earliest-deadline-first.

Every speaking agent hands sentences over as they become ready (`submit`), each with the
moment its audio is needed: the end of what that agent's client already holds, or now for
a turn's first sentence. The thread always synthesizes the sentence whose listener will
run out first (Interactive agents before Background ones), so four NPCs talking at once
share the voice without one of them falling silent while another is far ahead. A sentence
needed more than `lookahead_s` from now waits, which bounds the audio queued in a client
and the work a Cancel throws away.

Under throttle (SetInferenceThrottle) the thread sleeps after each sentence in proportion
to its synthesis time, more than the language model does between its steps, so speech
yields before visible text. What is synthesized never changes, only when.

`on_done(request)` runs on the synthesis thread once per request, whatever happened
(request.state: done, cancelled, failed); it must not block.
"""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from typing import Any, Callable

from tryll_fast.engines.errors import EngineClosed, InvalidRequest
from tryll_fast.engines.roles import Priority
from tryll_fast.engines.speech.piper import PiperVoice, Speech

log = logging.getLogger("tryll_fast.engines.speech")

# Throttle pause after a sentence = synthesis time x factor x t / (1 - t), at most
# MAX_PAUSE_S (t = 1: MAX_PAUSE_S). The language model's factor is 1 (engines/llama).
SPEECH_YIELD = {Priority.INTERACTIVE: 2.0, Priority.BUFFERED: 2.0, Priority.BACKGROUND: 4.0}
MAX_PAUSE_S = 0.5
DEFAULT_LOOKAHEAD_S = 20.0
_AGAIN: Any = object()          # _next() finished cancelled requests; look again


class SpeechRequest:
    """One sentence to synthesize (what `submit` returns)."""

    __slots__ = ("text", "length_scale", "speaker_id", "deadline", "priority", "on_done",
                 "state", "result", "error", "t_submit", "t_start", "t_done", "_done")

    def __init__(self, text: str, length_scale: float, speaker_id: int, deadline: float,
                 priority: Priority, on_done: Callable[["SpeechRequest"], None] | None):
        self.text = text
        self.length_scale = length_scale
        self.speaker_id = speaker_id
        self.deadline = deadline
        self.priority = priority
        self.on_done = on_done
        self.state = "queued"           # queued -> running -> done | failed; or cancelled
        self.result: Speech | None = None
        self.error: BaseException | None = None
        self.t_submit = time.monotonic()
        self.t_start = 0.0
        self.t_done = 0.0
        self._done = threading.Event()

    def cancel(self) -> None:
        """Drop the sentence if it has not started; a running one finishes unseen
        (state cancelled, no result)."""
        if self.state in ("queued", "running"):
            self.state = "cancelled"

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    @property
    def queue_s(self) -> float:
        return max(0.0, self.t_start - self.t_submit) if self.t_start else 0.0


class SpeechEngine:
    """A loaded TTS voice behind its synthesis thread (the tts role, engines/roles.py)."""

    def __init__(self, voice: PiperVoice, *, lookahead_s: float = DEFAULT_LOOKAHEAD_S,
                 throttle: float = 0.0, owns_voice: bool = True) -> None:
        self.voice = voice
        self._owns_voice = owns_voice
        self.sample_rate = voice.sample_rate
        self.lookahead_s = float(lookahead_s)
        self._heap: list[tuple[int, float, int, SpeechRequest]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._closing = False
        self._throttle = 0.0
        self.set_throttle(throttle)
        self.synthesized = 0
        self.synth_s = 0.0
        self._thread = threading.Thread(target=self._loop, name="tryll-speech", daemon=True)
        self._thread.start()

    @property
    def weights_bytes(self) -> int:
        return self.voice.weights_bytes

    @property
    def num_speakers(self) -> int:
        return self.voice.num_speakers

    @property
    def speaker_names(self) -> dict[str, int]:
        return dict(self.voice.speaker_names)

    def submit(self, text: str, *, length_scale: float = 1.0, speaker_id: int = 0,
               deadline: float | None = None, priority: Priority = Priority.INTERACTIVE,
               on_done: Callable[[SpeechRequest], None] | None = None) -> SpeechRequest:
        """Queue one sentence. deadline: time.monotonic() by which its audio is needed
        (None = now)."""
        if not isinstance(text, str):
            raise InvalidRequest("text must be a str")
        req = SpeechRequest(text, float(length_scale), int(speaker_id),
                            time.monotonic() if deadline is None else float(deadline),
                            Priority(priority), on_done)
        with self._cv:
            if self._closing:
                raise EngineClosed("the speech engine is closed")
            heapq.heappush(self._heap, (int(req.priority), req.deadline, next(self._seq), req))
            self._cv.notify()
        return req

    def synthesize(self, text: str, **kw: Any) -> Speech:
        """Blocking: one sentence through the queue (for tools and tests)."""
        req = self.submit(text, **kw)
        req.wait()
        if req.error is not None:
            raise req.error
        if req.result is None:
            raise EngineClosed("the sentence was cancelled")
        return req.result

    def set_throttle(self, throttle: float) -> None:
        if not isinstance(throttle, (int, float)) or not 0.0 <= throttle <= 1.0:
            raise InvalidRequest(f"throttle={throttle!r} outside [0, 1]")
        with self._cv:
            self._throttle = float(throttle)
            self._cv.notify()

    @property
    def throttle(self) -> float:
        return self._throttle

    def queued(self) -> int:
        with self._cv:
            return sum(1 for *_, r in self._heap if r.state == "queued")

    def memory(self, timeout: float | None = None) -> dict:
        return {"weights_bytes": self.voice.weights_bytes, "queued": self.queued(),
                "synthesized": self.synthesized, "synth_s": round(self.synth_s, 3)}

    # ----- the synthesis thread -----

    def _next(self) -> SpeechRequest | None:
        dropped: list[SpeechRequest] = []
        try:
            with self._cv:
                while True:
                    if self._closing:
                        return None
                    while self._heap and self._heap[0][3].state != "queued":
                        dropped.append(heapq.heappop(self._heap)[3])
                    if dropped:
                        return None if self._closing else _AGAIN
                    if not self._heap:
                        self._cv.wait()
                        continue
                    wait = self._heap[0][1] - self.lookahead_s - time.monotonic()
                    if wait > 0:
                        self._cv.wait(wait)
                        continue
                    req = heapq.heappop(self._heap)[3]
                    req.state = "running"
                    req.t_start = time.monotonic()
                    return req
        finally:
            for req in dropped:         # cancelled while queued: told outside the lock
                self._finish(req)

    def _loop(self) -> None:
        while True:
            req = self._next()
            if req is None:
                return
            if req is _AGAIN:
                continue
            t0 = time.perf_counter()
            try:
                speech = self.voice.synthesize(req.text, length_scale=req.length_scale,
                                               speaker_id=req.speaker_id)
            except BaseException as exc:  # noqa: BLE001 - reported to the request
                if req.state == "running":
                    req.state = "failed"
                req.error = exc
            else:
                if req.state == "running":
                    req.result = speech
                    req.state = "done"
            dt = time.perf_counter() - t0
            self.synthesized += 1
            self.synth_s += dt
            self._finish(req)
            t = self._throttle
            if t > 0:
                factor = SPEECH_YIELD[req.priority]
                pause = MAX_PAUSE_S if t >= 1 else min(MAX_PAUSE_S, dt * factor * t / (1 - t))
                with self._cv:
                    if not self._closing:
                        self._cv.wait(pause)

    def _finish(self, req: SpeechRequest) -> None:
        req.t_done = time.monotonic()
        req._done.set()
        if req.on_done is not None:
            try:
                req.on_done(req)
            except Exception:  # a callback bug must not stop every agent's speech
                log.exception("speech on_done callback failed")

    # ----- lifetime -----

    def close(self) -> None:
        with self._cv:
            if self._closing:
                return
            self._closing = True
            left = [r for *_, r in self._heap]
            self._heap.clear()
            self._cv.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        for req in left:
            if req.state == "queued":
                req.state = "cancelled"
            self._finish(req)
        if self._owns_voice:
            self.voice.close()

    @property
    def closed(self) -> bool:
        return self._closing

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
