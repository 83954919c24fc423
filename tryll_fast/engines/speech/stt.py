"""Speech to text with faster-whisper (CTranslate2 Whisper, int8 on the CPU): the
`faster-whisper` engine of the stt role, with one decoding thread that every voice input
shares.

Work comes as segments of 16 kHz float audio. Finals (a segment the VAD closed, or the
rest at EndUtterance) are decoded first, oldest first; partials (the open segment
re-decoded while the player still talks) only when no final waits, and a voice input never
has more than one partial queued: a newer one replaces it. So a long utterance on one
microphone cannot starve another's final, and partials simply come less often when the
machine is busy. `on_done(request)` runs on the decoding thread.

Hotwords: Whisper has no beam-search bonus to give a phrase, so the phrases go into the
decoder's prompt (after <|startofprev|>, as faster-whisper's `hotwords` do), which makes
it expect them; the score only switches them on (> 1.0) or off (<= 1.0, the original's
"off" value). docs/voice.md.

Short windows: faster-whisper's `transcribe()` pads every input to Whisper's 30 s window,
and the encoder's cost is that of the window: about 0.35 s on 2 cores here whether the
player said "yes" or a paragraph, which would be most of a transcript's latency. A segment
under 28 s is encoded in a window of its own length plus a second of silence, but never
under WINDOW_MIN_S (shorter windows make Whisper loop on the last word), through
CTranslate2 directly: 3-6x faster for a sentence. An output that looks like a loop (its
zlib compression ratio above 2.4, as Whisper itself judges) is decoded again with the
full window; so are segments of 28 s and more.
"""
from __future__ import annotations

import collections
import logging
import math
import threading
import time
import zlib
from pathlib import Path
from typing import Any, Callable

import numpy as np

from tryll_fast.engines.errors import EngineClosed, InvalidRequest, ModelLoadError

log = logging.getLogger("tryll_fast.engines.speech")

SAMPLE_RATE = 16000
# The longest segment decoded at once: Whisper reads 30 s windows; a longer one is decoded
# window by window by faster-whisper itself.
MAX_SEGMENT_S = 600
WINDOW_MIN_S = 10               # the shortest encoder window (see above)
FULL_WINDOW_FRAMES = 3000       # Whisper's 30 s, in 10 ms mel frames
LOOP_COMPRESSION = 2.4          # Whisper's own threshold for a repetitive output


class SttRequest:
    __slots__ = ("audio", "key", "final", "hotwords", "language", "on_done", "state", "text",
                 "error", "t_submit", "t_start", "t_done", "decode_s", "_done")

    def __init__(self, audio, key, final: bool, hotwords: str | None,
                 on_done: Callable[["SttRequest"], None] | None,
                 language: str | None = None) -> None:
        self.audio = audio
        self.key = key
        self.final = final
        self.hotwords = hotwords
        self.language = language        # the session's language hint; None: the model's
        self.on_done = on_done
        self.state = "queued"          # queued -> running -> done | failed; or cancelled
        self.text = ""
        self.error: BaseException | None = None
        self.t_submit = time.monotonic()
        self.t_start = 0.0
        self.t_done = 0.0
        self.decode_s = 0.0
        self._done = threading.Event()

    def cancel(self) -> None:
        if self.state in ("queued", "running"):
            self.state = "cancelled"

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)


