"""The thread governor (engines/llama/cpu_share.py): threads and priority per decode from
the machine's load, on recorded /proc readings and on this machine's own."""
import os
import subprocess
import threading
import time

import pytest

from tryll_fast.engines.llama import compute
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


def test_four_cores_beside_one_busy_thread_keep_three():
    rec = Recorded()
    gov = governor(rec, cores=4)
    assert settle(gov, rec, other=1.0, ours=3.0, wanted=4) == 3
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


def test_the_low_thread_runs_below_normal_priority():
    nice = compute.run(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()),
                       low=True)
    normal = compute.run(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    assert nice == min(19, normal + compute.LOW_NICE) or nice >= normal + 1
    assert compute.low_cpu_s() is not None


def test_the_sampler_follows_the_decode_onto_the_low_thread(monkeypatch):
    low = compute.run(threading.get_native_id, low=True)
    monkeypatch.setattr(cpu_share.governor, "low_active", True)
    assert cpu_share.after_decode(threading.get_native_id) == low
    monkeypatch.setattr(cpu_share.governor, "low_active", False)
    assert cpu_share.after_decode(threading.get_native_id) == threading.get_native_id()
