"""The buddy allocator: hand-checked examples, a stateful Hypothesis model, and every bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    rule,
)
from invariants import check_invariants

from minipaged.contiguous.buddy import BuddyAllocator, OutOfMemoryError, next_pow2


def roots(num_slots: int) -> list[tuple[int, int]]:
    """The starting free blocks: the binary decomposition of num_slots, largest first."""
    out, off = [], 0
    for k in range(num_slots.bit_length() - 1, -1, -1):
        if num_slots >> k & 1:
            out.append((off, 1 << k))
            off += 1 << k
    return out


# ---- worked examples (each derivable by hand from the splitting rule) ---------------------------

def test_split_keeps_lower_half_and_frees_buddies():
    a = BuddyAllocator(16)
    assert a.alloc(3) == 0  # 16 -> 8 + 8 -> 4 + 4: keep [0, 4)
    assert a.held(0) == 4
    assert a.free_blocks() == [(4, 4), (8, 8)]
    assert a.alloc(1) == 4  # the 4-block splits into 2 + 2, then 1 + 1
    assert a.free_blocks() == [(5, 1), (6, 2), (8, 8)]
    a.free(0)
    a.free(4)  # 4 merges with 5, then with 6, then with 0, then with 8
    assert a.free_blocks() == [(0, 16)]


def test_exact_gives_the_tail_back():
    a = BuddyAllocator(256)
    assert a.alloc(100, exact=True) == 0
    assert a.held(0) == 100
    # the 128-block's tail [100, 128) is 4 + 8 + 16 aligned blocks
    assert a.free_blocks() == [(100, 4), (104, 8), (112, 16), (128, 128)]
    assert a.num_free == 156
    a.free(0)
    assert a.free_blocks() == [(0, 256)]


def test_non_power_of_two_arena_starts_as_several_blocks():
    a = BuddyAllocator(12)
    assert a.free_blocks() == [(0, 8), (8, 4)]
    assert a.largest_free() == 8
    # [8, 12)'s buddy [12, 16) lies past the end: freeing both blocks never merges them
    a.free(a.alloc(8))
    a.free(a.alloc(4))
    assert a.free_blocks() == [(0, 8), (8, 4)]


def test_smallest_sufficient_block_is_taken_before_splitting():
    a = BuddyAllocator(12)
    a.free(a.alloc(4))
    off = a.alloc(4)
    assert off == 8  # the free 4-block at 8, not half of the 8-block at 0
    assert a.free_blocks() == [(0, 8)]


def test_external_fragmentation_example():
    # Four 4-slot requests fill 16 slots; free every other one: 8 slots free, none in one piece
    a = BuddyAllocator(16)
    offs = [a.alloc(4) for _ in range(4)]
    a.free(offs[0])
    a.free(offs[2])
    assert a.num_free == 8 and a.largest_free() == 4
    assert not a.can_alloc(8)
    assert a.usable_free(8) == 0 and a.usable_free(3) == 8
    with pytest.raises(OutOfMemoryError) as e:
        a.alloc(5)
    assert e.value.needed == 5 and e.value.largest_free == 4 and e.value.num_free == 8
    assert "5" in str(e.value) and "largest free region is 4" in str(e.value)


# ---- bad inputs: one test each ------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, -4, 2**31, 10**30])  # slot offsets are int32 too
def test_bad_num_slots_value(n):
    with pytest.raises(ValueError, match=f"num_slots={n}"):
        BuddyAllocator(n)


@pytest.mark.parametrize("n", [2.0, True, "8", None])
def test_bad_num_slots_type(n):
    with pytest.raises(TypeError, match=r"num_slots=.* must be an integer"):
        BuddyAllocator(n)


@pytest.mark.parametrize("size", [0, -1, 17])
def test_alloc_size_out_of_range(size):
    with pytest.raises(ValueError, match=rf"size={size} is out of range: expected in \[1, 17\)"):
        BuddyAllocator(16).alloc(size)


def test_alloc_size_not_int():
    with pytest.raises(TypeError, match=r"size=.* must be an integer"):
        BuddyAllocator(16).alloc(2.5)


def test_alloc_that_no_block_can_ever_hold():
    with pytest.raises(ValueError, match="size=9 can never be allocated.*16 slots.*is 8"):
        BuddyAllocator(12).alloc(9)


def test_double_free():
    a = BuddyAllocator(8)
    off = a.alloc(2)
    a.free(off)
    with pytest.raises(ValueError, match="double free: offset=0"):
        a.free(off)


def test_free_unknown_offset():
    a = BuddyAllocator(8)
    a.alloc(4)
    with pytest.raises(ValueError, match=r"free\(offset=2\): no live allocation.*\[0\]"):
        a.free(2)


@pytest.mark.parametrize("off", [-1, 8])
def test_free_offset_out_of_range(off):
    with pytest.raises(ValueError, match=f"offset={off} is out of range"):
        BuddyAllocator(8).free(off)


def test_out_of_memory_leaves_state_unchanged():
    a = BuddyAllocator(8)
    a.alloc(4)
    a.alloc(2)
    before = (a.free_blocks(), a.allocations, a.num_free)
    with pytest.raises(OutOfMemoryError):
        a.alloc(3)
    assert (a.free_blocks(), a.allocations, a.num_free) == before


# ---- stateful model -----------------------------------------------------------------------------

class BuddyMachine(RuleBasedStateMachine):
    """Random alloc / free sequences against an independent model of slot ownership.

    Invariants (prose; each asserted below after every step):
      - no two live allocations overlap, and each lies inside the arena;
      - each allocation is aligned to its buddy block (offset % next_pow2(size) == 0) and holds
        next_pow2(size) slots, or exactly size with exact=True;
      - free + allocated = total: num_free + sum(held) == num_slots;
      - largest_free() is the largest free block, and alloc succeeds exactly when a free block of
        next_pow2(size) or more exists (an OutOfMemoryError changes nothing);
      - free blocks are aligned and fully merged (tests/invariants.py, the O(n) oracle);
      - freeing everything restores the starting blocks (the full arena when it is a power of 2).
    """

    live = Bundle("live")

    @initialize(num_slots=st.integers(1, 300))
    def setup(self, num_slots):
        self.a = BuddyAllocator(num_slots)
        self.n = num_slots
        self.owner = np.full(num_slots, -1)  # model: which allocation owns each slot
        self.model: dict[int, int] = {}  # offset -> held
        self.freed: set[int] = set()

    @rule(target=live, frac=st.floats(0, 1), exact=st.booleans())
    def alloc(self, frac, exact):
        size = 1 + int(frac * ((1 << (self.n.bit_length() - 1)) - 1))
        fits = any(n >= next_pow2(size) for _, n in self.a.free_blocks())
        assert self.a.can_alloc(size) == fits
        if not fits:
            before = (self.a.free_blocks(), self.a.allocations)
            with pytest.raises(OutOfMemoryError):
                self.a.alloc(size, exact=exact)
            assert (self.a.free_blocks(), self.a.allocations) == before
            return None
        off = self.a.alloc(size, exact=exact)
        held = size if exact else next_pow2(size)
        assert off % next_pow2(size) == 0 and self.a.held(off) == held
        assert (self.owner[off:off + held] == -1).all(), "new region overlaps a live one"
        self.owner[off:off + held] = off
        self.model[off] = held
        self.freed.discard(off)
        return off

    @rule(off=consumes(live))
    def free(self, off):
        if off not in self.model:  # None (that alloc ran out) or already freed by free_everything
            return
        self.a.free(off)
        self.owner[off:off + self.model.pop(off)] = -1
        self.freed.add(off)

    @rule()
    def double_free_is_refused(self):
        for off in sorted(self.freed - set(self.model))[:1]:
            with pytest.raises(ValueError, match="double free"):
                self.a.free(off)

    @rule()
    def free_everything(self):
        for off in list(self.model):
            self.a.free(off)
            self.freed.add(off)
        self.model.clear()
        self.owner[:] = -1
        assert self.a.free_blocks() == roots(self.n)

    @invariant()
    def consistent(self):
        check_invariants(self.a)
        assert self.a.allocations == self.model
        assert self.a.num_free + sum(self.model.values()) == self.n
        assert self.a.num_free == int((self.owner == -1).sum())
        blocks = self.a.free_blocks()
        assert self.a.largest_free() == max((n for _, n in blocks), default=0)
        for size in (1, 3, 8):
            if size <= self.n:
                want = sum(n for _, n in blocks if n >= next_pow2(size))
                assert self.a.usable_free(size) == want

    def teardown(self):
        if hasattr(self, "a"):
            self.free_everything()


BuddyMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40)
TestBuddyMachine = BuddyMachine.TestCase


@given(num_slots=st.integers(1, 2000), sizes=st.lists(st.integers(1, 64), max_size=40))
@settings(max_examples=40)
def test_fill_then_free_in_any_order_restores_the_arena(num_slots, sizes):
    a = BuddyAllocator(num_slots)
    offs = []
    for i, s in enumerate(sizes):
        if s <= 1 << a.max_order and a.can_alloc(s):
            offs.append(a.alloc(s, exact=bool(i % 2)))
    for off in reversed(offs[::2]):
        a.free(off)
    for off in offs[1::2]:
        a.free(off)
    assert a.free_blocks() == roots(num_slots)


def test_the_invariant_oracle_catches_each_kind_of_corruption():
    """tests/invariants.py must fail on a broken allocator, or the stateful test proves nothing:
    an overlap, a leak, a misplaced block, an unmerged pair and a wrong free count."""
    def broken(corrupt):
        a = BuddyAllocator(16)
        a.alloc(4)                          # [0, 4) live; free: 4 at 4, 8 at 8
        corrupt(a)
        with pytest.raises(AssertionError):
            check_invariants(a)

    check_invariants(BuddyAllocator(16))
    broken(lambda a: a._free[2].add(0))                         # free block over a live one
    broken(lambda a: (a._free[2].remove(4), setattr(a, "num_free", 8)))  # slots 4..7 leak
    broken(lambda a: (a._free[3].remove(8), a._free[3].add(6)))  # order-3 block at offset 6
    broken(lambda a: (a._free[3].remove(8), a._free[2].update({8, 12})))  # buddies unmerged
    broken(lambda a: setattr(a, "num_free", 11))                # the count disagrees
