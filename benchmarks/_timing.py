"""Side-by-side timing shared by the benchmarks: every contender runs once per repeat, in turn.

    from _timing import interleaved   # a script in benchmarks/ has this folder on sys.path
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable


def no_sync() -> None:
    """Nothing to wait for (CPU work finishes before the call returns)."""


def rounds(contenders: dict[str, Callable[[], object]], repeats: int, sync: Callable[[], None] = no_sync,
           order: str = "same", collect: bool = False) -> dict[str, list[float]]:
    """Seconds of each contender in each of ``repeats`` rounds, after one warm-up call of each.

    Args:
        contenders: name -> a call to time.
        repeats: rounds; each round runs every contender once.
        sync: waits for queued device work; called around every timed call.
        order: ``"same"`` (the given order every round), ``"flip"`` (reversed every other round)
            or ``"rotate"`` (round ``i`` starts at the ``i``-th contender).
        collect: run the garbage collector before each timed call.
    """
    names = list(contenders)
    times: dict[str, list[float]] = {n: [] for n in names}
    for fn in contenders.values():
        fn()
    sync()
    for i in range(repeats):
        if order == "flip":
            turn = names if i % 2 == 0 else names[::-1]
        elif order == "rotate":
            turn = names[i % len(names):] + names[:i % len(names)]
        else:
            turn = names
        for name in turn:
            if collect:
                gc.collect()
            sync()
            t = time.perf_counter()
            result = contenders[name]()
            sync()
            times[name].append(time.perf_counter() - t)
            del result
    return times


def interleaved(contenders: dict[str, Callable[[], object]], repeats: int, sync: Callable[[], None] = no_sync,
                order: str = "same", collect: bool = False) -> dict[str, float]:
    """Median seconds of each contender over :func:`rounds`."""
    return {k: statistics.median(v) for k, v in rounds(contenders, repeats, sync, order, collect).items()}


def paired_ratios(times: dict[str, list[float]], base: str = "plain") -> dict[str, float]:
    """Per contender, the median over rounds of its time over ``base``'s time in the same round."""
    ref = times[base]
    return {n: statistics.median(t / b for t, b in zip(v, ref, strict=True)) for n, v in times.items()}
