"""Argument checks shared by every stage: one line at each call site, one message style.

A check raises before anything changes, naming the argument, the value and what was expected
(``block_size=0 is out of range: expected >= 1``). Integers may be Python or NumPy ints, never
bools or floats; ranges are half-open, ``[low, high)``. ``OutOfBlocksError`` is the one error
every stage raises when KV memory runs out, so a scheduler catches one type.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Hashable, Iterable, Mapping, Set

import numpy as np

SIZE_LIMIT = 2**31  # every count and size is < 2**31: block ids are int32 in tables (vLLM's too)


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the number of blocks of ``b`` slots that ``a`` tokens need."""
    return -(-a // b)


def check_int(name: str, value: object, *, low: int | None = None,
              high: int | None = None) -> int:
    """``value`` as a Python int in ``[low, high)``; TypeError or ValueError naming ``name``."""
    if type(value) is int:  # the usual case (a bool is a subclass of int, not int itself)
        v = value
    elif isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}={value!r} must be an integer, not a bool")
    else:
        try:
            v = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            raise TypeError(f"{name}={value!r} must be an integer, "
                            f"got {type(value).__name__}") from None
    if (low is not None and v < low) or (high is not None and v >= high):
        want = (f">= {low}" if high is None else f"< {high}" if low is None
                else f"in [{low}, {high})")
        raise ValueError(f"{name}={v} is out of range: expected {want}")
    return v


