"""A turn's speech: sentences -> the voice -> TtsAudioFormatFrame, TtsAudioFrame chunks and
TtsVisemeFrame, sent to the connection from the speech engine's thread (docs/voice.md).

One `TurnAudio` per turn holds what the protocol makes turn-wide: the format frame is sent
once, by the first speaking node that produces audio; sample offsets and sentence indices
run on across every speaking node of the turn. Each speaking node runs one `SpeechStrand`:
its sentences go to the engine one at a time, in order (the next is submitted when the
previous is done, so a delivery-mode switch applies from the next sentence), each with the
moment its audio is needed: now for the turn's first sentence, later the end of what the
client already holds, so the engine serves whoever would run dry first.

A client that stops reading holds its speech back: while its connection is paused
(backpressure, docs/architecture.md) no further sentence is handed to the voice, and the
strand goes on when the connection drains, as a language model's streaming does.

When a sentence is done its audio is cut into chunks of `chunk_samples` and encoded while
it is converted to int16 (codec.encode_tts_audio), the chunks are sent in order, then the
sentence's TtsVisemeFrame when the voice emits visemes. A connection with a
`speech_sentence(text, n_samples, voice)` method (the pipeline gateway's) is told each
sentence's text and length first, with what besides the text decides its audio. Cancel
stops the strand after the chunk being sent (`cancel()` returns once no chunk is in
flight), so nothing of the turn's audio follows its TurnComplete.
"""
from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any

from tryll_fast import codec
from tryll_fast.workflow.voice import Voice, length_scale

DEFAULT_CHUNK_MS = 40


class TurnAudio:
    """The turn's one audio stream (sent from speech threads; guarded by `lock`)."""

    def __init__(self, turn, sample_rate: int, chunk_ms: int = DEFAULT_CHUNK_MS) -> None:
        self.turn = turn
        self.sample_rate = sample_rate
        self.chunk_samples = max(1, round(sample_rate * chunk_ms / 1000))
        self.lock = threading.Lock()
        self.format_sent = False
        self.samples_sent = 0
        self.sentences = 0
        self.t_first_audio: float | None = None     # time.monotonic() of the first chunk
        self.frames = 0
        self.synth_s = 0.0
        self.queue_s = 0.0
        self.underruns = 0

    def deadline(self) -> float:
        """When the client's audio runs out: the next sentence is needed by then."""
        if self.t_first_audio is None:
            return time.monotonic()
        return self.t_first_audio + self.samples_sent / self.sample_rate

    def diagnostics(self) -> dict[str, Any]:
        turn = self.turn
        first = (None if self.t_first_audio is None else
                 round((self.t_first_audio - turn.t_start_mono) * 1000, 3))
        return {"time_to_first_audio_ms": first, "sentences": self.sentences,
                "audio_ms": round(self.samples_sent * 1000 / self.sample_rate, 1),
                "frames": self.frames, "synth_ms": round(self.synth_s * 1000, 3),
                "queue_ms": round(self.queue_s * 1000, 3), "late_sentences": self.underruns,
                "sample_rate": self.sample_rate, "chunk_samples": self.chunk_samples}


