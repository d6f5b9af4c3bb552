"""Exercise 03: a block allocator, the free list and reference counts behind every block table.

Lesson: lessons/03_*.py (paging).  Check: minipaged check 3

The paged KV cache is a pool of NB physical blocks, numbered 0 .. NB-1. The allocator hands out
free blocks and takes them back. Each block carries a reference count: the number of block-table
entries that point at it. Sharing (fork, prefix caching) raises it; a block returns to the free
list only when its count falls to 0 (vLLM paper section 4.4).

Invariants (the grader checks them after every operation):
- a block is either free (count 0, on the free list) or allocated (count >= 1), never both;
- num_free_blocks + number of allocated blocks == num_blocks;
- allocate() never returns a block that is already allocated;
- a failed call (out of blocks, bad block id) changes nothing: the grader compares every count
  before and after each call that must fail.
"""

from __future__ import annotations

EXERCISE = "03_block_allocator"


class OutOfBlocksError(RuntimeError):
    """Raised by allocate() when no block is free.

    A RuntimeError by minipaged's choice (its own OutOfBlocksError, minipaged/_checks.py, is
    one). vLLM raises a ValueError: v1's BlockPool.get_new_blocks "Cannot get N free blocks
    from the pool" (vllm/v1/core/block_pool.py), v0's allocator "Out of memory! No free blocks
    are available." (vllm/core/block_manager.py, later block_manager_v1.py).
    """


class BlockAllocator:
    def __init__(self, num_blocks: int) -> None:
        """Create a pool of ``num_blocks`` free blocks (ValueError if num_blocks < 1).

        Hint: a Python list used as a stack is a fine free list; keep the counts in a list
        of ints indexed by block id.
        """
        raise NotImplementedError

    @property
    def num_blocks(self) -> int:
        """Total number of physical blocks."""
        raise NotImplementedError

    @property
    def num_free_blocks(self) -> int:
        """Number of blocks with reference count 0."""
        raise NotImplementedError

    def allocate(self) -> int:
        """Take one free block, set its count to 1 and return its id.

        Raises OutOfBlocksError (state unchanged) when none is free.
        """
        raise NotImplementedError

    def incref(self, block: int) -> None:
        """One more table entry points at an allocated ``block``.

        ValueError when block is out of range (block < 0 or block >= num_blocks) or free
        (you cannot share what nobody owns).
        """
        raise NotImplementedError

    def free(self, block: int) -> None:
        """One table entry stops pointing at ``block``: decrement; at 0 it becomes free.

        ValueError when block is out of range (block < 0 or block >= num_blocks) or already
        free (a double free is a bug that would hand one block to two sequences later).
        """
        raise NotImplementedError

    def ref_count(self, block: int) -> int:
        """The block's reference count (ValueError when block < 0 or block >= num_blocks)."""
        raise NotImplementedError