def check_bool(name: str, value: object) -> bool:
    """A Python or NumPy bool, never a truthy stand-in (``'no'`` would read as True)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}={value!r:.60} must be a bool, got {type(value).__name__}")
    return bool(value)


def check_float(name: str, value: object, *, low: float | None = None) -> float:
    """``value`` as a finite Python float (ints and NumPy floats accepted, bools refused)."""
    numbers = (int, float, np.integer, np.floating)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers):
        raise TypeError(f"{name}={value!r} must be a number, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v):
        raise ValueError(f"{name}={v} must be finite")
    if low is not None and v < low:
        raise ValueError(f"{name}={v} is out of range: expected >= {low}")
    return v


def check_token_ids(name: str, token_ids: Iterable[int]) -> list[int]:
    """A fresh, non-empty list of Python int token ids (>= 0); an error naming ``name``."""
    if isinstance(token_ids, (str, bytes, Mapping, Set)):  # a dict or a set has no token order
        raise TypeError(f"{name}={token_ids!r:.60} must be a sequence of integer token ids, "
                        f"not a {type(token_ids).__name__}")
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


def check_id_list(name: str, seq_ids: object) -> list:
    """``seq_ids`` as a list; a string or a single id is refused (it is one id, not a list)."""
    if isinstance(seq_ids, (str, bytes)) or not isinstance(seq_ids, Iterable):  # 'a' is one id
        raise TypeError(f"{name}={seq_ids!r:.60} must be a list of seq ids, got "
                        f"{type(seq_ids).__name__}")
    return list(seq_ids)


def check_seq_id(name: str, seq_id: object, *, new: bool = False) -> Hashable:
    """A sequence id must be hashable (it keys the manager's tables). A ``new`` one must also
    equal itself (a NaN could never be looked up again) and not be a bool (True == 1)."""
    try:
        hash(seq_id)
    except TypeError:
        raise TypeError(f"{name}={seq_id!r:.60} must be hashable "
                        f"(got {type(seq_id).__name__})") from None
    if new and isinstance(seq_id, (bool, np.bool_)):
        raise TypeError(f"{name}={seq_id!r} must not be a bool: True == 1 would name sequence 1")
    if new and seq_id != seq_id:
        raise ValueError(f"{name}={seq_id!r:.60} is not equal to itself (a NaN?): no lookup "
                         "could find it again")
    return seq_id


def check_callable(name: str, fn: object) -> Callable:
    if not callable(fn):
        raise TypeError(f"{name}={fn!r:.60} must be callable, got {type(fn).__name__}")
    return fn


def refuse_unused(doing: str, given: list[str], expected: str) -> None:
    """The one wording of a refusal of settings that would be ignored (``given``, if any)."""
    if given:
        raise ValueError(f"{doing}: {', '.join(given)} would not be used; expected {expected}")


def check_choice(name: str, value: object, choices: Iterable[object]) -> object:
    options = list(choices)
    if value not in options:
        raise ValueError(f"{name}={value!r} is not one of {options}")
    return value


SUPPORTED_DTYPES = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))


def check_dtype(name: str, dtype: object) -> np.dtype:
    """One of ``SUPPORTED_DTYPES``; None (NumPy would read float64) and unknown names refused."""
    try:
        dt = None if dtype is None else np.dtype(dtype)
    except (TypeError, ValueError):
        dt = None
    if dt is None or dt not in SUPPORTED_DTYPES:
        raise TypeError(f"{name}={repr(dtype)[:60] if dt is None else dt} is not supported; "
                        "expected one of float16, float32, float64")
    return dt


# ---- attention inputs: queries, block tables and sequence lengths (paged attention) --------
def check_int_array(name: str, x: object, ndim: int) -> np.ndarray:
    try:
        a = np.asarray(x)
    except ValueError:  # NumPy's "inhomogeneous shape" names no argument
        raise ValueError(f"{name}={x!r:.60} has rows of different lengths") from None
    if a.dtype.kind not in "iu" and a.size:  # (an empty list's default dtype is float64)
        raise TypeError(f"{name} must hold integers of any int dtype, got dtype {a.dtype}")
    if a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")
    return a.astype(np.int64, copy=False)


def check_block_tables(block_tables: object, seq_lens: object, S: int, NB: int, BS: int,
                       *, single_row: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Block tables [S, MB] and seq_lens [S] against NB blocks of BS slots, as int64 arrays.
    Only the entries inside a sequence's length are checked (and read): the rest is padding."""
    tname, lname = ("block_table_row", "seq_len") if single_row else ("block_tables", "seq_lens")
    if single_row:
        bt = check_int_array(tname, block_tables, 1)[None, :]
        lens = check_int_array(lname, seq_lens, 0)[None]
    else:
        bt = check_int_array(tname, block_tables, 2)
        lens = check_int_array(lname, seq_lens, 1)
        if bt.shape[0] != S:
            raise ValueError(f"block_tables.shape={bt.shape} has {bt.shape[0]} rows; expected "
                             f"one per sequence, S={S}")
        if lens.shape != (S,):
            raise ValueError(f"seq_lens.shape={lens.shape}; expected [S={S}]")

    def where(s: int, i: int | None = None) -> str:
        if single_row:
            return lname if i is None else f"{tname}[{i}]"
        return f"{lname}[{s}]" if i is None else f"{tname}[{s}, {i}]"

    MB = bt.shape[1]
    for s in np.flatnonzero(lens < 1)[:1]:
        raise ValueError(f"{where(s)}={lens[s]}; every sequence needs at least 1 token")
    for s in np.flatnonzero(lens > MB * BS)[:1]:
        raise ValueError(f"{where(s)}={lens[s]} needs {cdiv(lens[s], BS)} blocks of BS={BS} but "
                         f"{tname} has only MB={MB} entries per row (room for {MB * BS} tokens)")
    used = np.arange(MB)[None, :] < cdiv(lens[:, None], BS)            # [S, MB] entries in use
    bad = used & ((bt < 0) | (bt >= NB))
    if bad.any():
        s, i = (int(x) for x in np.argwhere(bad)[0])
        what = "is padding (-1)" if bt[s, i] == -1 else f"is out of range [0, NB={NB})"
        last = min((i + 1) * BS, lens[s]) - 1
        raise ValueError(f"{where(s, i)} = {bt[s, i]} {what} inside {where(s)}={lens[s]} "
                         f"(logical block {i} holds tokens {i * BS}..{last})")
    return bt, lens


def check_query(query: np.ndarray, key_cache: np.ndarray, rows: int | None,
                rows_name: str) -> int:
    """query [rows, H, D] against key_cache [NB, Hkv, BS, D] (rows None: any); returns G."""
    if not isinstance(query, np.ndarray):
        raise TypeError(f"query must be a numpy array, got {type(query).__name__}")
    if query.ndim != 3:
        raise ValueError(f"query must be [{rows_name}, H, D] (3-D), got shape {query.shape}")
    check_dtype("query.dtype", query.dtype)
    if query.dtype != key_cache.dtype:
        raise TypeError(f"query.dtype={query.dtype} != key_cache.dtype={key_cache.dtype}")
    _, Hkv, _, D = key_cache.shape
    if query.shape[2] != D:
        raise ValueError(f"query.shape[2]={query.shape[2]} is the head size; key_cache has "
                         f"D={D} (key_cache.shape={key_cache.shape})")
    if query.shape[1] < 1 or query.shape[1] % Hkv:
        raise ValueError(f"H={query.shape[1]} query heads is not a multiple of Hkv={Hkv} KV "
                         "heads (key_cache.shape[1])")
    if rows is not None and query.shape[0] != rows:
        raise ValueError(f"query.shape[0]={query.shape[0]}; expected {rows_name}={rows}")
    return query.shape[1] // Hkv


class OutOfBlocksError(RuntimeError):
    """Not enough free physical blocks (``needed``, ``free``). Whoever raises it has changed
    nothing, so a scheduler can catch it, preempt someone and try again."""

    def __init__(self, needed: int, free: int, what: str = "") -> None:
        self.needed, self.free = needed, free
        super().__init__(f"out of KV cache blocks{' ' + what if what else ''}: needed {needed} "
                         f"block(s) but only {free} free")
