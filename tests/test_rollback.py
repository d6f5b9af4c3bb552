"""``rollback(seq_id, n)``: rejected speculative tokens give their slots back.

What is promised, and tested here (the stateful walks are in tests/test_rollback_stateful.py):
- the last n tokens' slots come back; blocks left empty are released, the partly filled last
  block stays and the next ``append_slot`` writes over the rolled-back slots;
- a bad n (negative, the whole sequence or more, not an int) or an unknown or swapped-out
  sequence is refused with an error naming it, and nothing changes;
- copy-on-write: a rollback writes nothing, so a block shared with another sequence keeps its
  K/V; the next write into it copies it first, and usage still counts it as full where the
  other sequence holds it full;
- prefix caching: a cached block a rollback cut into stays findable (its K/V are intact) until
  it is written again; then its only user evicts it first, and a sharer copies it; the chain
  hashes of the rolled-back blocks are forgotten.
"""

from __future__ import annotations

import pytest
from invariants import check_invariants
from test_kv_cache_stateful import snapshot

from minipaged import KVCacheManager
from minipaged.paged.block_manager import BlockManager


@pytest.mark.parametrize("cls", [BlockManager, KVCacheManager])
def test_rollback_frees_emptied_blocks_and_keeps_the_partial_one(cls):
    m = cls(8, 4)
    m.allocate("a", list(range(6)))                     # 2 blocks, the second half full
    slots = [m.append_slot("a", 9) for _ in range(5)]   # 11 tokens: 3 blocks
    table = m.block_table("a")
    assert len(table) == 3 and m.num_free_blocks == 5
    m.rollback("a", 4)                                   # 7 tokens: blocks 0-1, slot 3 free
    assert m.seq_len("a") == 7 and m.token_ids("a") == [0, 1, 2, 3, 4, 5, 9]
    assert m.block_table("a") == table[:2] and m.num_free_blocks == 6
    assert m.ref_count(table[2]) == 0
    assert m.append_slot("a", 7) == slots[1]             # position 7 again, the same slot
    m.rollback("a", 0)                                   # nothing rejected: a no-op
    assert m.seq_len("a") == 8
    m.rollback("a", 7)                                   # down to one token
    assert m.block_table("a") == table[:1] and m.num_free_blocks == 7
    check_invariants(m)
    assert m.usage() == m.usage_slow()


@pytest.mark.parametrize("n, error, message", [
    (-1, ValueError, r"n=-1 is out of range: expected in \[0, 5\)"),
    (5, ValueError, r"n=5 is out of range: expected in \[0, 5\)"),
    (99, ValueError, r"n=99 is out of range"),
    (1.0, TypeError, "n=1.0 must be an integer"),
    (True, TypeError, "n=True must be an integer, not a bool"),
    ("2", TypeError, "n='2' must be an integer"),
])
def test_a_bad_n_changes_nothing(n, error, message):
    m = KVCacheManager(4, 2, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3, 4, 5])
    before = snapshot(m)
    with pytest.raises(error, match=message):
        m.rollback("a", n)
    assert snapshot(m) == before


def test_unknown_and_swapped_sequences_are_refused():
    m = KVCacheManager(4, 2, num_cpu_blocks=4)
    m.allocate("a", [1, 2, 3])
    with pytest.raises(KeyError, match="seq_id='b' is not allocated"):
        m.rollback("b", 1)
    with pytest.raises(TypeError, match="must be hashable"):
        m.rollback(["a"], 1)
    m.swap_out(["a"])
    before = snapshot(m)
    with pytest.raises(ValueError, match="seq_id='a' is swapped out; swap_in it first"):
        m.rollback("a", 1)
    assert snapshot(m) == before


def test_a_shared_block_is_not_changed_by_one_sharers_rollback():
    m = KVCacheManager(8, 4)
    m.allocate("a", list(range(8)))                     # two full blocks
    m.fork("a", "b")
    full = m.block_table("a")[1]
    m.rollback("a", 2)                                   # a: 6 tokens, into the shared block
    assert m.block_table("a") == m.block_table("b") and m.ref_count(full) == 2
    assert m.seq_len("b") == 8
    # the block is full in b's table, partly filled in a's: usage counts it full, once
    assert m.usage() == m.usage_slow() and m.usage().token == 8
    assert m.blocks_needed_to_append(["a"]) == 1         # a copy, for a to write into
    m.append_slot("a", 42)
    assert m.pending_copies == [(full, m.block_table("a")[1])]
    assert m.block_table("b")[1] == full and m.ref_count(full) == 2   # b's, and the copy's read
    m.take_copies()
    assert m.ref_count(full) == 1
    check_invariants(m)


