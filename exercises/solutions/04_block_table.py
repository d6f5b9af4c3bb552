"""SPOILER: reference solution of exercise 04 (block tables and slot mapping).

Try the exercise first: exercises/04_block_table.py, graded by `minipaged check 4`.
"""

from __future__ import annotations

import numpy as np

EXERCISE = "04_block_table"


def blocks_needed(num_tokens: int, block_size: int) -> int:
    if num_tokens < 0:
        raise ValueError(f"num_tokens={num_tokens} must be >= 0")
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")
    return -(-num_tokens // block_size)


def slot_for(block_table: list[int], block_size: int, position: int) -> int:
    if not 0 <= position < len(block_table) * block_size:
        raise IndexError(f"position={position} is outside the table's "
                         f"{len(block_table)} blocks of {block_size}")
    return block_table[position // block_size] * block_size + position % block_size


def slot_mapping(block_table: list[int], block_size: int, start: int, end: int) -> np.ndarray:
    if not 0 <= start <= end <= len(block_table) * block_size:
        raise ValueError(f"need 0 <= start={start} <= end={end} <= "
                         f"{len(block_table) * block_size}")
    positions = np.arange(start, end, dtype=np.int64)
    table = np.asarray(block_table, dtype=np.int64)
    return table[positions // block_size] * block_size + positions % block_size


def padded_block_tables(tables: list[list[int]], pad: int = -1) -> np.ndarray:
    mb = max([len(t) for t in tables] + [1])
    out = np.full((len(tables), mb), pad, dtype=np.int32)
    for s, t in enumerate(tables):
        out[s, :len(t)] = t
    return out
