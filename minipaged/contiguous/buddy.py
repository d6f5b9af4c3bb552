"""A power-of-two buddy allocator over KV cache slots: where contiguous reservations get placed.

What this teaches: why a cache that gives every request ONE contiguous region wastes memory even
when it reserves exactly what each request needs. The vLLM paper's Orca baselines (section 3 and
Fig. 2) place their reservations with a buddy allocator; the free memory it leaves between live
regions is the paper's *external fragmentation*. Read next: ``contiguous/cache.py``, which
stores real K/V in regions handed out by this allocator and reports the four categories.

The buddy system in one paragraph. The arena of ``num_slots`` slots is cut into blocks whose size
is a power of two and whose offset is a multiple of that size ("aligned"). A block of order k
(2**k slots) at offset ``off`` has exactly one *buddy*: the block at ``off ^ 2**k``; together they
form the aligned block of order k+1 they were split from. ``alloc(size)`` takes the smallest free
block of order ``ceil(log2(size))`` or larger and splits it in halves until it has the right order;
``free`` gives a block back and merges it with its buddy, again and again, while the buddy is free.
Allocating or freeing one block touches at most one block per order: O(log num_slots) work, no
loop over slots. A bit mask of the orders that have free blocks finds "the smallest free order
>= k" in O(1); a region that is not a power of two is at most two blocks per order.

Rounding, and how it is accounted. A plain buddy allocator rounds a request up to a power of two:
``alloc(100)`` holds 128 slots. ``alloc(100, exact=True)`` takes the 128-slot block and gives the
unused 28-slot tail straight back to the free lists (Linux does the same in ``alloc_pages_exact``),
so the request holds exactly 100 slots. Either way, ``held(offset)`` says how many slots a region
really holds; ``contiguous.py`` reports slack between what a policy asked for and what the
allocator holds ("rounding slack") as internal fragmentation, and also separately.

Invariants (checked by ``check_invariants``, asserted after every step of the Hypothesis state
machine in tests/test_buddy.py):
  1. Every slot is in exactly one place: inside one live allocation or inside one free block.
     So ``num_free + sum(held) == num_slots`` and no two allocations overlap.
  2. Every free block of order k is aligned (offset % 2**k == 0) and lies inside the arena.
  3. Free blocks are fully merged: no free block has its buddy free at the same order.
  4. Consequently, freeing every allocation gives back the starting set of blocks, the binary
     decomposition of ``num_slots`` (one block when ``num_slots`` is a power of two).

An arena whose size is not a power of two starts as several blocks (12 slots = 8 + 4); such a
block's buddy would lie past the end of the arena, is never free, so it never merges.
"""

from __future__ import annotations

import heapq

import numpy as np

from minipaged._checks import OutOfBlocksError, check_int


class OutOfMemoryError(OutOfBlocksError):
    """No free region is large enough. ``needed``: slots asked for; ``largest_free``: the
    largest region that could be handed out right now; ``num_free`` (also ``free``, as in the
    paged cache's OutOfBlocksError, so one ``except`` serves both caches): all free slots.
    Raised before anything changes: the allocator's state is as it was before the call."""

    def __init__(self, needed: int, largest_free: int, num_free: int, what: str = "") -> None:
        self.needed, self.largest_free, self.num_free = needed, largest_free, num_free
        self.free = num_free
        RuntimeError.__init__(self,
            f"out of KV cache memory{what}: needed {needed} contiguous slots (a free buddy block "
            f"of {next_pow2(needed)}), but the largest free region is {largest_free} slots "
            f"({num_free} slots free in all)"
        )


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    return 1 << (n - 1).bit_length()


