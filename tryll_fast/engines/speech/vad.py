"""Silero VAD (the `silero-vad` wheel's ONNX model) run by sherpa-onnx's
VoiceActivityDetector: the `sherpa-onnx` engine of the vad role.

A loaded `SileroVad` is a factory: every voice input gets a detector of its own (each holds
the state of its own audio stream), configured with that input's threshold and minimum
silence. A VAD is never loaded on its own: it rides its speech-to-text model, which gets
it among its loaded dependencies (models/manager.py).
"""
from __future__ import annotations

from pathlib import Path

from tryll_fast.engines.errors import ModelLoadError

SAMPLE_RATE = 16000
WINDOW = 512                    # samples per Silero window at 16 kHz (32 ms)


class SileroVad:
    def __init__(self, model_path: str | Path) -> None:
        try:
            import sherpa_onnx
        except ImportError as exc:  # pragma: no cover - a declared dependency
            raise ModelLoadError("the VAD needs sherpa-onnx") from exc
        self._so = sherpa_onnx
        self.model_path = str(model_path)
        if not Path(self.model_path).is_file():
            raise ModelLoadError(f"{self.model_path}: no such VAD model file")
        self.weights_bytes = Path(self.model_path).stat().st_size
        # one detector now: a model sherpa-onnx cannot load fails the load, not the first
        # voice input
        self.detector(0.5, 1.0, 30.0).reset()

    def detector(self, threshold: float, min_silence_s: float, max_speech_s: float,
                 min_speech_s: float = 0.25, buffer_s: float = 120.0):
        """A fresh detector for one audio stream (16 kHz mono float32)."""
        so = self._so
        silero = so.SileroVadModelConfig(
            model=self.model_path, threshold=float(threshold),
            min_silence_duration=float(min_silence_s),
            min_speech_duration=float(min_speech_s), window_size=WINDOW,
            max_speech_duration=float(max_speech_s))
        config = so.VadModelConfig(silero_vad=silero, sample_rate=SAMPLE_RATE, num_threads=1)
        return so.VoiceActivityDetector(config, buffer_size_in_seconds=float(buffer_s))

    def close(self) -> None:
        pass
