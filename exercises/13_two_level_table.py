"""Exercise 13: a two-level block table for very long contexts, measured against the flat one.

Lesson: lessons/07_*.py (block size and block-table memory).  Check: minipaged check 13

A common interview follow-up asks how much the block table costs at 128K tokens and suggests
a multi-level table, like an operating system's page table. Measure it.

Flat table: a batch's tables are one int32 array padded to MB = ceil(max_context / BS)
entries per sequence, whatever each sequence's true length.
Two-level table: the flat row is cut into leaves of ``leaf_size`` entries. A sequence keeps a
directory of ceil(MB / leaf_size) entries (fixed size, so kernels can index it) and only the
leaves it uses; directory[i] is the index of leaf i in the sequence's list of leaves, or -1.
A lookup costs one extra memory read (the directory) per block.
"""

from __future__ import annotations

EXERCISE = "13_two_level_table"


def to_two_level(block_table_row: list[int], max_blocks: int,
                 leaf_size: int) -> tuple[list[int], list[list[int]]]:
    """Split a sequence's table (its used entries only) into (directory, leaves).

    directory: ceil(max_blocks / leaf_size) entries; entry i = i for each used leaf, -1 after.
    leaves: ceil(len(block_table_row) / leaf_size) lists of exactly leaf_size entries, the
    last padded with -1.
    Errors: ValueError when len(block_table_row) > max_blocks or leaf_size < 1.
    """
    raise NotImplementedError


def lookup(directory: list[int], leaves: list[list[int]], leaf_size: int,
           logical_block: int) -> int:
    """Physical block of a logical block: leaves[directory[i // leaf_size]][i % leaf_size].

    Errors: IndexError (or ValueError) when the logical block is not mapped (its directory
    entry or leaf entry is -1, or it is out of range).
    """
    raise NotImplementedError


def flat_table_bytes(max_context: int, block_size: int, entry_bytes: int = 4) -> int:
    """Bytes of one sequence's padded flat row: ceil(max_context / BS) * entry_bytes."""
    raise NotImplementedError


def two_level_table_bytes(seq_len: int, max_context: int, block_size: int, leaf_size: int,
                          entry_bytes: int = 4) -> int:
    """Bytes of one sequence's two-level table: the full directory plus its used leaves.

    directory entries = ceil(ceil(max_context / BS) / leaf_size)
    leaf entries      = ceil(ceil(seq_len / BS) / leaf_size) * leaf_size
    """
    raise NotImplementedError
