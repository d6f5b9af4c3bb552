"""A power-of-two buddy allocator over KV cache slots: where contiguous reservations get placed.

What this teaches: why one contiguous region per request wastes memory even when each region is
exactly what its request needs. The paper's Orca baselines place reservations with a buddy
allocator (section 6.1); the free memory it strands between live regions is *external
fragmentation* (section 3, Fig. 2). Read next: ``contiguous/cache.py``, which stores K/V in them.

Blocks are 2**k slots at offsets that are multiples of 2**k; the block at ``off`` has one *buddy* at
``off ^ 2**k``, the other half of the block of order k+1. ``alloc`` halves the smallest free block
that fits; ``free`` merges a block with its buddy while the buddy is free: a scan of the
log2(num_slots) orders each, plus ``alloc``'s scan of one order's set for its lowest offset.
``alloc(100)`` holds 128 slots; ``exact=True`` gives the 28-slot tail back (as Linux's
``alloc_pages_exact``).

Invariants (tests/invariants.py, after every step of tests/test_buddy.py):
  1. every slot is in exactly one live allocation or one free block;
  2. a free block of order k is aligned (offset % 2**k == 0) and inside the arena;
  3. free blocks are fully merged: no free block's buddy is free at the same order;
  4. so freeing everything gives back the binary decomposition of ``num_slots`` (12 = 8 + 4:
     the 4's buddy would lie past the end, so it never merges).
"""

from __future__ import annotations

from minipaged._checks import SIZE_LIMIT, OutOfBlocksError, check_int


class OutOfMemoryError(OutOfBlocksError):
    """No free region is large enough: ``needed`` slots asked for, ``largest_free`` the largest
    region one ``alloc`` could get now, ``num_free`` all free slots (also ``free``, as in
    OutOfBlocksError, so one ``except`` serves both caches). Nothing changed."""

    def __init__(self, needed: int, largest_free: int, num_free: int, what: str = "") -> None:
        self.needed, self.largest_free = needed, largest_free
        self.num_free = self.free = num_free
        RuntimeError.__init__(self, f"out of KV cache memory{what}: needed {needed} contiguous "
                              f"slots (a free buddy block of {next_pow2(needed)}), but the largest "
                              f"free region is {largest_free} slots ({num_free} slots free in all)")


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


