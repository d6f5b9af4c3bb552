"""Physical blocks, a free list and a reference count per block.

What this teaches: the bottom layer of a paged KV cache (lesson 03). It knows no tokens or
sequences: it hands out block ids, takes them back and counts each block's users, for sharing
later (``sharing/cow.py``). Paper: vLLM sections 4.2 (the free block pool) and 4.4 (reference
counts). Read next: ``paged/block_manager.py``.

Invariants (tests/invariants.py, after every step of tests/test_block_allocator.py): a block is
free (count 0, in the free list once) or in use (count >= 1, not in the list), so free + in use
== ``num_blocks``; a call that raises has changed nothing. No count is capped: vLLM does not cap
sharing at 16 either (v0's RefCounter, vllm/core/block/common.py, only asserts counts >= 0; 16
is the default *block size*).
"""

from __future__ import annotations

from collections.abc import Iterable

from minipaged._checks import SIZE_LIMIT, OutOfBlocksError, check_int

__all__ = ["BlockAllocator", "OutOfBlocksError", "check_int"]


class BlockAllocator:
    """A free list used as a stack, plus one reference count per block. Any block serves any
    sequence (the point of paging), so the simplest order wins; the list starts reversed so that
    a fresh allocator hands out 0, 1, 2, ..., which keeps lessons readable."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = check_int("num_blocks", num_blocks, low=1, high=SIZE_LIMIT)
        self._ref: list[int] = [0] * self.num_blocks
        self._free = list(range(self.num_blocks - 1, -1, -1))

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def ref_count(self, block: int) -> int:
        return self._ref[self._check_block(block)]

    def free_queue(self) -> list[int]:
        """Every free block, next allocated first (a stack here: the last one freed)."""
        return self._free[::-1]

    def _check_block(self, block: object) -> int:
        return check_int("block", block, low=0, high=self.num_blocks)

    def _check_blocks(self, blocks: Iterable[object]) -> list[int]:
        # The ids as a list of ints in [0, NB); an error names the first bad one.
        return [check_int(f"blocks[{i}]", b, low=0, high=self.num_blocks)
                for i, b in enumerate(blocks)]

    def allocate(self) -> int:
        """A free block with reference count 1. OutOfBlocksError (nothing changed) if none."""
        if self.num_free_blocks == 0:
            raise OutOfBlocksError(1, 0)
        block = self._take_free()
        self._ref[block] = 1
        return block

    def allocate_many(self, n: int, what: str = "") -> list[int]:
        """``n`` blocks, all or nothing; ``what`` says what for, in the error."""
        n = check_int("n", n, low=0)
        if n > self.num_free_blocks:
            raise OutOfBlocksError(n, self.num_free_blocks, what)
        return [self.allocate() for _ in range(n)]

    def incref(self, block: int) -> None:
        """One more user of a block that is in use (fork shares blocks this way)."""
        self.incref_many([self._check_block(block)])

    def incref_many(self, blocks: Iterable[int]) -> None:
        """One more user of each, all checked first. A free block is refused: the free list
        could hand it to someone else at the same time."""
        ids = self._check_blocks(blocks)
        for b in ids:
            if self._ref[b] == 0:
                raise ValueError(f"block={b} is free (reference count 0); only a block in use "
                                 "can be shared")
        self.share_blocks(ids)

    def free(self, block: int) -> None:
        """One user fewer; at reference count 0 the block goes back to the free list."""
        self.free_many([self._check_block(block)])

    def free_many(self, blocks: Iterable[int]) -> None:
        """One user fewer for each, in order, all checked first with repeats counted: a double
        free would put a block in the free list twice, for two sequences at once."""
        ids = self._check_blocks(blocks)
        left: dict[int, int] = {}  # block -> its count after the frees so far (a dry run)
        for b in ids:
            left[b] = left.get(b, self._ref[b]) - 1
            if left[b] < 0:
                raise ValueError(f"block={b} is freed {ids.count(b)} time(s) but has reference "
                                 f"count {self._ref[b]} (double free)")
        self.release_blocks(ids)

    # The same, unchecked, for a block manager's own blocks: it passes only ids it holds (its
    # tables' invariant 2), so it skips the checks above. They were a fifth of ``simulate
    # --beam-width 4``, where every step forks, copies and frees; the stateful tests check the
    # invariants after every step instead.
    def share_blocks(self, blocks: Iterable[int]) -> None:
        for b in blocks:
            self._ref[b] += 1

    def release_blocks(self, blocks: Iterable[int]) -> None:
        # Blocks left unused go back to the free list, in order.
        released = []
        for b in blocks:
            self._ref[b] -= 1
            if self._ref[b] == 0:
                released.append(b)
        self._put_free(released)

    # The free list's two operations: what ``sharing/prefix_cache.py`` (an LRU queue) replaces.
    def _take_free(self) -> int:
        return self._free.pop()

    def _put_free(self, blocks: list[int]) -> None:
        self._free.extend(blocks)
