"""The listener: one thread that runs every voice input's VAD as its audio arrives.

AudioBuffers are resampled into their handle's ring on the reactor thread (microseconds);
the VAD (tens of microseconds per 32 ms window), segment commits and partial requests run
here, off the reactor; decoding runs on the speech-to-text engine's thread. A handle is
queued once however many buffers arrived since it was last stepped.
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("tryll_fast.voice_input")


class Listener:
    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._queued: dict = {}             # handle -> None, in arrival order
        self._stopping = False
        self.steps = 0
        self._thread = threading.Thread(target=self._run, name="tryll-listen", daemon=True)
        self._thread.start()

    def notify(self, handle) -> None:
        """Step `handle` soon (any thread)."""
        with self._cv:
            if handle not in self._queued:
                self._queued[handle] = None
                self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queued and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                handles = list(self._queued)
                self._queued.clear()
            for handle in handles:
                try:
                    handle.step()
                except Exception:   # one handle's failure must not deafen the others
                    log.exception("voice input %s: step failed", getattr(handle, "id", "?"))
                self.steps += 1

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(10)