class BuddyAllocator:
    """Power-of-two buddy allocator over ``num_slots`` slots (any positive size). Among free
    blocks of one order the lowest offset goes first, so the same calls give the same layout."""

    def __init__(self, num_slots: int) -> None:
        self.num_slots = check_int("num_slots", num_slots, low=1, high=SIZE_LIMIT)
        self.max_order = self.num_slots.bit_length() - 1  # largest block: 2**max_order slots
        self._free: list[set[int]] = [set() for _ in range(self.max_order + 1)]  # per order
        self._live: dict[int, int] = {}  # offset -> slots held by that allocation
        self._freed: set[int] = set()  # offsets freed and not re-used: to name a double free
        self.num_free = 0
        off = 0
        for k in range(self.max_order, -1, -1):  # the binary decomposition of num_slots
            if self.num_slots >> k & 1:
                self._push(off, k)
                off += 1 << k

    # ---- free lists ---------------------------------------------------------------------------
    def _push(self, off: int, k: int) -> None:
        self._free[k].add(off)
        self.num_free += 1 << k

    def _remove(self, off: int, k: int) -> None:
        self._free[k].remove(off)
        self.num_free -= 1 << k

    def _free_block(self, off: int, k: int) -> None:
        """Give back the aligned block (off, order k), merging with free buddies upwards."""
        while k < self.max_order and (off ^ (1 << k)) in self._free[k]:
            self._remove(off ^ (1 << k), k)
            off, k = off & ~(1 << k), k + 1
        self._push(off, k)

    def _free_range(self, start: int, end: int) -> None:
        """Give back [start, end) as the largest aligned blocks that fit (at most 2 per order)."""
        while start < end:
            k = (end - start).bit_length() - 1
            if start:
                k = min(k, (start & -start).bit_length() - 1)  # alignment of start
            self._free_block(start, k)
            start += 1 << k

    # ---- public API ---------------------------------------------------------------------------
    def _order_for(self, size: int) -> int:
        size = check_int("size", size, low=1, high=self.num_slots + 1)
        k = (size - 1).bit_length()
        if k > self.max_order:
            raise ValueError(f"size={size} can never be allocated: it needs a buddy block of "
                             f"{1 << k} slots, and the largest block in an arena of "
                             f"num_slots={self.num_slots} is {1 << self.max_order}")
        return k

    def _smallest_fit(self, k: int) -> int | None:
        """The smallest order >= k with a free block (split as little as possible), or None."""
        return next((j for j in range(k, self.max_order + 1) if self._free[j]), None)

    def can_alloc(self, size: int) -> bool:
        """True when ``alloc(size)`` would succeed now (same answer with or without exact)."""
        return self._smallest_fit(self._order_for(size)) is not None

    def alloc(self, size: int, *, exact: bool = False) -> int:
        """The offset of one contiguous region: a whole block of ``next_pow2(size)`` slots, or
        exactly ``size`` slots when ``exact``. OutOfMemoryError (nothing changed) if none fits."""
        k = self._order_for(size)
        j = self._smallest_fit(k)
        if j is None:
            raise OutOfMemoryError(size, self.largest_free(), self.num_free)
        off = min(self._free[j])
        self._remove(off, j)
        while j > k:  # split: keep the lower half, the upper half (its buddy) becomes free
            j -= 1
            self._push(off + (1 << j), j)
        held = 1 << k
        if exact and size < held:
            self._free_range(off + size, off + held)
            held = size
        self._live[off] = held
        self._freed.discard(off)
        return off

    def free(self, offset: int) -> None:
        """Give back the region that starts at ``offset`` and merge it with free neighbours."""
        offset = check_int("offset", offset, low=0, high=self.num_slots)
        if offset not in self._live:
            if offset in self._freed:
                raise ValueError(f"double free: offset={offset} was already freed")
            starts = sorted(self._live)
            shown = f"{starts[:8]}{'...' if len(starts) > 8 else ''}"
            raise ValueError(f"free(offset={offset}): no live allocation starts there "
                             f"(live allocations start at {shown})")
        self._free_range(offset, offset + self._live.pop(offset))
        self._freed.add(offset)

    def held(self, offset: int) -> int:
        """Slots held by the live allocation at ``offset``."""
        if offset not in self._live:
            raise ValueError(f"offset={offset!r} is not the start of a live allocation")
        return self._live[offset]

    @property
    def allocations(self) -> dict[int, int]:
        """Live allocations, offset -> slots held (a copy)."""
        return dict(self._live)

    def largest_free(self) -> int:
        """Size of the largest free block: the largest region one ``alloc`` can get now."""
        return max((1 << k for k, offs in enumerate(self._free) if offs), default=0)

    def usable_free(self, size: int) -> int:
        """Free slots in blocks large enough for a region of ``size``; the other free slots are
        external fragmentation as seen by that request."""
        k = (check_int("size", size, low=1, high=self.num_slots + 1) - 1).bit_length()
        return sum(len(self._free[j]) << j for j in range(k, self.max_order + 1))

    def free_blocks(self) -> list[tuple[int, int]]:
        """All free blocks as sorted (offset, slots) pairs (for display and tests)."""
        return sorted((off, 1 << k) for k, s in enumerate(self._free) for off in s)

    def __repr__(self) -> str:
        return (f"BuddyAllocator(num_slots={self.num_slots}, num_free={self.num_free}, "
                f"largest_free={self.largest_free()}, live={len(self._live)})")
