"""The thread governor (engines/llama/cpu_share.py): threads and priority per decode from
the machine's load, on recorded /proc readings and on this machine's own."""
import os
import subprocess
import threading
import time

import pytest

from tryll_fast.engines.llama import cpu_share
from tryll_fast.engines.llama.cpu_share import STARVED, ThreadGovernor, read_proc


class Recorded:
    """/proc readings fed one by one: (machine busy jiffies, our jiffies) after each
    interval, built from how many cores the others and we kept busy."""

    def __init__(self, hz=100):
        self.busy = self.ours = 0
        self.hz = hz
        self.now = 0.0

    def advance(self, seconds, other_cores, our_cores):
        self.now += seconds
        self.busy += round((other_cores + our_cores) * seconds * self.hz)
        self.ours += round(our_cores * seconds * self.hz)

    def read(self):
        return self.busy, self.ours


def governor(rec, cores=2):
    return ThreadGovernor(cores=cores, interval_s=0.25, reader=rec.read,
                          clock=lambda: rec.now, tick_hz=rec.hz)


def settle(gov, rec, other, ours, steps=6, wanted=2):
    for _ in range(steps):
        rec.advance(0.25, other, ours)
        n = gov.threads(wanted)
    return n


def test_an_idle_machine_gets_every_thread():
    rec = Recorded()
    gov = governor(rec)
    assert settle(gov, rec, other=0.0, ours=2.0) == 2
    assert gov.plan(2) == (2, False)
    # our own threads spinning at a barrier are ours, not someone else's
    assert settle(gov, rec, other=0.2, ours=2.0) == 2


@pytest.mark.parametrize("other", [0.7, 1.0, 1.4, 2.0])
def test_a_busy_machine_leaves_the_cores_the_others_use(other):
    rec = Recorded()
    gov = governor(rec)
    assert settle(gov, rec, other=other, ours=1.0) == 1
    assert gov.reserved == 1                  # never all of them: a decode needs one
    assert gov.plan(2) == (1, True)           # and the low-priority thread
    assert gov.low_active


def test_four_cores_beside_one_busy_thread_keep_three():
    rec = Recorded()
    gov = governor(rec, cores=4)
    assert settle(gov, rec, other=1.0, ours=3.0, wanted=4) == 3
    # a team of three stays on the normal thread: the low one is bound to one CPU
    assert gov.plan(4) == (3, False)
    assert settle(gov, rec, other=0.0, ours=4.0, wanted=4) == 4   # the game stopped


def test_a_starved_low_thread_goes_back_to_normal_priority_for_a_while():
    rec = Recorded()
    gov = governor(rec)
    settle(gov, rec, other=2.0, ours=0.1)
    gov.low_ran(0.3, 0.3 * STARVED / 2)       # it ran a twentieth of the time
    assert gov.plan(2) == (1, False)
    rec.advance(2.5, 2.0, 0.7)
    assert gov.plan(2) == (1, True)           # tried again later
    gov.low_ran(0.3, 0.25)                    # the game leaves it room: it stays low
    assert gov.plan(2) == (1, True)


def test_off_or_one_thread_is_left_alone():
    rec = Recorded()
    gov = governor(rec)
    gov.adaptive = False
    assert settle(gov, rec, other=2.0, ours=1.0) == 2
    assert gov.plan(2) == (2, False)
    gov.adaptive = True
    assert gov.threads(1) == 1


def test_no_proc_means_fixed_threads():
    gov = ThreadGovernor(cores=2, reader=lambda: None)
    assert gov.threads(2) == 2
    assert not gov.adaptive


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="Linux /proc")
def test_this_machine_sees_a_busy_process_as_someone_else():
    gov = ThreadGovernor(interval_s=0.0)
    assert read_proc() is not None
    gov.sample()
    hog = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    try:
        for _ in range(6):
            time.sleep(0.3)
            gov.sample()
        assert gov.other > 0.6, gov.other
        assert gov.reserved >= 1              # the next decode leaves it a core
    finally:
        hog.kill()
        hog.wait()


def test_the_low_thread_runs_below_normal_priority_on_one_cpu():
    low = cpu_share.low_thread
    assert low.available
    tid = low.native_id()
    assert tid not in (0, threading.get_native_id())
    assert os.sched_getscheduler(tid) == os.SCHED_IDLE       # granted without privileges
    assert low.idle_class
    assert os.getpriority(os.PRIO_PROCESS, tid) == cpu_share.LOW_NICE
    assert os.sched_getaffinity(tid) == {max(os.sched_getaffinity(0))}
    assert low.cpu_s() is not None


