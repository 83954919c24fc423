"""How many threads a decode gets, from what else the machine is doing.

A decode with n threads meets at a barrier after every graph node. On a machine whose
cores are all taken by someone else's threads (a game), one of ours is descheduled at
almost every barrier and the others wait out the scheduler's time slice: beside one busy
thread on 2 cores a 2-thread decode of Qwen2.5-Coder-0.5B went from 21 to 7 tokens a
second and beside two from 21 to 2.8, while a 1-thread decode kept 11.7 and 7.5
(docs/configuration.md, "Sharing the CPU with a game"). So, before a decode, the governor
looks at how much CPU the rest of the machine used lately and leaves that many cores to
it: threads = cores - round(other), at least 1, at most what the context asks for.

While someone else keeps cores busy, a one-thread decode runs on the low-priority compute
thread (_lowthread.pyx: SCHED_IDLE, bound to one CPU), so a game that sleeps part of each
frame gets its core back the moment a thread of it wakes, and the decode uses what the game
leaves (the sampler that follows it too: about a millisecond over a 150 000-token
vocabulary). A game that leaves nothing (every core busy all the time) would starve it:
a decode there that got less than STARVED of its wall time after LOW_WINDOW_S is stopped
through llama.cpp's abort callback (a stopped micro-batch leaves nothing in the
KV cache) and run again at normal priority, and decodes stay there for NORMAL_HOLD_S before
trying the low thread again. The NPC then gets a fair share.

"Other" is the machine's busy time (/proc/stat) less this process's own (/proc/self/stat)
over the last sampling interval, in cores, smoothed over two intervals. Our own spinning
threads count as ours, so the server never backs off from itself. A reading is taken at
most every `interval_s` on the thread that decodes (two small file reads, ~30 us). Where
/proc is absent (not Linux) the governor gives every decode what it asks for.
"""
from __future__ import annotations

import ctypes
import math
import os
import threading
import time
from typing import Callable

__all__ = ["ThreadGovernor", "LowThread", "read_proc", "governor", "low_thread",
           "set_adaptive", "abort_flag", "decode", "sample", "LOW_NICE"]

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# above half a core of someone else's work, one core is left to it
ROUND_AT = 0.5
# the low-priority thread's share of its decodes' wall time below which it is starved
STARVED = 0.25
NORMAL_HOLD_S = 2.0
LOW_WINDOW_S = 0.25
# the low thread's nice value, where the kernel refuses it SCHED_IDLE
LOW_NICE = 19
# Larger batches (a prompt's prefill) decode at normal priority: a starved low thread
# notices the abort flag only at the end of a graph node, and a node over a long batch
# is milliseconds of CPU, seconds at the share it gets beside a busy core.
LOW_MAX_TOKENS = 32
# how often the caller looks at a running low-priority decode
POLL_S = 0.05


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
        """(threads, low priority) for the next decode. Only a one-thread decode goes to
        the low thread: it is bound to one CPU, and a team started there would share it."""
        n = self.threads(wanted)
        low = (self.adaptive and self.reserved > 0 and n == 1
               and self.clock() >= self._normal_until)
        self.low_active = low
        return n, low

    def starved(self) -> None:
        """The low thread could not get CPU time: normal priority for NORMAL_HOLD_S."""
        with self._lock:
            self._low_wall = self._low_cpu = 0.0
            self._normal_until = self.clock() + NORMAL_HOLD_S
            self.low_active = False

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
                self.low_active = False

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


