"""Argument checks shared by every stage: one line at each call site, one message style.

What this teaches: nothing about paging; it keeps the algorithm files about their algorithms.
Every check raises *before* anything changes, and its message names the argument, the value and
what was expected (``block_size=0 is out of range: expected >= 1``), so a caller can fix the
call without reading the code. Integers: Python ints and NumPy integers are accepted, bools and
floats are refused (``int(2.7)`` would silently become 2). Ranges are half-open, ``[low, high)``,
like ``range``.

It also defines ``OutOfBlocksError``, the one error every stage raises when KV cache memory runs
out (the contiguous cache's ``OutOfMemoryError`` is a subclass), so a scheduler catches one type.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Hashable, Iterable

import numpy as np


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the number of blocks of ``b`` slots that ``a`` tokens need."""
    return -(-a // b)


def check_int(name: str, value: object, *, low: int | None = None,
              high: int | None = None) -> int:
    """``value`` as a Python int in ``[low, high)``; TypeError or ValueError naming ``name``."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}={value!r} must be an integer, not a bool")
    try:
        v = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"{name}={value!r} must be an integer, "
                        f"got {type(value).__name__}") from None
    if (low is not None and v < low) or (high is not None and v >= high):
        if high is None:
            want = f">= {low}"
        elif low is None:
            want = f"< {high}"
        else:
            want = f"in [{low}, {high})"
        raise ValueError(f"{name}={v} is out of range: expected {want}")
    return v


def check_float(name: str, value: object, *, low: float | None = None,
                positive: bool = False) -> float:
    """``value`` as a finite Python float (ints and NumPy floats accepted, bools refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                     np.floating)):
        raise TypeError(f"{name}={value!r} must be a number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name}={v} must be finite")
    if positive and v <= 0:
        raise ValueError(f"{name}={v} is out of range: expected > 0")
    if low is not None and v < low:
        raise ValueError(f"{name}={v} is out of range: expected >= {low}")
    return v


def check_token_ids(name: str, token_ids: Iterable[int]) -> list[int]:
    """A fresh, non-empty list of Python int token ids (>= 0); an error naming ``name``."""
    if isinstance(token_ids, (str, bytes)):
        raise TypeError(f"{name}={token_ids!r:.60} must be a sequence of integer token ids, "
                        "not a string")
    try:
        tokens = list(token_ids)
    except TypeError:
        raise TypeError(f"{name}={token_ids!r:.60} must be a sequence of integer token "
                        "ids") from None
    if not tokens:
        raise ValueError(f"{name} is empty: a sequence needs at least one token")
    for i, t in enumerate(tokens):
        if type(t) is not int or t < 0:
            tokens[i] = check_int(f"{name}[{i}]", t, low=0)
    return tokens


def check_seq_id(name: str, seq_id: object) -> Hashable:
    """A sequence id must be hashable (it keys the manager's tables)."""
    try:
        hash(seq_id)
    except TypeError:
        raise TypeError(f"{name}={seq_id!r:.60} must be hashable "
                        f"(got {type(seq_id).__name__})") from None
    return seq_id


def check_callable(name: str, fn: object) -> Callable:
    if not callable(fn):
        raise TypeError(f"{name}={fn!r:.60} must be callable, got {type(fn).__name__}")
    return fn


def check_choice(name: str, value: object, choices: Iterable[object]) -> object:
    options = list(choices)
    if value not in options:
        raise ValueError(f"{name}={value!r} is not one of {options}")
    return value


class OutOfBlocksError(RuntimeError):
    """Not enough free physical blocks. ``needed`` and ``free`` say by how much.

    Whoever raises it must leave its state exactly as before the call, so that a scheduler can
    catch it, preempt someone (swap or recompute) and try again."""

    def __init__(self, needed: int, free: int, what: str = "") -> None:
        self.needed = needed
        self.free = free
        where = f" {what}" if what else ""
        super().__init__(f"out of KV cache blocks{where}: needed {needed} block(s) "
                         f"but only {free} free")
