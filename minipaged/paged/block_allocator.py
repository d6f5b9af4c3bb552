"""Physical blocks, a free list and a reference count per block.

What this teaches: the bottom layer of a paged KV cache. GPU memory for K/V is cut into
``num_blocks`` equal *physical blocks* of ``block_size`` token slots each (the layout lives in
``cache_ops.py``). This allocator knows nothing about tokens or sequences: it hands out block ids,
takes them back, and counts how many users each block has. The count is what makes sharing
possible later (``sharing/cow.py``: fork and copy-on-write; ``sharing/prefix_cache.py``: prefix
caching, which also replaces the free list by a queue in eviction order).

Paper: vLLM section 4.2 (KV cache manager: "physical KV blocks ... a free block pool") and 4.4
(reference counts for sharing). Read next: ``paged/block_manager.py``.

Invariants (``check_invariants`` asserts them; tests/test_block_allocator.py runs it after every
step of a random walk):
    * every block is either free (reference count 0, in the free list exactly once) or in use
      (reference count >= 1, not in the free list);
    * ``num_free_blocks + blocks in use == num_blocks``;
    * a call that raises has changed nothing.

There is no cap on a reference count. (A popular interview answer claims vLLM caps shared
references at 16; neither the paper nor the code does: v0's RefCounter only asserts that a count
never goes below 0. 16 is vLLM's default *block size*.)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from minipaged._checks import OutOfBlocksError, check_int

__all__ = ["BlockAllocator", "OutOfBlocksError", "check_int"]


class BlockAllocator:
    """A free list of physical block ids plus one reference count per block.

    The free list is a Python list used as a stack: ``allocate`` pops from the end and freeing
    pushes onto it. Which free block comes back does not matter for correctness (any block
    serves any sequence; that is the point of paging), so the simplest order wins. Blocks start
    in the list in reverse so that a fresh allocator hands out 0, 1, 2, ... which keeps lessons
    and test failures readable.
    """

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = check_int("num_blocks", num_blocks, low=1)
        self._ref: list[int] = [0] * self.num_blocks
        self._free = list(range(self.num_blocks - 1, -1, -1))

    # ---- queries ---------------------------------------------------------------------------
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
        """The ids as a list of ints in [0, NB); an error names the first bad one. (A whole
        block table is checked on every free and fork: one pass when all are plain ints in
        range, which they are unless a caller made a mistake.)"""
        ids = list(blocks)
        if all(type(b) is int and 0 <= b < self.num_blocks for b in ids):
            return ids
        return [check_int(f"blocks[{i}]", b, low=0, high=self.num_blocks)
                for i, b in enumerate(ids)]

    # ---- mutations -------------------------------------------------------------------------
    def allocate(self) -> int:
        """A free block with reference count 1. OutOfBlocksError (nothing changed) if none."""
        if self.num_free_blocks == 0:
            raise OutOfBlocksError(1, 0)
        block = self._take_free()
        self._ref[block] = 1
        return block

    def allocate_many(self, n: int) -> list[int]:
        """``n`` blocks, all or nothing: either all ``n`` come back or none is taken."""
        n = check_int("n", n, low=0)
        if n > self.num_free_blocks:
            raise OutOfBlocksError(n, self.num_free_blocks)
        return [self.allocate() for _ in range(n)]

    def incref(self, block: int) -> None:
        """One more user of a block that is in use (fork shares blocks this way)."""
        self.incref_many([self._check_block(block)])

    def incref_many(self, blocks: Iterable[int]) -> None:
        """One more user of each block, all checked first (one call for a whole block table).

        Raising on a free block catches a real bug: sharing a block nobody owns would hand out
        memory that the free list may give to someone else at the same time."""
        ids = self._check_blocks(blocks)
        for b in ids:
            if self._ref[b] == 0:
                raise ValueError(f"block={b} is free (reference count 0); only a block in use "
                                 "can be shared")
        for b in ids:
            self._ref[b] += 1

    def free(self, block: int) -> None:
        """One user fewer; at reference count 0 the block goes back to the free list."""
        b = self._check_block(block)
        if self._ref[b] == 0:
            raise ValueError(f"block={b} is already free (double free)")
        self._ref[b] -= 1
        if self._ref[b] == 0:
            self._put_free([b])

    def free_many(self, blocks: Iterable[int]) -> None:
        """One user fewer for each block, in order (one call for a whole block table).

        Every id is checked before anything changes: its type and range, and that it has a user
        left to lose, counting repeats within the call. Freeing a block that is already free is
        a double free: refused, or the block would sit in the free list twice and later be
        handed to two sequences at once."""
        ids = self._check_blocks(blocks)
        for b, k in Counter(ids).items():
            if k > self._ref[b]:
                raise ValueError(f"block={b} is freed {k} time(s) but has reference count "
                                 f"{self._ref[b]} (double free)")
        released = []
        for b in ids:
            self._ref[b] -= 1
            if self._ref[b] == 0:
                released.append(b)
        self._put_free(released)

    # The free list's two operations, the only thing a subclass with another free structure
    # (``sharing/prefix_cache.py``: a queue in eviction order) replaces.
    def _take_free(self) -> int:
        return self._free.pop()

    def _put_free(self, blocks: list[int]) -> None:
        self._free.extend(blocks)

    def check_invariants(self) -> None:
        """Assert the invariants in the module docstring (for tests and debugging; O(NB))."""
        free = list(self._free)
        assert len(set(free)) == len(free), "a block is in the free list twice"
        for b in free:
            assert self._ref[b] == 0, f"free block {b} has reference count {self._ref[b]}"
        assert min(self._ref) >= 0, "negative reference count"
        in_use = sum(1 for r in self._ref if r > 0)
        assert in_use + len(free) == self.num_blocks, "free + used != total"
