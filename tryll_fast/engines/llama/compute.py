"""The one thread that runs llama.cpp's compute graphs, for every context in the process.

The CPU backend is built with OpenMP: a `llama_decode` with n_threads > 1 runs its graph
in an OpenMP team whose master is the calling thread, and libgomp keeps a pool of
worker threads per master for as long as that master lives. libgomp counts those workers
across the whole process, and once it manages more threads than there are CPUs it cuts
every barrier's spin from ~300 000 iterations to 100 before sleeping on a futex (its
"throttled" spin; no environment variable raises it). A graph has a barrier per node, so
a decode then pays a futex sleep and wake-up hundreds of times: on 2 cores, with the chat
scheduler's team and an embedding context's team alive side by side, SmolLM2 went from
17-22 to 33-80 ms a token (docs/benchmarks.md, "One compute thread").

So every decode in the process (each chat scheduler, each lane, each Embedder) is handed
to this thread and the caller waits for it: one team, one pool of n_threads - 1 workers,
whatever the number of models and contexts. On a CPU-bound machine two decodes at once
only split the cores between them, so running them one after the other costs nothing;
the hand-off costs two thread wake-ups a decode (tens of microseconds against steps of
milliseconds). A call made on this thread runs directly.

Beside a game that leaves cores idle part of each frame, a decode also has a second
thread, "llama-compute-low", at a lower CPU priority (nice + LOW_NICE, set once when it
starts: an unprivileged process may lower its priority but never raise it again), so the
game's threads take a core back from it the moment they wake. cpu_share.py picks which
thread a decode runs on; it runs with one thread there, so no second OpenMP pool exists.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any, Callable

__all__ = ["run", "thread_ident", "low_cpu_s", "LOW_NICE"]

LOW_NICE = 19
_start_lock = threading.Lock()


class _Worker:
    def __init__(self, name: str, nice: int) -> None:
        self.name = name
        self.nice = nice
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.clock: int | None = None        # the thread's CPU-time clock

    def _loop(self) -> None:
        if self.nice:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
            except (AttributeError, OSError):
                pass
        try:
            self.clock = time.pthread_getcpuclockid(threading.get_ident())
        except (AttributeError, OSError):
            self.clock = None
        get = self.jobs.get
        while True:
            fn, args, box, done = get()
            try:
                box[0] = fn(*args)
            except BaseException as exc:   # handed back to the caller, raised there
                box[1] = exc
            done.release()
            del fn, args, box, done

    def ensure_started(self) -> threading.Thread:
        with _start_lock:
            if self.thread is None:
                t = threading.Thread(target=self._loop, name=self.name, daemon=True)
                t.start()
                self.thread = t
        return self.thread

    def cpu_s(self) -> float | None:
        """CPU seconds this thread has used (None where the clock is not readable)."""
        if self.clock is None:
            return None
        try:
            return time.clock_gettime(self.clock)
        except OSError:
            return None


_main = _Worker("llama-compute", 0)
_low = _Worker("llama-compute-low", LOW_NICE)


def thread_ident() -> int | None:
    """The compute thread's ident (None before the first call)."""
    return _main.thread.ident if _main.thread is not None else None


def run(fn: Callable[..., Any], *args: Any, low: bool = False) -> Any:
    """fn(*args) on the compute thread (the low-priority one when `low`); returns its
    result or raises its exception.

    Blocks the caller (with the GIL released) until it is done."""
    worker = _low if low else _main
    t = worker.thread or worker.ensure_started()
    me = threading.get_ident()
    if me == t.ident or (_main.thread is not None and me == _main.thread.ident) or (
            _low.thread is not None and me == _low.thread.ident):
        return fn(*args)
    done = threading.Lock()
    done.acquire()
    box: list[Any] = [None, None]
    worker.jobs.put((fn, args, box, done))
    done.acquire()
    if box[1] is not None:
        exc = box[1]
        box[1] = None
        raise exc
    return box[0]


def low_cpu_s() -> float | None:
    """CPU seconds the low-priority compute thread has used so far."""
    return _low.cpu_s()
