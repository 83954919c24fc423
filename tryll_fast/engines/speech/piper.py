"""A Piper VITS voice run with onnxruntime: text -> samples and the viseme cues of the same run.

Text is phonemized by eSpeak NG (espeak.py), mapped to the voice's phoneme ids (each symbol
followed by the pad id, between the start and end ids, as Piper trained them), and run
through the prepared graph (prepare.py), which returns the audio and each id's duration
in frames of `HOP` samples. The durations become viseme cues (visemes.py, _timeline.pyx).

The noise the graph consumes is drawn from a generator seeded by the phoneme ids and the
speaker, so a sentence always sounds the same in the same voice; its length is only an
upper bound, the graph slices what it needs (a too-short draw is retried longer).

Why onnxruntime and not sherpa-onnx's OfflineTts: sherpa-onnx returns samples only, and
a VITS voice's durations change from run to run, so visemes must come from the run that
made the audio; the prepared graph gives both (docs/voice.md).
"""
from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tryll_fast.engines.errors import InvalidRequest, ModelLoadError
from tryll_fast.engines.speech import espeak
from tryll_fast.engines.speech._timeline import cues as _cues
from tryll_fast.engines.speech.prepare import NOISE_W, NOISE_Z, PREPARED_NAME
from tryll_fast.engines.speech.visemes import id_classes

HOP = 256                       # samples per duration frame in Piper's VITS
FLOW_CHANNELS = 192             # the flow noise's channels (noise_z)
# Frames a phoneme id lasts at length_scale 1 are about 2-3; the noise drawn is sized for
# this many, times the length scale, and drawn again longer in the rare case it is short.
_FRAMES_PER_ID = 4
_MAX_FRAMES_PER_ID = 256      # 3 s per symbol: past any speed a profile can ask for
_MAX_TEXT_CHARS = 4000


@dataclass(frozen=True)
class Speech:
    """One synthesized sentence."""
    samples: np.ndarray         # float32, mono, -1..1 (not yet clipped)
    sample_rate: int
    phonemes: str
    cue_offsets: np.ndarray     # uint32 samples from this sentence's first sample
    cue_visemes: np.ndarray     # uint8 Viseme values
    synth_s: float = 0.0        # wall time of the model run
    track_samples: int = 0      # samples the voice's durations cover (= the audio's length)

    @property
    def n_samples(self) -> int:
        return int(self.samples.shape[0])


def _seed(ids: np.ndarray, speaker: int) -> int:
    h = hashlib.blake2b(ids.tobytes(), digest_size=8, key=speaker.to_bytes(4, "little"))
    return int.from_bytes(h.digest(), "little")


