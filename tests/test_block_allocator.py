"""BlockAllocator: free list + reference counts (block_allocator.py).

Invariants (asserted by the state machine after every step): every block is free (count 0, in
the free list once) or in use (count >= 1); free + in use = num_blocks; the count of each block
equals the number of references the test holds; releasing every reference refills the pool.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from invariants import check_invariants

from minipaged.paged.block_allocator import BlockAllocator, OutOfBlocksError


def test_fresh_allocator_hands_out_every_block_once():
    a = BlockAllocator(5)
    got = [a.allocate() for _ in range(5)]
    assert sorted(got) == list(range(5))
    assert a.num_free_blocks == 0
    with pytest.raises(OutOfBlocksError) as e:
        a.allocate()
    assert (e.value.needed, e.value.free) == (1, 0)
    assert "needed 1" in str(e.value) and "0 free" in str(e.value)


def test_block_returns_to_free_list_only_at_count_zero():
    a = BlockAllocator(2)
    b = a.allocate()
    a.incref(b)
    a.incref(b)
    assert a.ref_count(b) == 3
    a.free(b)
    a.free(b)
    assert a.num_free_blocks == 1 and a.ref_count(b) == 1
    a.free(b)
    assert a.num_free_blocks == 2 and a.ref_count(b) == 0


def test_no_cap_on_reference_counts():
    # The seed answer claims vLLM caps shared references at 16. It does not (vllm-facts.md):
    # 1000 users of one block is fine.
    a = BlockAllocator(1)
    b = a.allocate()
    for _ in range(999):
        a.incref(b)
    assert a.ref_count(b) == 1000


def test_allocate_many_is_all_or_nothing():
    a = BlockAllocator(3)
    a.allocate()
    with pytest.raises(OutOfBlocksError) as e:
        a.allocate_many(3)
    assert (e.value.needed, e.value.free) == (3, 2)
    assert a.num_free_blocks == 2
    assert len(set(a.allocate_many(2))) == 2


@pytest.mark.parametrize("bad, exc, words", [
    (0, ValueError, "num_blocks=0"), (-3, ValueError, "num_blocks=-3"),
    (2.5, TypeError, "num_blocks=2.5"), ("8", TypeError, "num_blocks='8'"),
    (True, TypeError, "bool"),
    (2**31, ValueError, r"num_blocks=2147483648 is out of range: expected in \[1, 2147483648\)"),
    (10**30, ValueError, "num_blocks=10{30} is out of range"),  # was a bare OverflowError
])
def test_bad_num_blocks(bad, exc, words):
    with pytest.raises(exc, match=words):
        BlockAllocator(bad)


def test_bad_block_ids_and_double_free():
    a = BlockAllocator(4)
    b = a.allocate()
    with pytest.raises(ValueError, match=r"block=7 is out of range: expected in \[0, 4\)"):
        a.free(7)
    with pytest.raises(ValueError, match="block=-1"):
        a.ref_count(-1)
    with pytest.raises(TypeError, match="block=1.0"):
        a.incref(1.0)
    with pytest.raises(ValueError, match="free"):
        a.incref(b + 1)  # not in use: sharing it would be a bug
    a.free(b)
    with pytest.raises(ValueError, match="double free"):
        a.free(b)
    check_invariants(a)


def state(a: BlockAllocator) -> tuple:
    return [a.ref_count(b) for b in range(a.num_blocks)], a.free_queue()


@pytest.mark.parametrize("bad, exc, words", [
    ([-1], ValueError, r"blocks\[0\]=-1 is out of range"),
    ([1, 7], ValueError, r"blocks\[1\]=7 is out of range: expected in \[0, 4\)"),
    ([2, "3"], TypeError, r"blocks\[1\]='3' must be an integer"),
    ([1, True], TypeError, r"blocks\[1\]=True must be an integer, not a bool"),
    ([0, 0], ValueError, "block=0 is freed 2 time.* reference count 1 .double free"),
    ([3, 2, 3, 3], ValueError, "block=3 is freed 3 time"),
])
def test_free_many_checks_every_id_before_changing_anything(bad, exc, words):
    a = BlockAllocator(4)
    a.allocate_many(4)
    a.incref(3)  # block 3 has two users, the others one
    before = state(a)
    with pytest.raises(exc, match=words):
        a.free_many(bad)
    assert state(a) == before
    check_invariants(a)


def test_numpy_integers_are_block_ids_and_bools_are_not():
    a = BlockAllocator(np.int64(3))
    b = a.allocate()
    a.incref(np.int32(b))
    assert a.ref_count(np.uint8(b)) == 2
    a.free_many(np.array([b, b]))
    assert a.num_free_blocks == 3
    assert a.allocate_many(np.int16(2)) == [0, 1]
    with pytest.raises(TypeError, match="bool"):
        a.free(True)
    with pytest.raises(TypeError, match="bool"):
        a.allocate_many(np.bool_(True))


def test_the_free_list_is_a_stack():
    a = BlockAllocator(4)
    assert a.free_queue() == [0, 1, 2, 3]
    a.allocate_many(3)
    a.free_many([2, 0])
    assert a.free_queue() == [0, 2, 3]  # the last one freed is handed out next
    assert a.allocate() == 0


class AllocatorMachine(RuleBasedStateMachine):
    @initialize(n=st.integers(1, 12))
    def setup(self, n):
        self.a = BlockAllocator(n)
        self.held: list[int] = []  # one entry per reference the test holds

    @rule()
    def allocate(self):
        if self.a.num_free_blocks == 0:
            with pytest.raises(OutOfBlocksError):
                self.a.allocate()
        else:
            b = self.a.allocate()
            assert b not in self.held, f"block {b} handed out while still in use"
            self.held.append(b)

    @precondition(lambda self: getattr(self, "held", None))
    @rule(i=st.integers(0, 100))
    def incref(self, i):
        b = self.held[i % len(self.held)]
        self.a.incref(b)
        self.held.append(b)

    @precondition(lambda self: getattr(self, "held", None))
    @rule(i=st.integers(0, 100))
    def free(self, i):
        self.a.free(self.held.pop(i % len(self.held)))

    @precondition(lambda self: hasattr(self, "a"))
    @rule(blocks=st.lists(st.integers(-2, 13), max_size=5))
    def free_many(self, blocks):
        """Valid calls free all; any invalid id or a double free (repeats counted) raises and
        frees nothing."""
        before = state(self.a)
        held = list(self.held)
        try:
            for b in blocks:
                held.remove(b)
        except ValueError:
            with pytest.raises(ValueError):
                self.a.free_many(blocks)
            assert state(self.a) == before
            return
        self.a.free_many(blocks)
        self.held = held

    @invariant()
    def counts_match(self):
        if not hasattr(self, "a"):
            return
        check_invariants(self.a)
        for b in range(self.a.num_blocks):
            assert self.a.ref_count(b) == self.held.count(b)
        assert self.a.num_free_blocks + len(set(self.held)) == self.a.num_blocks

    def teardown(self):
        if hasattr(self, "a"):
            for b in self.held:
                self.a.free(b)
            assert self.a.num_free_blocks == self.a.num_blocks


TestAllocator = AllocatorMachine.TestCase
