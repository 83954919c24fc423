from typing import Any

OUT_RATE: int
MIN_RATE: int
MAX_RATE: int
MAX_CHANNELS: int

class AudioRing:
    capacity: int
    written: int
    def __init__(self, capacity: int) -> None: ...
    @property
    def oldest(self) -> int: ...
    def read(self, start: int, stop: int) -> Any: ...
    def append(self, x: Any) -> None: ...
    def reset(self) -> None: ...

class Resampler:
    in_rate: int
    channels: int
    up: int
    down: int
    half: int
    samples_in: int
    def __init__(self, in_rate: int, channels: int = 1) -> None: ...
    def feed(self, pcm: Any, ring: AudioRing) -> int: ...
