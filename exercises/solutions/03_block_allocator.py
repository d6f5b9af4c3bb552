"""SPOILER: reference solution of exercise 03 (block allocator with reference counts).

Try the exercise first: exercises/03_block_allocator.py, graded by `minipaged check 3`.
"""

from __future__ import annotations

EXERCISE = "03_block_allocator"


class OutOfBlocksError(RuntimeError):
    """Raised by allocate() when no block is free."""


class BlockAllocator:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be >= 1")
        self._counts = [0] * num_blocks
        # Reversed so that pop() hands out 0, 1, 2, ... first: easier to read in a demo.
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_blocks(self) -> int:
        return len(self._counts)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def _check(self, block: int) -> None:
        if not 0 <= block < len(self._counts):
            raise ValueError(f"block={block} is out of range [0, {len(self._counts)})")

    def allocate(self) -> int:
        if not self._free:
            raise OutOfBlocksError(f"needed 1 block, 0 of {self.num_blocks} free")
        block = self._free.pop()
        self._counts[block] = 1
        return block

    def incref(self, block: int) -> None:
        self._check(block)
        if self._counts[block] == 0:
            raise ValueError(f"block={block} is free; only allocated blocks can be shared")
        self._counts[block] += 1

    def free(self, block: int) -> None:
        self._check(block)
        if self._counts[block] == 0:
            raise ValueError(f"block={block} is already free (double free)")
        self._counts[block] -= 1
        if self._counts[block] == 0:
            self._free.append(block)

    def ref_count(self, block: int) -> int:
        self._check(block)
        return self._counts[block]