def test_rollback_drops_a_pending_copy_into_a_dropped_block():
    m = KVCacheManager(8, 4)
    m.allocate("a", [1, 2, 3, 4, 5])
    m.fork("a", "b")
    shared = m.block_table("a")[1]
    for _ in range(3):
        m.append_slot("a", 6)                            # copy-on-write: a owns a copy now
    (src, dst), = m.pending_copies
    assert src == shared and m.block_table("a") == [m.block_table("b")[0], dst]
    m.rollback("a", 4)                                    # a: 4 tokens, its copy empty
    assert m.pending_copies == [] and m.ref_count(dst) == 0 and m.ref_count(shared) == 1
    assert m.take_copies() == []
    check_invariants(m)


def _cached(m) -> set[int]:
    return set(m.allocator.cached_blocks().values())


def test_prefix_cache_sole_user_evicts_before_writing():
    m = KVCacheManager(8, 4, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3, 4, 5])
    for t in (6, 7, 8):                                   # fills block 1: cached
        m.append_slot("a", t)
    second = m.block_table("a")[1]
    assert second in _cached(m)
    m.rollback("a", 2)                                    # rejected: 7, 8
    assert second in _cached(m), "its K/V are untouched: still a valid hit"
    check_invariants(m)
    evictions = m.allocator.evictions
    assert m.append_slot("a", 9) == second * 4 + 2        # written in place, so ...
    assert second not in _cached(m) and m.allocator.evictions == evictions + 1   # ... evicted
    m.append_slot("a", 10)                                # full again: cached with new tokens
    assert m.allocator.block_token_ids(second) == (5, 6, 9, 10)
    check_invariants(m)


def test_prefix_cache_hit_on_a_rolled_back_block_then_copy_on_write():
    m = KVCacheManager(8, 4, enable_prefix_caching=True)
    m.allocate("a", list(range(1, 9)))                    # 8 tokens: both blocks cached
    m.rollback("a", 1)
    first, second = m.block_table("a")
    assert m.allocate("c", list(range(1, 9)) + [0]) == 8  # c hits both blocks, a's second too
    assert m.block_table("c")[:2] == [first, second] and m.ref_count(second) == 2
    m.append_slot("a", 99)                                # a writes: it gets a copy
    (src, dst), = m.pending_copies
    assert src == second and m.block_table("a") == [first, dst]
    assert m.allocator.block_token_ids(second) == (5, 6, 7, 8)   # c's block, still cached
    m.take_copies()
    check_invariants(m)


def test_prefix_cache_sharer_leaves_then_the_last_user_evicts():
    """Shared at the rollback, alone at the write: the write still may not keep the hash."""
    m = KVCacheManager(8, 4, enable_prefix_caching=True)
    m.allocate("a", list(range(1, 9)))
    m.rollback("a", 2)
    m.allocate("c", list(range(1, 9)) + [0])
    second = m.block_table("a")[1]
    m.free("c")
    assert m.ref_count(second) == 1 and second in _cached(m)
    m.append_slot("a", 50)                                 # in place: evicted first
    assert m.pending_copies == [] and second not in _cached(m)
    check_invariants(m)


def test_prefix_cache_forgets_the_hashes_of_rolled_back_blocks():
    m = KVCacheManager(8, 2, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3, 4, 5, 6, 7])                 # 3 full blocks
    m.rollback("a", 4)                                     # 3 tokens: 1 full block
    check_invariants(m)                                   # one chain hash per full block
    for t in (3, 4, 5, 6):                                 # the same tokens again ...
        m.append_slot("a", t)
    check_invariants(m)                                   # ... the same chain hashes
    m.rollback("a", 1)
    assert m.seq_len("a") == 6
    m.free("a")
    check_invariants(m)
    assert m.num_free_blocks == 8
