"""Every llama.cpp decode in the process runs on one compute thread (engines/llama/compute.py),
so the process holds one OpenMP team however many contexts decode from however many
threads. Counted in a fresh interpreter (this one may hold teams of earlier tests): the
OS threads that are not Python threads, and were not there before the first decode, are
libgomp's workers."""
import subprocess
import sys
import textwrap
import threading

import pytest

from tryll_fast.engines.llama import compute

pytestmark = pytest.mark.model

SCRIPT = textwrap.dedent("""
    import os, sys, threading
    from tryll_fast.engines.llama import compute
    from tryll_fast.engines.llama import LlamaModel
    from tryll_fast.engines.llama.context import LlamaContext
    from tryll_fast.engines.llama.embeddings import Embedder

    from tryll_fast.engines.llama import cpu_share
    cpu_share.set_adaptive(False)      # whatever else this machine runs: n_threads=2 teams
    if sys.argv[3] == "direct":        # what the server did before compute.py
        compute.run = lambda fn, *args: fn(*args)
    model = LlamaModel(sys.argv[1])
    ctx = LlamaContext(model, n_ctx=64, n_seq_max=1, n_batch=32, n_threads=2,
                       n_threads_batch=2)
    embedder = Embedder(sys.argv[2], n_threads=2, n_batch=64, max_tokens=32)
    tokens = model.tokenize("The baker of Oakvale sells bread.")
    def native():
        return len(os.listdir("/proc/self/task")) - threading.active_count()

    before = native()                  # threads of their own the libraries started
    hold = threading.Event()
    ready = threading.Barrier(3)

    def work(fn):                      # decode, then stay alive as libgomp's master would
        fn()
        ready.wait()
        hold.wait()

    threads = [threading.Thread(target=work, args=(lambda: ctx.decode([(0, tokens, True)]),)),
               threading.Thread(target=work, args=(lambda: embedder.embed(["bread"]),))]
    for t in threads:
        t.start()
    ready.wait()
    print("NATIVE", native() - before)
    hold.set()
    for t in threads:
        t.join()
""")


def native_threads(model_file, mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model_file("SmolLM2-135M-Instruct")),
         str(model_file("all-MiniLM-L6-v2")), mode],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(next(line.split()[1] for line in out.stdout.splitlines()
                    if line.startswith("NATIVE")))


def test_two_contexts_on_two_threads_share_one_openmp_team(model_file):
    # one team of 2 threads: its master is the compute thread, one worker besides it
    assert native_threads(model_file, "compute") == 1
    # the same decodes run on their callers' threads: a team each
    assert native_threads(model_file, "direct") == 2


def test_run_returns_raises_and_runs_inline_on_the_compute_thread():
    assert compute.run(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ZeroDivisionError):
        compute.run(lambda: 1 / 0)
    assert compute.run(threading.get_ident) == compute.thread_ident() != threading.get_ident()
    # a job that hands itself more work runs it in place instead of waiting on itself
    assert compute.run(lambda: compute.run(threading.get_ident)) == compute.thread_ident()
