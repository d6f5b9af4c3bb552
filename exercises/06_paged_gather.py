"""Exercise 06: paged attention for decode, by gathering K/V through the block table.

Lesson: lessons/03_*.py (paging).  Check: minipaged check 6

Decode: each of S sequences has one new query token and attends to all of its seq_len cached
tokens (no causal mask is needed: every cached token is in the past).

Shapes:
    query                     [S, H, D]
    key_cache, value_cache    [NB, Hkv, BS, D]
    block_tables              int32 [S, MB], padded with -1 past each sequence's blocks
    seq_lens                  int32 [S]
    output                    [S, H, D]

GQA: query head h reads KV head h // (H // Hkv). Scale: 1 / sqrt(D) unless given.

Invariant (the reason paging is safe): the output depends only on the tokens a sequence owns.
Entries of block_tables past ceil(seq_len / BS), slots past seq_len in the last block, and free
blocks may hold anything (the grader puts junk ids in those entries and NaN in those slots)
without changing any output.
"""

from __future__ import annotations

import numpy as np

EXERCISE = "06_paged_gather"


def gather_kv(key_cache: np.ndarray, value_cache: np.ndarray, block_table_row: np.ndarray,
              seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Return the sequence's logical K and V, each [seq_len, Hkv, D], in token order.

    Task: take the first ceil(seq_len / BS) blocks of the row, put them end to end, and keep
    the first seq_len tokens.
    Errors: ValueError when seq_len < 1, or a needed table entry is outside [0, NB).
    Hint: key_cache[blocks] is [n, Hkv, BS, D]; transpose to [n, BS, Hkv, D], reshape to
    [n * BS, Hkv, D], slice [:seq_len].
    """
    raise NotImplementedError


def paged_attention_gather(query: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray,
                           block_tables: np.ndarray, seq_lens: np.ndarray,
                           scale: float | None = None) -> np.ndarray:
    """Decode attention through block tables: out [S, H, D] in query's dtype.

    Task: for each sequence s, gather its K/V, then softmax(q . k * scale) @ v per head.
    Invariants: equal (to rounding) to dense attention over the gathered K/V, large logits
    too (the grader tries scale=1000); NaN in unused entries never reaches the output;
    every argument is left as it was (scale it into a new array, not the caller's query).
    Errors: ValueError when H is not a multiple of Hkv or D differs between query and cache.
    Hint: for GQA, np.repeat(k, H // Hkv, axis=1) turns [Tk, Hkv, D] into [Tk, H, D]; use
    np.einsum("hd,thd->ht", q_s, k) for the logits; subtract the row max before np.exp.
    """
    raise NotImplementedError