class WhisperEngine:
    """A loaded Whisper model (with its VAD, `vad`, when the catalog gives it one)."""

    sample_rate = SAMPLE_RATE

    def __init__(self, model_dir: str | Path, *, vad=None, n_threads: int = 2,
                 compute_type: str = "int8", beam_size: int = 5,
                 partial_beam_size: int = 1, language: str = "en") -> None:
        try:
            from faster_whisper import WhisperModel
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise ModelLoadError("speech to text needs faster-whisper") from exc
        path = Path(model_dir)
        if not (path / "model.bin").is_file():
            raise ModelLoadError(f"{path}: not a CTranslate2 Whisper model directory")
        try:
            self.model = WhisperModel(str(path), device="cpu", compute_type=compute_type,
                                      cpu_threads=max(1, int(n_threads)),
                                      local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - CTranslate2's own error types
            raise ModelLoadError(f"{path}: faster-whisper cannot load it: {exc}") from exc
        try:
            from faster_whisper.tokenizer import Tokenizer
            from faster_whisper.transcribe import get_suppressed_tokens
            import ctranslate2
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise ModelLoadError(f"faster-whisper's internals moved: {exc}") from exc
        self._ct2 = ctranslate2
        multilingual = self.multilingual = bool(self.model.model.is_multilingual)
        self._tok = Tokenizer(self.model.hf_tokenizer, multilingual, task="transcribe",
                              language=language if multilingual else None)
        self._suppress = list(get_suppressed_tokens(self._tok, [-1]))
        self._prompt = list(self._tok.sot_sequence) + [self._tok.no_timestamps]
        self.short_windows = 0
        self.full_windows = 0
        self.vad = vad
        self.language = language
        # the language codes a multilingual model knows (its tokenizer's), and the
        # start-of-transcript prompts of those asked for so far
        self._languages = frozenset(self.model.supported_languages) if multilingual \
            else frozenset()
        self._by_language: dict[str, tuple[Any, list[int]]] = {}
        self.beam_size = int(beam_size)
        self.partial_beam_size = int(partial_beam_size)
        self.weights_bytes = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        self._finals: collections.deque[SttRequest] = collections.deque()
        self._partials: collections.OrderedDict[Any, SttRequest] = collections.OrderedDict()
        self._cv = threading.Condition()
        self._closing = False
        self._throttle = 0.0
        self.decoded = 0
        self.decode_s = 0.0
        self.audio_s = 0.0
        # a first decode here, not in a player's first utterance (CTranslate2 allocates on
        # first use)
        self._decode(np.zeros(SAMPLE_RATE // 2, np.float32), None, self.partial_beam_size)
        self._thread = threading.Thread(target=self._loop, name="tryll-stt", daemon=True)
        self._thread.start()

    # ----- requests -----

    def submit(self, audio: np.ndarray, *, key: Any, final: bool, hotwords: str | None = None,
               on_done: Callable[[SttRequest], None] | None = None,
               language: str | None = None) -> SttRequest:
        """Queue a segment (16 kHz mono float32). The key's queued partial, if any, ends
        cancelled: a newer partial or a final of the same key makes it moot. `language`
        (a language code such as "de") is the hint a multilingual model decodes with; an
        English-only model, or a code the model does not know, keeps its own."""
        if not isinstance(audio, np.ndarray) or audio.dtype != np.float32 or audio.ndim != 1:
            raise InvalidRequest("audio must be a 1-D float32 array at 16 kHz")
        if len(audio) > MAX_SEGMENT_S * SAMPLE_RATE:
            raise InvalidRequest(f"a segment of {len(audio) / SAMPLE_RATE:.0f} s is longer "
                                 f"than {MAX_SEGMENT_S} s")
        req = SttRequest(audio, key, final, hotwords, on_done, self.hint(language))
        with self._cv:
            if self._closing:
                raise EngineClosed("the speech-to-text engine is closed")
            # a final supersedes the key's queued partial; a newer partial replaces it
            replaced = self._partials.pop(key, None)
            if final:
                self._finals.append(req)
            else:
                self._partials[key] = req
            self._cv.notify()
        if replaced is not None:
            replaced.cancel()
            self._finish(replaced)
        return req

    def transcribe(self, audio: np.ndarray, hotwords: str | None = None) -> str:
        """Blocking: one final through the queue (tools, tests, benchmarks)."""
        req = self.submit(audio, key=object(), final=True, hotwords=hotwords)
        req.wait()
        if req.error is not None:
            raise req.error
        return req.text

    def cancel_key(self, key: Any) -> None:
        """Drop a voice input's queued work (its utterance was cancelled or destroyed)."""
        dropped = []
        with self._cv:
            p = self._partials.pop(key, None)
            if p is not None:
                dropped.append(p)
            keep = collections.deque()
            for r in self._finals:
                (dropped if r.key == key else keep).append(r)
            self._finals = keep
        for r in dropped:
            r.cancel()
            self._finish(r)

    def set_throttle(self, throttle: float) -> None:
        if not isinstance(throttle, (int, float)) or not 0.0 <= throttle <= 1.0:
            raise InvalidRequest(f"throttle={throttle!r} outside [0, 1]")
        self._throttle = float(throttle)

    def memory(self, timeout: float | None = None) -> dict:
        with self._cv:
            queued = len(self._finals) + len(self._partials)
        return {"weights_bytes": self.weights_bytes, "queued": queued,
                "decoded": self.decoded, "decode_s": round(self.decode_s, 3),
                "audio_s": round(self.audio_s, 3)}

    # ----- the decoding thread -----

    def _next(self) -> SttRequest | None:
        with self._cv:
            while not self._closing and not self._finals and not self._partials:
                self._cv.wait()
            if self._closing:
                return None
            if self._finals:
                req = self._finals.popleft()
            else:
                _, req = self._partials.popitem(last=False)
            req.state = "running" if req.state == "queued" else req.state
            req.t_start = time.monotonic()
            return req

    def _loop(self) -> None:
        while True:
            req = self._next()
            if req is None:
                return
            if req.state == "running":
                t0 = time.perf_counter()
                try:
                    req.text = self._decode(req.audio, req.hotwords,
                                            self.beam_size if req.final
                                            else self.partial_beam_size, req.language)
                    if req.state == "running":
                        req.state = "done"
                except Exception as exc:  # noqa: BLE001 - reported to the request
                    req.error = exc
                    if req.state == "running":
                        req.state = "failed"
                req.decode_s = time.perf_counter() - t0
                self.decoded += 1
                self.decode_s += req.decode_s
                self.audio_s += len(req.audio) / SAMPLE_RATE
                t = self._throttle
                if t > 0:      # speech recognition is background work: it yields first
                    pause = 0.5 if t >= 1 else min(0.5, req.decode_s * 2 * t / (1 - t))
                    with self._cv:
                        if not self._closing:
                            self._cv.wait(pause)
            req.audio = None
            self._finish(req)

    def hint(self, language: str | None) -> str | None:
        """The language a request decodes in: the hint when this model is multilingual
        and knows it, else None (the model's own language)."""
        if not language or not self.multilingual:
            return None
        code = language.split("-")[0].lower()
        return code if code in self._languages else None

    def _prompt_for(self, language: str | None) -> tuple[Any, list[int]]:
        """(tokenizer, start-of-transcript prompt) for a language (None: the model's)."""
        if language is None or language == self.language:
            return self._tok, self._prompt
        if language not in self._by_language:
            from faster_whisper.tokenizer import Tokenizer
            tok = Tokenizer(self.model.hf_tokenizer, True, task="transcribe",
                            language=language)
            self._by_language[language] = (tok, list(tok.sot_sequence) + [tok.no_timestamps])
        return self._by_language[language]

    def _decode(self, audio: np.ndarray, hotwords: str | None, beam: int,
                language: str | None = None) -> str:
        feats = self.model.feature_extractor(audio)
        n = feats.shape[-1]
        if n + 100 < FULL_WINDOW_FRAMES:
            frames = max(WINDOW_MIN_S * 100, (n // 100 + 2) * 100)
            window = np.zeros((feats.shape[0], frames), np.float32)
            window[:, :n] = feats
            text = self._generate(window, hotwords, beam, len(audio) / SAMPLE_RATE, language)
            if text is not None:
                self.short_windows += 1
                return text
        self.full_windows += 1
        segments, _ = self.model.transcribe(
            audio, language=language or self.language, beam_size=beam, vad_filter=False,
            condition_on_previous_text=False, without_timestamps=True,
            hotwords=hotwords or None)
        return " ".join(s.text.strip() for s in segments).strip()

    def _generate(self, window: np.ndarray, hotwords: str | None, beam: int,
                  seconds: float, language: str | None = None) -> str | None:
        """One short window through CTranslate2; None when the output looks like a loop."""
        tok, prompt = self._prompt_for(language)
        if hotwords:
            words = tok.encode(" " + hotwords.strip())[:200]
            prompt = [tok.sot_prev] + words + prompt
        # far more tokens than speech holds (about 4 a second): a loop runs into it
        budget = min(440 - len(prompt), 16 + math.ceil(seconds * 10))
        features = self._ct2.StorageView.from_array(np.ascontiguousarray(window[None]))
        result = self.model.model.generate(
            features, [prompt], beam_size=beam, max_length=budget, suppress_blank=True,
            suppress_tokens=self._suppress)[0]
        tokens = [t for t in result.sequences_ids[0] if t < tok.eot]
        text = tok.decode(tokens).strip()
        if len(tokens) >= budget - 1 or _looping(text):
            return None
        return text

    def _finish(self, req: SttRequest) -> None:
        req.t_done = time.monotonic()
        req._done.set()
        if req.on_done is not None:
            try:
                req.on_done(req)
            except Exception:  # a callback bug must not stop every microphone
                log.exception("speech-to-text on_done callback failed")

    # ----- lifetime -----

    def close(self) -> None:
        with self._cv:
            if self._closing:
                return
            self._closing = True
            left = list(self._finals) + list(self._partials.values())
            self._finals.clear()
            self._partials.clear()
            self._cv.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        for req in left:
            req.cancel()
            self._finish(req)
        self.model = None

    @property
    def closed(self) -> bool:
        return self._closing


def _looping(text: str) -> bool:
    """Whisper's test for a degenerate output: it compresses too well."""
    data = text.encode("utf-8")
    return len(data) > 24 and len(data) / len(zlib.compress(data)) > LOOP_COMPRESSION
