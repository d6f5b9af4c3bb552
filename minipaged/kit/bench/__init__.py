"""``minipaged bench NAME``: measured speed, printed as medians and ratios.

Speed lives here and never in timed asserts inside tests: a benchmark prints what it measured on
this machine (median of several repeats, and the ratio to a baseline measured in the same run),
and the reader judges. Each benchmark is a module in this package exposing ``register(sub)``.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time
from collections.abc import Callable

BENCH_MODULES: tuple[str, ...] = (
    "minipaged.kit.bench.allocator",
    "minipaged.kit.bench.attention",
    "minipaged.kit.bench.generate",
    "minipaged.kit.bench.kernel",
    "minipaged.kit.bench.simulate",
)


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


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "bench",
        help="measure speed: medians and ratios against a baseline run side by side",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    benches = parser.add_subparsers(dest="bench", metavar="NAME", required=True)
    for name in BENCH_MODULES:
        importlib.import_module(name).register(benches)
