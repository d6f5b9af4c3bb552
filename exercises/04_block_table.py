"""Exercise 04: block tables and slot mapping.

Lesson: lessons/03_*.py (paging).  Check: minipaged check 4

A sequence's block table maps logical block i (token positions i*BS .. i*BS+BS-1) to a physical
block id. The slot of token position p is where its K/V live in the pool:

    slot = block_table[p // BS] * BS + p % BS          (vLLM's slot_mapping)

Five words that must never blur: token position (p), logical block (p // BS), physical block
(block_table[p // BS]), offset in the block (p % BS) and slot (the flat index above).

minipaged's kernels take the tables of a whole batch as one int32 array [S, MB], padded with -1
past each sequence's last block (the kernels never read past a sequence's length, so the value
is a convention; vLLM v1 keeps one persistent zero-filled table, vllm/v1/worker/block_table.py).
"""

from __future__ import annotations

import numpy as np

EXERCISE = "04_block_table"


def blocks_needed(num_tokens: int, block_size: int) -> int:
    """Blocks a sequence of ``num_tokens`` tokens occupies: ceil(num_tokens / block_size).

    Errors: ValueError when num_tokens < 0 or block_size < 1.
    Hint: -(-a // b) is ceil(a / b) in integers.
    """
    raise NotImplementedError


def slot_for(block_table: list[int], block_size: int, position: int) -> int:
    """The slot of one token position.

    Errors: IndexError (or ValueError) when ``position`` lies beyond the table's blocks or is
    negative; never a slot from someone else's block.
    """
    raise NotImplementedError


def slot_mapping(block_table: list[int], block_size: int, start: int, end: int) -> np.ndarray:
    """Slots of positions start .. end-1 as an int64 array [end - start], with no Python loop
    over tokens.

    Errors: ValueError when not 0 <= start <= end <= len(block_table) * block_size.
    Hint: positions = np.arange(start, end); index the table with positions // block_size.
    """
    raise NotImplementedError


def padded_block_tables(tables: list[list[int]], pad: int = -1) -> np.ndarray:
    """Stack ragged tables into one int32 array [S, MB] with MB = the longest table (at least
    1), filling the rest with ``pad``.

    Invariants: row s starts with tables[s] exactly; ``tables`` is left as it was.
    """
    raise NotImplementedError