@pytest.mark.model
def test_the_sampler_follows_the_decode_onto_the_low_thread(smollm2_model, monkeypatch):
    # the same token on the low thread as on this one, and the thread's CPU clock moves
    import llama_cpp.llama_cpp as C
    from tryll_fast.engines.llama.context import LlamaContext
    from tryll_fast.engines.llama.sampling import SamplerChain
    from tryll_fast.engines.roles import SamplingParams
    ctx = LlamaContext(smollm2_model, n_ctx=256, n_seq_max=1, n_batch=64)
    chain = SamplerChain(smollm2_model, SamplingParams(top_k=40, top_p=0.9))
    try:
        i = ctx.decode([(0, smollm2_model.tokenize(lines(1)), True)])[0]
        here = C.llama_sampler_sample(chain.handle, ctx._ctx, i)
        monkeypatch.setattr(cpu_share.governor, "low_active", True)
        assert cpu_share.sample(C, chain.handle, ctx._ctx, i) == here
        # the thread takes one job at a time and answers None while another test's engine
        # still holds it: wait for it, bounded, so the clock below is this job's
        deadline = time.monotonic() + 60
        while True:
            before = cpu_share.low_thread.cpu_s() or 0.0
            token = cpu_share.low_thread.sample(C, chain.handle, ctx._ctx, i)
            if token is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert token == here
        assert cpu_share.low_thread.cpu_s() > before
    finally:
        chain.free()
        ctx.close()


def lines(n):
    return " ".join(f"Line {i}: the miller grinds rye by the light of the moon." for i in range(n))


def two_step_logits(model, toks, stop_first=False):
    """Logits of the last token, decoded after the others; `stop_first`: a decode of it is
    stopped through the abort flag first."""
    import llama_cpp.llama_cpp as C
    from tryll_fast.engines.llama.context import LlamaContext
    ctx = LlamaContext(model, n_ctx=512, n_seq_max=1, n_batch=256)
    try:
        ctx.decode([(0, toks[:-1], False)])
        if stop_first:
            assert ctx._abort is not None
            ctx._abort.value = 1
            last = (C.llama_token * 1)(toks[-1])
            assert C.llama_decode(ctx._ctx, C.llama_batch_get_one(last, 1)) == 2
            ctx._abort.value = 0
            assert ctx.seq_pos_max(0) == len(toks) - 2      # nothing of it was kept
        return ctx.logits(ctx.decode([(0, toks[-1:], True)])[0]).copy()
    finally:
        ctx.close()


@pytest.mark.model
def test_a_stopped_decode_leaves_the_kv_cache_as_it_was(smollm2_model):
    import numpy as np
    toks = smollm2_model.tokenize(lines(3))
    plain = two_step_logits(smollm2_model, toks)
    stopped = two_step_logits(smollm2_model, toks, stop_first=True)
    assert np.allclose(plain, stopped, atol=1e-4)


@pytest.mark.model
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux CPU affinity")
def test_a_starved_low_priority_decode_is_stopped_and_run_again(smollm2_model, monkeypatch):
    # A busy process bound to the low thread's CPU leaves it almost nothing (the kernel
    # decides): the decode there is stopped and runs at normal priority, with the same result.
    import numpy as np
    from tryll_fast.engines.llama.context import LlamaContext
    gov = cpu_share.governor
    monkeypatch.setattr(gov, "_normal_until", 0.0)
    monkeypatch.setattr(gov, "low_active", False)
    toks = smollm2_model.tokenize(lines(6))
    head, tail = toks[:-cpu_share.LOW_MAX_TOKENS], toks[-cpu_share.LOW_MAX_TOKENS:]
    cpu = next(iter(os.sched_getaffinity(cpu_share.low_thread.native_id())))

    def run(before=lambda: None):
        ctx = LlamaContext(smollm2_model, n_ctx=512, n_seq_max=1, n_batch=256, n_threads=1,
                           n_threads_batch=1)
        try:
            ctx.decode([(0, head, False)])
            before()
            return ctx.logits(ctx.decode([(0, tail, True)])[0]).copy()
        finally:
            ctx.close()
    reference = run()
    hog = subprocess.Popen(["sh", "-c", "while :; do :; done"],
                           preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    t0 = []
    try:
        time.sleep(0.3)
        # the tail goes to the low thread: the head (a long batch) never does
        starved = run(lambda: (monkeypatch.setattr(gov, "plan", lambda wanted: (1, True)),
                               t0.append(time.monotonic())))
    finally:
        hog.kill()
        hog.wait()
    assert gov._normal_until > t0[0]          # it was stopped, and normal priority holds
    assert not gov.low_active                 # the sampler stays off the low thread too
    assert np.allclose(reference, starved, atol=1e-4)