class BuddyAllocator:
    """Power-of-two buddy allocator over ``num_slots`` slots (any positive size).

    alloc(size, exact=False) -> offset   free(offset)   held(offset) -> slots
    largest_free() -> slots   num_free   can_alloc(size)   usable_free(size)
    Lowest offset first among equal-order free blocks, so the same calls give the same layout.
    """

    def __init__(self, num_slots: int) -> None:
        self.num_slots = check_int("num_slots", num_slots, low=1)
        self.max_order = self.num_slots.bit_length() - 1  # largest block: 2**max_order slots
        # Per order: the set is the truth (O(1) membership, for merging); the heap finds the lowest
        # offset in O(log n). Entries removed from a set stay in its heap ("lazy deletion") and are
        # skipped when popped; the heap is rebuilt when stale entries outnumber live ones.
        self._free: list[set[int]] = [set() for _ in range(self.max_order + 1)]
        self._heap: list[list[int]] = [[] for _ in range(self.max_order + 1)]
        self._mask = 0  # bit k set <=> some free block of order k: O(1) "smallest order >= k"
        self._live: dict[int, int] = {}  # offset -> slots held by that allocation
        self._freed: set[int] = set()  # offsets freed and not re-used: to name a double free
        self.num_free = 0
        self._roots: list[tuple[int, int]] = []  # the starting blocks: binary decomposition
        off = 0
        for k in range(self.max_order, -1, -1):
            if self.num_slots >> k & 1:
                self._roots.append((off, k))
                self._push(off, k)
                off += 1 << k

    # ---- free lists ---------------------------------------------------------------------------
    def _push(self, off: int, k: int) -> None:
        self._free[k].add(off)
        self._mask |= 1 << k
        heapq.heappush(self._heap[k], off)
        self.num_free += 1 << k

    def _discard(self, off: int, k: int) -> None:
        self._free[k].remove(off)
        self.num_free -= 1 << k
        if not self._free[k]:
            self._mask &= ~(1 << k)
        if len(self._heap[k]) > 2 * len(self._free[k]) + 16:
            self._heap[k] = sorted(self._free[k])  # a sorted list is a valid heap

    def _pop_lowest(self, k: int) -> int:
        heap, live = self._heap[k], self._free[k]
        while True:
            off = heapq.heappop(heap)
            if off in live:
                live.remove(off)
                self.num_free -= 1 << k
                if not live:
                    self._mask &= ~(1 << k)
                return off

    def _free_block(self, off: int, k: int) -> None:
        """Give back the aligned block (off, order k), merging with free buddies upwards."""
        while k < self.max_order:
            buddy = off ^ (1 << k)
            if buddy not in self._free[k]:
                break
            self._discard(buddy, k)
            off, k = min(off, buddy), k + 1
        self._push(off, k)

    def _free_range(self, start: int, end: int) -> None:
        """Give back [start, end): cut it greedily into the largest aligned blocks that fit
        (at most 2 per order, so O(log n) blocks), and free each one."""
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
            raise ValueError(
                f"size={size} can never be allocated: it needs a buddy block of {1 << k} slots, "
                f"and the largest block in an arena of num_slots={self.num_slots} is "
                f"{1 << self.max_order}"
            )
        return k

    def can_alloc(self, size: int) -> bool:
        """True when ``alloc(size)`` would succeed now (same answer with or without exact)."""
        return self._mask >> self._order_for(size) != 0

    def alloc(self, size: int, *, exact: bool = False) -> int:
        """Hand out one contiguous region of at least ``size`` slots; return its offset.

        The region is a whole block of ``next_pow2(size)`` slots, or exactly ``size`` slots when
        ``exact`` (the block's unused tail goes straight back to the free lists).
        Raises OutOfMemoryError (state unchanged) when no free block is large enough.
        """
        k = self._order_for(size)
        fit = self._mask >> k << k  # orders >= k that have a free block
        if not fit:
            raise OutOfMemoryError(size, self.largest_free(), self.num_free)
        j = (fit & -fit).bit_length() - 1  # the smallest such order: split as little as possible
        off = self._pop_lowest(j)
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
        return 1 << (self._mask.bit_length() - 1) if self._mask else 0

    def usable_free(self, size: int) -> int:
        """Free slots lying in free blocks large enough to place a region of ``size`` slots.
        The rest of the free slots (``num_free - usable_free(size)``) cannot serve such a
        request: that is external fragmentation as seen by that request."""
        k = (check_int("size", size, low=1, high=self.num_slots + 1) - 1).bit_length()
        fit, total = self._mask >> k << k, 0
        while fit:  # visit only the orders that have free blocks
            j = (fit & -fit).bit_length() - 1
            total += len(self._free[j]) << j
            fit &= fit - 1
        return total

    def free_blocks(self) -> list[tuple[int, int]]:
        """All free blocks as sorted (offset, slots) pairs (O(free blocks); for display/tests)."""
        return sorted((off, 1 << k) for k, s in enumerate(self._free) for off in s)

    def check_invariants(self) -> None:
        """The slow, obvious oracle: rebuild slot ownership and verify invariants 1-3 above.
        O(num_slots); raises AssertionError naming the first broken invariant."""
        owner = np.zeros(self.num_slots, dtype=np.int8)  # 0 nobody, 1 allocated, 2 free
        for off, n in self._live.items():
            if off < 0 or off + n > self.num_slots or owner[off:off + n].any():
                raise AssertionError(f"allocation [{off}, {off + n}) overlaps or leaves arena")
            owner[off:off + n] = 1
        for k, offs in enumerate(self._free):
            for off in offs:
                if off % (1 << k) or off + (1 << k) > self.num_slots:
                    raise AssertionError(f"free block ({off}, order {k}) misaligned or outside")
                if owner[off:off + (1 << k)].any():
                    raise AssertionError(f"free block ({off}, order {k}) overlaps something")
                owner[off:off + (1 << k)] = 2
                if k < self.max_order and (off ^ (1 << k)) in offs:
                    raise AssertionError(f"free block ({off}, order {k}) and its buddy unmerged")
            if bool(offs) != bool(self._mask >> k & 1):
                raise AssertionError(f"order {k}: the non-empty mask bit is wrong")
            if not offs <= set(self._heap[k]):
                raise AssertionError(f"order {k}: a free block is missing from its heap")
        if (owner == 0).any():
            raise AssertionError(f"slot {int(np.argmin(owner))} is neither free nor allocated")
        if int((owner == 2).sum()) != self.num_free:
            raise AssertionError(f"num_free={self.num_free} but {(owner == 2).sum()} slots free")

    def __repr__(self) -> str:
        return (f"BuddyAllocator(num_slots={self.num_slots}, num_free={self.num_free}, "
                f"largest_free={self.largest_free()}, live={len(self._live)})")
