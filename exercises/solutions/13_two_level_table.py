"""SPOILER: reference solution of exercise 13 (two-level block table).

Try the exercise first: exercises/13_two_level_table.py, graded by `minipaged check 13`.
"""

from __future__ import annotations

EXERCISE = "13_two_level_table"


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def to_two_level(block_table_row, max_blocks, leaf_size):
    if leaf_size < 1:
        raise ValueError(f"leaf_size={leaf_size} must be >= 1")
    if len(block_table_row) > max_blocks:
        raise ValueError(f"the row holds {len(block_table_row)} blocks > max_blocks={max_blocks}")
    n_leaves = _ceil(len(block_table_row), leaf_size)
    leaves = []
    for i in range(n_leaves):
        leaf = list(block_table_row[i * leaf_size:(i + 1) * leaf_size])
        leaves.append(leaf + [-1] * (leaf_size - len(leaf)))
    directory = [i if i < n_leaves else -1 for i in range(_ceil(max_blocks, leaf_size))]
    return directory, leaves


def lookup(directory, leaves, leaf_size, logical_block):
    if logical_block < 0 or logical_block // leaf_size >= len(directory):
        raise IndexError(f"logical_block={logical_block} is out of range")
    leaf = directory[logical_block // leaf_size]
    if leaf < 0:
        raise IndexError(f"logical_block={logical_block} is not mapped")
    block = leaves[leaf][logical_block % leaf_size]
    if block < 0:
        raise IndexError(f"logical_block={logical_block} is not mapped")
    return block


def flat_table_bytes(max_context, block_size, entry_bytes=4):
    return _ceil(max_context, block_size) * entry_bytes


def two_level_table_bytes(seq_len, max_context, block_size, leaf_size, entry_bytes=4):
    directory = _ceil(_ceil(max_context, block_size), leaf_size)
    leaves = _ceil(_ceil(seq_len, block_size), leaf_size) * leaf_size
    return (directory + leaves) * entry_bytes