class PiperVoice:
    """A loaded Piper voice (the `onnxruntime` engine of the tts role).

    `model_path` is the voice's .onnx as fetched; its .onnx.json sits beside it and the
    prepared graph is PREPARED_NAME in the same directory."""

    def __init__(self, model_path: str | Path, *, n_threads: int = 2) -> None:
        model_path = Path(model_path)
        config_path = model_path.with_name(model_path.name + ".json")
        prepared = model_path.with_name(PREPARED_NAME)
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{config_path}: cannot read the voice config: {exc}") from exc
        if not prepared.is_file():
            raise ModelLoadError(f"{prepared} is missing: the voice was not prepared at fetch "
                                 "time (fetch it again: `tryll-fast models fetch`)")
        try:
            self.sample_rate = int(config["audio"]["sample_rate"])
            self.id_map: dict[str, list[int]] = config["phoneme_id_map"]
            self.espeak_voice = str(config.get("espeak", {}).get("voice") or "en-us")
            inference = config.get("inference", {})
            self.noise_scale = float(inference.get("noise_scale", 0.667))
            self.base_length_scale = float(inference.get("length_scale", 1.0))
            self.noise_w = float(inference.get("noise_w", 0.8))
            self.num_speakers = int(config.get("num_speakers", 1))
            self.speaker_names: dict[str, int] = dict(config.get("speaker_id_map") or {})
            n_symbols = int(config.get("num_symbols", 256))
            self._bos, self._eos, self._pad = (self.id_map["^"], self.id_map["$"],
                                               self.id_map["_"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"{config_path}: not a Piper voice config ({exc!r})") from exc
        espeak.check_voice(self.espeak_voice)
        self.classes = id_classes(self.id_map, n_symbols)
        try:
            import onnxruntime as ort
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise ModelLoadError("the Piper voice needs onnxruntime") from exc
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = max(1, int(n_threads))
        opts.inter_op_num_threads = 1
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        # No busy-waiting between ops: the CPU is shared with llama.cpp and with the game.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.log_severity_level = 3
        try:
            self._session = ort.InferenceSession(str(prepared), opts,
                                                 providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types
            raise ModelLoadError(f"{prepared}: onnxruntime cannot load it: {exc}") from exc
        names = {i.name for i in self._session.get_inputs()}
        if not {NOISE_W, NOISE_Z} <= names:
            raise ModelLoadError(f"{prepared}: not a prepared Piper graph (inputs {names})")
        self._has_sid = "sid" in names
        self.weights_bytes = prepared.stat().st_size
        self._lock = threading.Lock()
        self.runs = 0
        self.retries = 0

    # ----- text -> ids -----

    def phoneme_ids(self, phonemes: str) -> np.ndarray:
        ids = list(self._bos) + list(self._pad)
        for ch in phonemes:
            mapped = self.id_map.get(ch)
            if mapped:
                ids.extend(mapped)
                ids.extend(self._pad)
        ids.extend(self._eos)
        return np.asarray(ids, dtype=np.int64)

    def phonemize(self, text: str) -> str:
        return espeak.phonemize(text, self.espeak_voice)

    # ----- synthesis -----

    def synthesize(self, text: str, *, length_scale: float = 1.0, speaker_id: int = 0
                   ) -> Speech:
        """Synthesize one sentence. length_scale > 1 speaks slower (1 / speed)."""
        if not isinstance(text, str) or len(text) > _MAX_TEXT_CHARS:
            raise InvalidRequest(f"text must be a str of at most {_MAX_TEXT_CHARS} characters")
        if not (math.isfinite(length_scale) and 0.05 <= length_scale <= 20):
            raise InvalidRequest(f"length_scale {length_scale!r} outside 0.05..20")
        if not 0 <= speaker_id < max(1, self.num_speakers):
            raise InvalidRequest(f"speaker_id {speaker_id} outside 0..{self.num_speakers - 1}")
        phonemes = self.phonemize(text)
        ids = self.phoneme_ids(phonemes)
        empty_cues = (np.zeros(0, np.uint32), np.zeros(0, np.uint8))
        if len(ids) <= len(self._bos) + len(self._pad) + len(self._eos):
            return Speech(np.zeros(0, np.float32), self.sample_rate, phonemes, *empty_cues)
        n = len(ids)
        rng = np.random.default_rng(_seed(ids, speaker_id))
        noise_w = rng.standard_normal((1, n, 2), dtype=np.float32).transpose(0, 2, 1)
        frames = int(n * _FRAMES_PER_ID * max(1.0, length_scale * self.base_length_scale)) + 64
        # frame t's noise is row t of a (frames, 192) draw: a longer redraw keeps it
        flow_rng_state = rng.bit_generator.state
        feeds = {
            "input": ids[None, :],
            "input_lengths": np.asarray([n], dtype=np.int64),
            "scales": np.asarray([self.noise_scale, self.base_length_scale * length_scale,
                                  self.noise_w], dtype=np.float32),
            NOISE_W: np.ascontiguousarray(noise_w),
        }
        if self._has_sid:
            feeds["sid"] = np.asarray([speaker_id], dtype=np.int64)
        while True:
            rng.bit_generator.state = flow_rng_state
            noise_z = rng.standard_normal((1, frames, FLOW_CHANNELS), dtype=np.float32)
            feeds[NOISE_Z] = np.ascontiguousarray(noise_z.transpose(0, 2, 1))
            t0 = time.perf_counter()
            try:
                audio, durations = self._session.run(None, feeds)
                break
            except Exception:  # noqa: BLE001 - onnxruntime's own error types
                # a noise draw shorter than the frames the model chose fails the run
                # (a shape mismatch); anything else fails the retries the same way
                if frames >= _MAX_FRAMES_PER_ID * n:
                    raise
                with self._lock:
                    self.retries += 1
                frames = min(frames * 4, _MAX_FRAMES_PER_ID * n)
        dt = time.perf_counter() - t0
        with self._lock:
            self.runs += 1
        samples = np.ascontiguousarray(audio.reshape(-1), dtype=np.float32)
        durations = np.ascontiguousarray(durations.reshape(-1), dtype=np.float32)
        offsets, visemes = _cues(ids, durations, self.classes, HOP)
        track = int(np.rint(durations).sum()) * HOP
        return Speech(samples, self.sample_rate, phonemes, offsets, visemes, dt, track)

    def close(self) -> None:
        self._session = None

