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

Beside a busy game, a one-thread decode may instead run on the low-priority thread of
_lowthread.pyx (SCHED_IDLE, bound to one CPU, no Python on it); cpu_share.py decides.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable

__all__ = ["run", "thread_ident"]

_jobs: queue.SimpleQueue = queue.SimpleQueue()
_start_lock = threading.Lock()
_thread: threading.Thread | None = None


def _loop() -> None:
    get = _jobs.get
    while True:
        fn, args, box, done = get()
        try:
            box[0] = fn(*args)
        except BaseException as exc:   # handed back to the caller, raised there
            box[1] = exc
        done.release()
        del fn, args, box, done


def _ensure_started() -> None:
    global _thread
    with _start_lock:
        if _thread is None:
            t = threading.Thread(target=_loop, name="llama-compute", daemon=True)
            t.start()
            _thread = t


def thread_ident() -> int | None:
    """The compute thread's ident (None before the first call)."""
    return _thread.ident if _thread is not None else None


def run(fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) on the compute thread; returns its result or raises its exception.

    Blocks the caller (with the GIL released) until it is done."""
    t = _thread
    if t is None:
        _ensure_started()
        t = _thread
    if threading.get_ident() == t.ident:
        return fn(*args)
    done = threading.Lock()
    done.acquire()
    box: list[Any] = [None, None]
    _jobs.put((fn, args, box, done))
    done.acquire()
    if box[1] is not None:
        exc = box[1]
        box[1] = None
        raise exc
    return box[0]