class LowThread:
    """The low-priority compute thread (_lowthread.pyx): SCHED_IDLE (nice LOW_NICE where the
    kernel refuses that class), bound to the last CPU this process may use. `available` is
    False where the module is missing, the platform lacks the calls, or llama_cpp's
    llama_batch is not the layout the thread copies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()     # one job at a time, submit to result
        self._mod = None
        self._started = False
        self.idle_class = False
        try:
            from tryll_fast.engines.llama import _lowthread
            import llama_cpp.llama_cpp as C
        except ImportError:
            return
        fields = [(n, getattr(C.llama_batch, n).offset) for n, _ in C.llama_batch._fields_]
        ptr = ctypes.sizeof(ctypes.c_void_p)
        if (ctypes.sizeof(C.llama_batch) == _lowthread.BATCH_BYTES == 7 * ptr
                and fields == [(n, i * ptr) for i, n in enumerate(
                    ("n_tokens", "token", "embd", "pos", "n_seq_id", "seq_id", "logits"))]
                and hasattr(os, "sched_getaffinity")):
            self._mod = _lowthread

    @property
    def available(self) -> bool:
        return self._mod is not None

    def _start(self) -> None:
        if not self._started:
            self.idle_class = self._mod.start(max(os.sched_getaffinity(0)), LOW_NICE)
            self._started = True

    def start(self) -> None:
        """Starts the thread if it has not yet (it then waits, parked, for a job)."""
        with self._lock:
            self._start()

    def native_id(self) -> int:
        """The thread's kernel id (it starts here if it has not yet)."""
        with self._lock:
            self._start()
        return self._mod.native_id()

    def cpu_s(self) -> float | None:
        return self._mod.cpu_seconds()

    def decode(self, C, ctx, batch, abort) -> int | None:
        """llama_decode(ctx, batch) here; None when it was stopped for want of CPU (STARVED
        of its wall time after LOW_WINDOW_S) or the thread is busy with another job."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            self._start()
            mod = self._mod
            abort.value = 0
            t0 = time.perf_counter()
            c0 = mod.cpu_seconds()
            mod.submit_decode(_address(C.llama_decode), _address(ctx), ctypes.addressof(batch))
            while not mod.wait(POLL_S):
                wall = time.perf_counter() - t0
                if wall >= LOW_WINDOW_S and mod.cpu_seconds() - c0 < STARVED * wall:
                    abort.value = 1
                    mod.wait(1e9)
                    abort.value = 0
                    governor.starved()
                    rc = mod.result()
                    # 2: stopped between graph nodes, its micro-batch out of the KV cache
                    return None if rc == 2 else rc
            governor.low_ran(time.perf_counter() - t0, mod.cpu_seconds() - c0)
            return mod.result()
        finally:
            self._lock.release()

    def sample(self, C, chain, ctx, idx: int) -> int | None:
        """llama_sampler_sample here; None when the thread is busy with another job."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            self._start()
            self._mod.submit_sample(_address(C.llama_sampler_sample), _address(chain),
                                    _address(ctx), idx)
            self._mod.wait(1e9)
            return self._mod.result()
        finally:
            self._lock.release()


def _address(p) -> int:
    """A C pointer held by ctypes (an int, a c_void_p, a typed pointer or a function) as
    an int."""
    if isinstance(p, int):
        return p
    if isinstance(p, ctypes.c_void_p):
        return p.value or 0
    return ctypes.cast(p, ctypes.c_void_p).value or 0


low_thread = LowThread()


def abort_flag(C, ctx):
    """Gives `ctx` the C abort callback (_lowthread.pyx) and returns its flag (a ctypes int
    that stops the context's running decode once set), or None without the module.

    The low thread starts here, with the first context, not at the first contended
    decode: the process's threads are settled once a model is loaded (a parked thread
    costs nothing, and one that appears later, under load, reads as a leak)."""
    if not low_thread.available:
        return None
    if governor.adaptive:
        low_thread.start()
    from tryll_fast.engines.llama._lowthread import abort_callback_address
    flag = ctypes.c_int(0)
    C.llama_set_abort_callback(ctx, C.ggml_abort_callback(abort_callback_address()),
                               ctypes.addressof(flag))
    return flag


def decode(C, ctx, batch, wanted: tuple[int, int], now: list, abort=None) -> int:
    """llama_decode(ctx, batch) with the threads and the thread the governor picks; `now` is
    the context's current (threads, threads_batch), updated.

    `abort` (abort_flag's flag, given only for a batch of one micro-batch, so a stopped
    decode leaves nothing in the KV cache) lets a batch of up to LOW_MAX_TOKENS start on the
    low thread: stopped there when the low thread is starved, it runs again at normal
    priority."""
    from tryll_fast.engines.llama import compute
    n, low = governor.plan(wanted[0])
    nb = governor.threads(wanted[1])
    if (n, nb) != tuple(now):
        C.llama_set_n_threads(ctx, n, nb)
        now[:] = [n, nb]
    if low and abort is not None and batch.n_tokens <= LOW_MAX_TOKENS and low_thread.available:
        rc = low_thread.decode(C, ctx, batch, abort)
        if rc is not None:
            return rc
    governor.low_active = False
    return compute.run(C.llama_decode, ctx, batch)


def sample(C, chain, ctx, idx: int) -> int:
    """llama_sampler_sample(chain, ctx, idx) (about a millisecond over a 150 000-token
    vocabulary) where the last decode ran: on the low thread while it decodes there, so
    the sampler too yields to the game; directly otherwise."""
    if governor.low_active:
        token = low_thread.sample(C, chain, ctx, idx)
        if token is not None:
            return token
    return C.llama_sampler_sample(chain, ctx, idx)
