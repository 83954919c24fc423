"""Rounds in alternating pairs, for the benchmarks that gate a ratio of two sides run in
the same process: each pair runs every side once, back to back, and the order flips from
one pair to the next (A B, B A, A B, ...). On a shared 2-core VM the machine's speed drifts
within a minute and anything else running slows a llama_decode many times over, so a pair
sees the same machine on both sides and the drift moves both instead of one."""
import time
from collections.abc import Callable, Mapping


def timed(fn: Callable[[], object]) -> Callable[[], float]:
    """fn as a run for alternated(): it returns its own duration in seconds."""
    def run() -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return run


def alternated(runs: Mapping[str, Callable[[], float]], pairs: int) -> dict[str, list[float]]:
    """`pairs` rounds of every run (each returns the seconds it measured), in the order of
    `runs` in even pairs and reversed in odd ones."""
    sides = list(runs)
    times: dict[str, list[float]] = {side: [] for side in sides}
    for r in range(pairs):
        for side in (sides if r % 2 == 0 else sides[::-1]):
            times[side].append(runs[side]())
    return times
