"""How many threads a decode gets, from what else the machine is doing.

A decode with n threads meets at a barrier after every graph node. On a machine whose
cores are all taken by someone else's threads (a game), one of ours is descheduled at
almost every barrier and the others wait out the scheduler's time slice: beside one busy
thread on 2 cores a 2-thread decode of Qwen2.5-Coder-0.5B went from 21 to 7 tokens a
second and beside two from 21 to 2.8, while a 1-thread decode kept 11.7 and 7.5
(docs/configuration.md, "Sharing the CPU with a game"). So, before a decode, the governor
looks at how much CPU the rest of the machine used lately and leaves that many cores to
it: threads = cores - round(other), at least 1, at most what the context asks for.

While someone else keeps cores busy, the decode also runs on the low-priority compute
thread (compute.py), so a game that sleeps part of each frame gets its cores back at once
and the decode uses what the game leaves (the sampler that follows it too: about a
millisecond over a 150 000-token vocabulary). A game that leaves nothing (every core busy all
the time) would starve it: when the low thread got less than STARVED of the wall time its
decodes took over the last quarter second, decodes go back to the normal-priority thread
for NORMAL_HOLD_S and then try the low one again. The NPC then gets a fair share.

"Other" is the machine's busy time (/proc/stat) less this process's own (/proc/self/stat)
over the last sampling interval, in cores, smoothed over two intervals. Our own spinning
threads count as ours, so the server never backs off from itself. A reading is taken at
most every `interval_s` on the thread that decodes (two small file reads, ~30 us). Where
/proc is absent (not Linux) the governor gives every decode what it asks for.
"""
from __future__ import annotations

import math
import os
import threading
import time
from typing import Callable

__all__ = ["ThreadGovernor", "read_proc", "governor", "set_adaptive", "decode",
           "after_decode"]

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# above half a core of someone else's work, one core is left to it
ROUND_AT = 0.5
# the low-priority thread's share of its decodes' wall time below which it is starved
STARVED = 0.25
NORMAL_HOLD_S = 2.0
LOW_WINDOW_S = 0.25


def read_proc() -> tuple[int, int] | None:
    """(the machine's busy jiffies over all CPUs, this process's user + system jiffies),
    or None where /proc cannot be read."""
    try:
        with open("/proc/stat", "rb") as f:
            fields = f.readline().split()
        with open("/proc/self/stat", "rb") as f:
            own = f.read()
    except OSError:
        return None
    # cpu user nice system idle iowait irq softirq steal ...: busy is all but idle, iowait
    values = [int(x) for x in fields[1:9]]
    busy = sum(values) - values[3] - values[4]
    # the command name may hold spaces: the fields after it start after the last ')'
    rest = own[own.rindex(b")") + 2:].split()
    return busy, int(rest[11]) + int(rest[12])      # utime, stime


class ThreadGovernor:
    """Threads for the next decode. `reader` and `clock` are /proc and the monotonic clock
    unless given (tests feed recorded readings)."""

    def __init__(self, cores: int | None = None, interval_s: float = 0.25,
                 reader: Callable[[], tuple[int, int] | None] = read_proc,
                 clock: Callable[[], float] = time.monotonic, tick_hz: int = CLK_TCK) -> None:
        if cores is None:
            try:
                cores = len(os.sched_getaffinity(0))
            except (AttributeError, OSError):
                cores = os.cpu_count() or 1
        self.cores = max(1, cores)
        self.interval_s = interval_s
        self.reader = reader
        self.clock = clock
        self.tick_hz = tick_hz
        self.adaptive = True
        self.other = 0.0            # cores the rest of the machine used lately (smoothed)
        self.reserved = 0           # cores left to it
        self._last: tuple[float, int, int] | None = None
        self._lock = threading.Lock()
        self._normal_until = 0.0     # decodes stay on the normal thread until then
        self._low_wall = 0.0         # the low thread's decodes since the last verdict
        self._low_cpu = 0.0
        self.low_active = False      # the last decode ran on the low thread

    def plan(self, wanted: int) -> tuple[int, bool]:
        """(threads, low priority) for the next decode."""
        n = self.threads(wanted)
        low = self.adaptive and self.reserved > 0 and self.clock() >= self._normal_until
        self.low_active = low
        return n, low

    def low_ran(self, wall_s: float, cpu_s: float) -> None:
        """A decode on the low thread took `wall_s`, of which it ran `cpu_s`."""
        with self._lock:
            self._low_wall += wall_s
            self._low_cpu += cpu_s
            if self._low_wall < LOW_WINDOW_S:
                return
            share = self._low_cpu / self._low_wall
            self._low_wall = self._low_cpu = 0.0
            if share < STARVED:
                self._normal_until = self.clock() + NORMAL_HOLD_S

    def threads(self, wanted: int) -> int:
        """How many of `wanted` threads the next decode gets."""
        if not self.adaptive or wanted <= 1:
            return wanted
        now = self.clock()
        last = self._last
        if last is None or now - last[0] >= self.interval_s:
            self.sample(now)
        return max(1, min(wanted, self.cores - self.reserved))

    def sample(self, now: float | None = None) -> None:
        """Take a reading and update `other` and `reserved`."""
        now = self.clock() if now is None else now
        reading = self.reader()
        if reading is None:
            self.adaptive = False
            return
        with self._lock:
            last = self._last
            self._last = (now, *reading)
            if last is None or now <= last[0]:
                return
            elapsed = (now - last[0]) * self.tick_hz
            busy = reading[0] - last[1]
            ours = reading[1] - last[2]
            other = min(float(self.cores), max(0.0, (busy - ours) / elapsed))
            self.other = 0.5 * self.other + 0.5 * other
            self.reserved = min(self.cores - 1, math.floor(self.other + 1.0 - ROUND_AT))


governor = ThreadGovernor()


def set_adaptive(on: bool) -> None:
    """Adaptive threads on (the default) or off (every decode gets its context's n_threads)."""
    governor.adaptive = bool(on) and read_proc() is not None


def decode(C, ctx, batch, wanted: tuple[int, int], now: list) -> int:
    """llama_decode(ctx, batch) on a compute thread, with the threads and the priority
    the governor picks; `now` is the context's current (threads, threads_batch), updated."""
    from tryll_fast.engines.llama import compute
    n, low = governor.plan(wanted[0])
    nb = governor.threads(wanted[1])
    if (n, nb) != tuple(now):
        C.llama_set_n_threads(ctx, n, nb)
        now[:] = [n, nb]
    if not low:
        return compute.run(C.llama_decode, ctx, batch)
    t0 = time.perf_counter()
    c0 = compute.low_cpu_s()
    rc = compute.run(C.llama_decode, ctx, batch, low=True)
    c1 = compute.low_cpu_s()
    if c0 is not None and c1 is not None:
        governor.low_ran(time.perf_counter() - t0, c1 - c0)
    return rc


def after_decode(fn, *args):
    """fn(*args) (a sampler over the vocabulary: about a millisecond for 150 000 tokens)
    where the last decode ran: on the low thread while the machine is busy, so it too
    yields to the game; directly otherwise."""
    if not governor.low_active:
        return fn(*args)
    from tryll_fast.engines.llama import compute
    return compute.run(fn, *args, low=True)
