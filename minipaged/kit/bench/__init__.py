"""Measured speed, printed as medians and ratios: ``minipaged bench NAME``.

Speed lives here, never in timed asserts inside tests: a benchmark prints what it measured on
this machine (the median of several repeats, and the ratio to a baseline measured in the same
run), and the reader judges.

``--quick`` (allocator, attention, kernel, simulate) is a small configuration for a smoke test:
it gives smaller defaults to the options left unset. An option given on the command line keeps
its value, with or without --quick, and is checked like any other.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from minipaged._checks import cdiv


def fill_unset(args, defaults: dict, quick: dict) -> None:
    """Give each option the command line left unset (None) its default: ``quick``'s under
    --quick where it has one, else ``defaults``'. A value the user typed is kept (the parser
    has checked it, and the runner checks it against the others), so --quick never replaces
    what was asked for. ``args.filled`` records where each filled value came from, for
    ``flag_value``."""
    args.filled = {}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            quick_run = getattr(args, "quick", False) and name in quick  # bench generate: none
            setattr(args, name, quick[name] if quick_run else value)
            args.filled[name] = "--quick's default" if quick_run else "the default"


def flag_value(args, name: str, value=None) -> str:
    """``--name=value`` (or ``=value``, one of a list's) as a message names it; a value the user
    did not type says where it came from (``--kv-heads=2 (--quick's default)``), so the message
    never blames a flag unasked."""
    text = f"--{name.replace('_', '-')}={getattr(args, name) if value is None else value}"
    origin = getattr(args, "filled", {}).get(name)
    return f"{text} ({origin})" if origin else text


def medians(candidates: dict[str, Callable[[], object]], *, repeats: int) -> dict[str, float]:
    """Median wall-clock seconds of each ``fn()`` over ``repeats`` runs, after one warm-up run.

    The candidates run in turn (round-robin), so load from other processes that comes and goes
    hits each alike instead of whichever one happened to run during it; and the median, not the
    mean, so that one disturbed run does not move the figure."""
    for fn in candidates.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(repeats):
        for name, fn in candidates.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def median_time(fn: Callable[[], object], *, repeats: int) -> float:
    """``medians`` of one function."""
    return medians({"": fn}, repeats=repeats)[""]


def decode_case(rng, S: int, H: int, Hkv: int, D: int, BS: int, Tk: int, dtype, xp=None):
    """A random decode case, every sequence at context Tk, its blocks placed at random over the
    pool (the paged layout): q [S, H, D], key_cache and value_cache [NB, Hkv, BS, D], block
    tables [S, MB] and seq_lens [S]. Made with ``xp``: NumPy, or CuPy so that gigabytes of K/V
    are drawn on the device."""
    xp = xp or np
    MB = cdiv(Tk, BS)

    def normal(shape):
        if xp is np:
            return rng.standard_normal(shape, dtype=np.float32).astype(dtype)
        return xp.random.standard_normal(shape, dtype=xp.float32).astype(dtype)

    q = normal((S, H, D))
    key_cache, value_cache = normal((S * MB, Hkv, BS, D)), normal((S * MB, Hkv, BS, D))
    tables = xp.asarray(rng.permutation(S * MB).astype(np.int32).reshape(S, MB))
    return q, key_cache, value_cache, tables, xp.asarray(np.full(S, Tk, np.int32))