class SpeechStrand:
    """One speaking node's sentences, in order, through the voice to the client."""

    def __init__(self, audio: TurnAudio, engine, voice: Voice, delivery, node_name: str,
                 priority, loop: asyncio.AbstractEventLoop) -> None:
        self.audio = audio
        self.engine = engine
        self.voice = voice
        self.delivery = delivery
        self.node_name = node_name
        self.priority = priority
        self.turn = audio.turn
        self.loop = loop
        self.done: asyncio.Future = loop.create_future()
        self._pending: collections.deque[str] = collections.deque()
        self._lock = threading.Lock()       # _pending, _inflight, _closed
        self._send_lock = threading.Lock()  # held while a sentence's frames are sent
        self._inflight = None
        self._closed = False
        self._held = None                   # on_resume unregistration while held back
        self.stopped = False
        self.error: BaseException | None = None
        self.sentences = 0
        self.modes: list[str] = []          # the delivery mode each sentence was handed with

    # ---- text in (any thread) ----

    def add(self, text: str) -> None:
        if not text:
            return
        with self._lock:
            if self.stopped or self._closed:
                return
            self._pending.append(text)
            if self._inflight is None:
                self._submit_next()

    def close(self) -> None:
        """No more text: `done` resolves once the pending sentences are sent."""
        with self._lock:
            self._closed = True
            finished = self._inflight is None and not self._pending
        if finished:
            self._resolve()

    def cancel(self) -> None:
        """Stop after the chunk being sent; drop the rest (any thread)."""
        self.stopped = True
        with self._lock:
            self._pending.clear()
            req = self._inflight
            self._release_hold()
        if req is not None:
            req.cancel()
        with self._send_lock:       # wait out a chunk being sent right now
            pass
        self._resolve()

    # ---- the voice ----

    def _submit_next(self) -> None:
        """With _lock held: hand the next sentence to the engine, unless the client is not
        reading (then once its connection resumes)."""
        conn = self.turn.conn
        if getattr(conn, "paused", False):
            if self._held is None:
                self._held = self.turn.session.on_resume(self._resumed)
            if conn.paused:         # (re-read: it may have resumed before the registration)
                return
            self._release_hold()
        text = self._pending.popleft()
        mode, intensity = self.delivery.get()
        self.modes.append(mode)
        self._inflight = self.engine.submit(
            text, length_scale=length_scale(self.voice, mode, intensity),
            speaker_id=self.voice.speaker_id, deadline=self.audio.deadline(),
            priority=self.priority, on_done=self._on_done)

    def _resumed(self) -> None:
        """The connection drained (reactor thread)."""
        with self._lock:
            self._release_hold()
            if self._pending and self._inflight is None and not self.stopped:
                self._submit_next()

    def _release_hold(self) -> None:
        if self._held is not None:
            self._held()
            self._held = None

    def _on_done(self, req) -> None:
        """The speech thread: send this sentence, then hand over the next."""
        if req.state == "failed" and not self.stopped:
            self.error = req.error
            self.stopped = True
        elif req.state == "done" and not self.stopped:
            self._send(req)
        with self._lock:
            self._inflight = None
            if self._pending and not self.stopped:
                self._submit_next()
                return
            finished = (self._closed or self.stopped) and self._held is None
        if finished:
            self._resolve()

    def _send(self, req) -> None:
        speech = req.result
        audio = self.audio
        turn = self.turn
        with self._send_lock, audio.lock:
            if self.stopped:
                return
            audio.synth_s += speech.synth_s
            audio.queue_s += req.queue_s
            if speech.n_samples == 0:
                return
            if audio.t_first_audio is not None and time.monotonic() > audio.deadline():
                audio.underruns += 1        # the client's audio ran out before this one
            conn = turn.conn
            if not audio.format_sent:
                conn.send(codec.encode(codec.TtsAudioFormatFrame(
                    request_id=turn.request_id, agent_id=turn.agent.id,
                    format=codec.WireAudioFormat(sample_rate=audio.sample_rate, channels=1,
                                                 bits_per_sample=16),
                    node_name=self.node_name)))
                audio.format_sent = True
            announce = getattr(conn, "speech_sentence", None)
            if announce is not None:     # a connection that shows the text before its audio
                announce(req.text, speech.n_samples,
                         f"{self.voice.model}/{req.speaker_id}/{req.length_scale:g}")
            base = audio.samples_sent
            index = audio.sentences
            frames = codec.encode_tts_audio(turn.request_id, turn.agent.id, self.node_name,
                                            speech.samples, audio.chunk_samples, base, index)
            sent = 0
            for frame in frames:
                if self.stopped:
                    break
                conn.send(frame)
                sent += 1
                if audio.t_first_audio is None:
                    audio.t_first_audio = time.monotonic()
            audio.frames += sent
            audio.samples_sent = base + min(speech.n_samples, sent * audio.chunk_samples)
            audio.sentences += 1
            self.sentences += 1
            if self.voice.emit_visemes and not self.stopped:
                cues = [codec.VisemeCue(sample_offset=base + int(o), viseme=int(v))
                        for o, v in zip(speech.cue_offsets.tolist(),
                                        speech.cue_visemes.tolist())]
                conn.send(codec.encode(codec.TtsVisemeFrame(
                    request_id=turn.request_id, agent_id=turn.agent.id,
                    node_name=self.node_name, visemes=cues, sentence_index=index)))

    def _resolve(self) -> None:
        self.loop.call_soon_threadsafe(_settle, self.done)


def _settle(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
