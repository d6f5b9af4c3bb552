"""Physical blocks, a free list and a reference count per block.

What this teaches: the bottom layer of a paged KV cache. GPU memory for K/V is cut into
``num_blocks`` equal *physical blocks* of ``block_size`` token slots each (the layout lives in
``cache_ops.py``). This allocator knows nothing about tokens or sequences: it hands out block ids,
takes them back, and counts how many users each block has. The count is what makes sharing
possible later (``kv_cache.py``: fork and copy-on-write; ``prefix_cache.py``: prefix caching).

Paper: vLLM section 4.2 (KV cache manager: "physical KV blocks ... a free block pool") and 4.4
(reference counts for sharing). Read next: ``kv_cache.py``.

Invariants (asserted by tests/test_block_allocator.py and the stateful tests of kv_cache):
    * every block is either free (reference count 0, in the free list exactly once) or in use
      (reference count >= 1, not in the free list);
    * ``num_free_blocks + blocks in use == num_blocks``.

There is no cap on a reference count. (A popular interview answer claims vLLM caps shared
references at 16; neither the paper nor the code does: v0's RefCounter only asserts that a count
never goes below 0. 16 is vLLM's default *block size*.)
"""

from __future__ import annotations

from collections.abc import Iterable

from minipaged._checks import OutOfBlocksError, check_int

__all__ = ["BlockAllocator", "OutOfBlocksError", "check_int"]


class BlockAllocator:
    """A free list of physical block ids plus one reference count per block.

    The free list is a Python list used as a stack: ``allocate`` pops from the end and ``free``
    pushes onto it, both O(1). Which free block comes back does not matter for correctness
    (any block serves any sequence; that is the point of paging), so the cheapest order wins.
    Blocks start in the list in reverse so that a fresh allocator hands out 0, 1, 2, ... which
    keeps lessons and test failures readable.
    """

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = check_int("num_blocks", num_blocks, low=1)
        self._free: list[int] = list(range(self.num_blocks - 1, -1, -1))
        self._ref: list[int] = [0] * self.num_blocks

    # ---- queries ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def ref_count(self, block: int) -> int:
        return self._ref[self._check_block(block)]

    def _check_block(self, block: int) -> int:
        if type(block) is int and 0 <= block < self.num_blocks:  # fast path for the hot loop
            return block
        return check_int("block", block, low=0, high=self.num_blocks)

    # ---- mutations -------------------------------------------------------------------------
    def allocate(self) -> int:
        """A free block with reference count 1. OutOfBlocksError (nothing changed) if none."""
        if not self._free:
            raise OutOfBlocksError(1, 0)
        block = self._free.pop()
        self._ref[block] = 1
        return block

    def allocate_many(self, n: int) -> list[int]:
        """``n`` blocks at once, all or nothing: either all ``n`` come back or none is taken.
        (Same blocks, same order as ``n`` calls of ``allocate``; one slice instead of n pops.)"""
        free = self._free
        if n > len(free):
            raise OutOfBlocksError(n, len(free))
        if n <= 0:
            return []
        blocks = free[-n:]
        del free[-n:]
        blocks.reverse()
        ref = self._ref
        for b in blocks:
            ref[b] = 1
        return blocks

    def incref(self, block: int) -> None:
        """One more user of a block that is in use (fork shares blocks this way).

        Raising on a free block catches a real bug: sharing a block nobody owns would hand out
        memory that the free list may give to someone else at the same time."""
        b = self._check_block(block)
        if self._ref[b] == 0:
            raise ValueError(f"block={b} is free (reference count 0); only a block in use "
                             "can be shared")
        self._ref[b] += 1

    def free(self, block: int) -> None:
        """One user fewer; at reference count 0 the block goes back to the free list.

        Freeing a block that is already free is a double free: refused, or the block would sit
        in the free list twice and later be handed to two sequences."""
        b = self._check_block(block)
        if self._ref[b] == 0:
            raise ValueError(f"block={b} is already free (double free)")
        self._ref[b] -= 1
        if self._ref[b] == 0:
            self._release(b)

    def free_many(self, blocks: Iterable[int]) -> None:
        """``free`` for each block, in order: one call for a whole block table. The ids must
        come from this allocator (a block table does); only double frees are checked here."""
        ref = self._ref
        released = []
        for b in blocks:
            if ref[b] == 0:
                self._release_many(released)
                self.free(b)  # the checked path raises the right error
            ref[b] -= 1
            if ref[b] == 0:
                released.append(b)
        self._release_many(released)

    def _release(self, block: int) -> None:
        """Where a block goes when its last user leaves. ``prefix_cache.py`` overrides this to
        keep blocks that carry a hash in a least-recently-used queue instead."""
        self._free.append(block)

    def _release_many(self, blocks: list[int]) -> None:
        self._free.extend(blocks)

    def check_invariants(self) -> None:
        """Assert the invariants in the module docstring (for tests and debugging; O(NB))."""
        free = self._free
        assert len(set(free)) == len(free), "a block is in the free list twice"
        for b in free:
            assert self._ref[b] == 0, f"free block {b} has reference count {self._ref[b]}"
        in_use = sum(1 for r in self._ref if r > 0)
        assert min(self._ref) >= 0, "negative reference count"
        assert in_use + len(free) == self.num_blocks, "free + used != total"
