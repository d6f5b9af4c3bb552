"""Measured speed, printed as medians and ratios: ``minipaged bench NAME``.

Speed lives here, never in timed asserts inside tests: a benchmark prints what it measured on
this machine (the median of several repeats, and the ratio to a baseline measured in the same
run), and the reader judges.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_time(fn: Callable[[], object], *, repeats: int = 7, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs, after ``warmup`` runs.

    The median, not the mean: one run disturbed by another process should not move the figure."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
