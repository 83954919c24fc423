"""One voice input: a microphone's audio, its utterances and their transcripts
(docs/voice.md, "Voice input").

States: idle (created, or after an UtteranceFinal / a cancel) -> listening (BeginUtterance)
-> finishing (the utterance is closed; its last segments are being decoded) -> idle.

Who touches it:
- the reactor thread: `feed()` (AudioBuffer: converted and resampled into the ring, a few
  microseconds), `begin()`, `end()`, `cancel()`, `destroy()`;
- the listener thread (listener.py): `step()` runs the VAD over the new audio, sends
  SpeechStart, commits segments, asks for partials and heartbeats;
- the speech-to-text thread: `_on_final()` / `_on_partial()` send SegmentFinal, Partial
  and, when the utterance is closed and every segment is decoded, UtteranceFinal.
`lock` guards the state; results of an older utterance (its `generation`) are dropped, so
a cancel leaves nothing behind it.

Segments: the VAD closes one after `vad_min_silence_ms` of silence; it is decoded with
`vad_speech_pad_ms` of audio before and after it. Hands-free (auto_finish_on_silence),
the first closed segment closes the utterance: its SegmentFinal (the phrase, or "" for
noise) is followed by UtteranceFinal; until the player speaks, an empty SegmentFinal every
HEARTBEAT_MS of silence says "not speaking". Push-to-talk, segments are committed as they
close and the utterance ends at EndUtterance (the open segment is committed then).
A segment reaching `max_utterance_ms` is cut there: ErrorResponse 4105 UtteranceTimeout
(with the BeginUtterance's request_id) and the cut segment's SegmentFinal; hands-free,
that also ends the utterance.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from tryll_fast import codec
from tryll_fast.errors import ErrorCode, TryllError
from tryll_fast.voice_input._audio import OUT_RATE, AudioRing, Resampler

log = logging.getLogger("tryll_fast.voice_input")

Kind = codec.TranscriptUpdateKind
PARTIAL_EVERY_MS = 300          # re-decode the open segment after this much new audio
HEARTBEAT_MS = 1000             # hands-free, before speech: an empty SegmentFinal this often
RING_SLACK_MS = 5000            # audio kept beyond the longest segment (pads, lag)
MAX_UTTERANCE_MS = 600_000
WINDOW = 512                    # samples the VAD takes at a time (32 ms at 16 kHz)
SPEECH_CONFIRM = 300            # ms: speech began about this long before the VAD says so


@dataclass
class Segment:
    index: int
    start: int                  # absolute ring indices
    end: int
    text: str | None = None     # None until decoded


@dataclass
class VadSettings:
    threshold: float = 0.5
    min_silence_ms: int = 1000
    speech_pad_ms: int = 250


@dataclass
class Counters:
    buffers: int = 0
    bytes: int = 0
    dropped: int = 0            # AudioBuffers for an idle / finishing handle
    odd_bytes: int = 0          # trailing bytes that were not a whole sample frame
    partials: int = 0
    finals: int = 0
    utterances: int = 0
    extra: dict = field(default_factory=dict)


class VoiceInput:
    def __init__(self, vid: int, *, send: Callable[[Any], None], engine, lease,
                 sample_rate: int, channels: int, vad: VadSettings,
                 hotwords: str | None, notify: Callable[["VoiceInput"], None],
                 locale: Callable[[], str] = lambda: "") -> None:
        self.id = vid
        self.send = send                    # send(body): a frame to the client, any thread
        self.engine = engine                # the SpeechToText engine (with .vad)
        self.lease = lease
        self.vad_settings = vad
        self.hotwords = hotwords
        self.notify = notify                # wakes the listener for this handle
        # the session's locale as it is now: the language hint of a multilingual model
        self.locale = locale
        self.resampler = Resampler(sample_rate, channels)
        self.sample_rate = sample_rate
        self.channels = channels
        self.frame_bytes = 2 * channels
        self.ring = AudioRing((60_000 + RING_SLACK_MS) * OUT_RATE // 1000)
        self.detector = engine.vad.detector(vad.threshold, vad.min_silence_ms / 1000.0,
                                            MAX_UTTERANCE_MS / 1000.0 + 1)
        self.lock = threading.Lock()
        self.state = "idle"
        self.generation = 0
        self.counters = Counters()
        self.destroyed = False
        self._utterance_reset()

    def _utterance_reset(self) -> None:
        self.begin_rid = 0
        self.auto_finish = True
        self.max_samples = 60_000 * OUT_RATE // 1000
        self.start = self.ring.written      # absolute index of the utterance's first sample
        self.vad_pos = self.start           # the VAD has seen audio up to here
        self.vad_origin = self.start        # the detector's sample 0, as an absolute index
        self.reset_vad = True
        self.speech_open = False
        self.seg_start = 0                  # open segment (absolute), while speech_open
        self.last_partial = 0
        self.partial_seq = 0                # which open segment a partial belongs to
        self.partial_req = None             # the open segment's partial being decoded
        self.quiet_since = self.start       # hands-free heartbeat clock
        self.segments: list[Segment] = []
        self.pending = 0                    # finals submitted, not decoded yet
        self.closed = False                 # no more segments: finish when pending is 0
        self.end_requested = False

    # ---- reactor thread ----

    def begin(self, rid: int, auto_finish: bool, max_utterance_ms: int) -> None:
        if not 1000 <= max_utterance_ms <= MAX_UTTERANCE_MS:
            raise TryllError(ErrorCode.InvalidParamValue,
                             f"max_utterance_ms {max_utterance_ms} is outside 1000.."
                             f"{MAX_UTTERANCE_MS}")
        with self.lock:
            if self.state != "idle":
                raise TryllError(ErrorCode.UtteranceInProgress,
                                 f"voice input {self.id} has an utterance "
                                 f"{'open' if self.state == 'listening' else 'finishing'}: "
                                 "end or cancel it first")
            need = (max_utterance_ms + RING_SLACK_MS) * OUT_RATE // 1000
            if need > self.ring.capacity:
                self.ring = AudioRing(need)
            self.generation += 1
            self._utterance_reset()
            self.begin_rid = rid
            self.auto_finish = bool(auto_finish)
            self.max_samples = max_utterance_ms * OUT_RATE // 1000
            self.state = "listening"
            self.counters.utterances += 1
        self.notify(self)

    def feed(self, pcm) -> None:
        """An AudioBuffer's PCM (a buffer: the frame's bytes, not copied)."""
        c = self.counters
        c.buffers += 1
        n = len(pcm)
        c.bytes += n
        with self.lock:
            if self.state != "listening" or self.closed:
                c.dropped += 1
                return
            odd = n % self.frame_bytes
            if odd:
                c.odd_bytes += odd
            if n - odd:
                self.resampler.feed(pcm, self.ring)
        self.notify(self)

    def end(self) -> None:
        with self.lock:
            if self.state != "listening":
                raise TryllError(ErrorCode.NoActiveUtterance,
                                 f"voice input {self.id} has no open utterance"
                                 + (" (it is finishing)" if self.state == "finishing" else ""))
            self.end_requested = True
            self.state = "finishing"
        self.notify(self)

    def cancel(self) -> None:
        with self.lock:
            if self.state == "idle":
                raise TryllError(ErrorCode.NoActiveUtterance,
                                 f"voice input {self.id} has no open utterance")
            self._drop_utterance()

    def destroy(self) -> None:
        with self.lock:
            if self.destroyed:
                return
            self.destroyed = True
            if self.state != "idle":
                self._drop_utterance()
        self.engine.cancel_key(self)

    def _drop_utterance(self) -> None:
        """With lock: end the utterance with no transcript."""
        self.generation += 1
        self.state = "idle"
        self._utterance_reset()
        self.engine.cancel_key(self)

    # ---- the listener thread ----

    def step(self) -> None:
        """Run the VAD over the audio that came in; commit, partial, heartbeat, finish.

        The detector is fed whole 512-sample windows, one at a time (sherpa-onnx's VAD
        places segments differently, or not at all, when given longer pieces), and the
        state is looked at after each window; a partial window waits for the next step,
        or for the end of the utterance."""
        events: list[Any] = []
        with self.lock:
            if self.state == "idle" or self.destroyed:
                return
            if self.reset_vad:
                self.detector.reset()
                self.reset_vad = False
                self.vad_origin = self.vad_pos
            end_requested = self.end_requested and not self.closed
            pos, stop = self.vad_pos, self.ring.written
            whole = pos + (stop - pos) // WINDOW * WINDOW
            take = stop if end_requested else whole
            audio = self.ring.read(pos, take) if take > pos else None
            if audio is not None:
                for off in range(0, len(audio), WINDOW):
                    self.detector.accept_waveform(audio[off:off + WINDOW])
                    self.vad_pos = pos + min(off + WINDOW, len(audio))
                    self._after_window(events)
            if end_requested:
                self.detector.flush()
                self._after_window(events)
                self.speech_open = False    # speech too short for the VAD: nothing
                self.closed = True
            finish = self._maybe_finish(events)
        for body in events:
            self.send(body)
        if finish:
            self.notify(self)

    def _after_window(self, events: list) -> None:
        """With lock, after the detector took a window (vad_pos is its end)."""
        d = self.detector
        while not d.empty():
            seg = d.front
            begin = self.vad_origin + int(seg.start)
            end = begin + len(seg.samples)
            d.pop()
            if not self.closed:
                self._commit(begin, end, events)
        if self.closed or self.state != "listening":
            return
        stop = self.vad_pos
        if d.is_speech_detected():
            if not self.speech_open:
                self.speech_open = True
                # the detector confirms speech min_speech (0.25 s) after it starts
                self.seg_start = max(self.start, stop - SPEECH_CONFIRM * OUT_RATE // 1000)
                self.last_partial = stop
                self.partial_seq += 1
                events.append(self._update(Kind.SpeechStart, ""))
            elif stop - self.seg_start >= self.max_samples:
                events.append(codec.ErrorResponse(
                    request_id=self.begin_rid, code=ErrorCode.UtteranceTimeout,
                    message=f"voice input {self.id}: a segment reached max_utterance_ms "
                            f"({self.max_samples * 1000 // OUT_RATE} ms) and was cut"))
                self._commit(self.seg_start, stop, events)
                self.reset_vad = True
                self.detector.reset()
                self.reset_vad = False
                self.vad_origin = stop
            elif (stop - self.last_partial >= PARTIAL_EVERY_MS * OUT_RATE // 1000
                  and (self.partial_req is None or self.partial_req.t_done)):
                # one partial at a time: the next after the last one came back
                self.last_partial = stop
                self._partial(stop)
        elif (self.auto_finish and not self.speech_open and not self.segments
              and stop - self.quiet_since >= HEARTBEAT_MS * OUT_RATE // 1000):
            self.quiet_since = stop
            events.append(self._update(Kind.SegmentFinal, ""))

    def _commit(self, begin: int, end: int, events: list) -> None:
        """With lock: a closed segment goes to the decoder (with the speech pads)."""
        pad = self.vad_settings.speech_pad_ms * OUT_RATE // 1000
        lo = max(begin - pad, self.start, self.ring.oldest)
        hi = min(end + pad, self.ring.written)
        seg = Segment(len(self.segments), begin, end)
        self.segments.append(seg)
        self.speech_open = False
        self.partial_seq += 1
        self.pending += 1
        if self.auto_finish:
            self.closed = True              # hands-free: the first phrase ends the turn
        gen = self.generation
        audio = self.ring.read(lo, hi)
        self.counters.finals += 1
        self.engine.submit(audio, key=self, final=True, hotwords=self.hotwords,
                           on_done=lambda req: self._on_final(req, gen, seg),
                           language=self.locale())

    def _partial(self, stop: int) -> None:
        pad = self.vad_settings.speech_pad_ms * OUT_RATE // 1000
        lo = max(self.seg_start - pad, self.start, self.ring.oldest)
        gen, seq = self.generation, self.partial_seq
        self.counters.partials += 1
        self.partial_req = self.engine.submit(
            self.ring.read(lo, stop), key=self, final=False, hotwords=self.hotwords,
            on_done=lambda req: self._on_partial(req, gen, seq), language=self.locale())

    def _maybe_finish(self, events: list) -> bool:
        """With lock: the closed utterance is complete once every segment is decoded."""
        if not self.closed or self.pending or self.state == "idle":
            return False
        text = " ".join(s.text for s in self.segments if s.text)
        events.append(self._update(Kind.UtteranceFinal, text, len(self.segments),
                                   self.start, self.vad_pos))
        self.state = "idle"
        return True

    def _update(self, kind, text: str, index: int | None = None, begin: int | None = None,
                end: int | None = None):
        """With lock: a WireTranscriptUpdate of this utterance."""
        def ms(i):
            return max(0, (i - self.start)) * 1000 // OUT_RATE
        if index is None:
            index = len(self.segments)
        if begin is None:
            begin = self.seg_start if self.speech_open else self.vad_pos
        if end is None:
            end = self.vad_pos
        return codec.WireTranscriptUpdate(
            voice_input_id=self.id, text=text, kind=kind,
            audio_ms_consumed=ms(self.vad_pos), segment_index=index, start_ms=ms(begin),
            end_ms=ms(end))

    # ---- the speech-to-text thread ----

    def _on_final(self, req, gen: int, seg: Segment) -> None:
        if req.state == "cancelled":
            return                  # dropped with its utterance (cancel_key, under lock)
        events: list[Any] = []
        with self.lock:
            if gen != self.generation or self.destroyed:
                return
            self.pending -= 1
            if req.state == "failed":
                log.warning("voice input %d: decoding failed: %s", self.id, req.error)
            seg.text = req.text if req.state == "done" else ""
            events.append(self._update(Kind.SegmentFinal, seg.text, seg.index, seg.start,
                                       seg.end))
            self._maybe_finish(events)
        for body in events:
            self.send(body)

    def _on_partial(self, req, gen: int, seq: int) -> None:
        if req.state != "done" or not req.text:
            return
        with self.lock:
            if (gen != self.generation or seq != self.partial_seq or not self.speech_open
                    or self.destroyed):
                return              # that segment is committed (or the utterance gone)
            body = self._update(Kind.Partial, req.text)
        self.send(body)

    def stats(self) -> dict:
        c = self.counters
        return {"state": self.state, "buffers": c.buffers, "bytes": c.bytes,
                "dropped": c.dropped, "odd_bytes": c.odd_bytes, "partials": c.partials,
                "finals": c.finals, "utterances": c.utterances,
                "ring_bytes": self.ring.capacity * 4}
