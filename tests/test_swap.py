"""Swapping to a CPU block pool and preemption by recomputation (swap.py)."""

from __future__ import annotations

import numpy as np
import pytest
from invariants import check_invariants
from test_kv_cache_stateful import snapshot

from minipaged.paged.block_allocator import OutOfBlocksError
from minipaged.paged.cache_ops import reshape_and_cache
from minipaged.paged.paged_attention import paged_attention
from minipaged.serving.swap import CPUBlockPool, KVCacheManager


def filled(m, nb, bs, seqs, seed=0):
    rng = np.random.default_rng(seed)
    kc = rng.standard_normal((nb, 2, bs, 4)).astype(np.float32)  # [NB, Hkv, BS, D]
    vc = rng.standard_normal((nb, 2, bs, 4)).astype(np.float32)
    return kc, vc


def test_swap_round_trip_is_bit_identical_and_shares_once():
    m = KVCacheManager(6, 2, num_cpu_blocks=4)
    m.allocate("p", [1, 2, 3])
    m.fork("p", "c")  # both point at blocks 0, 1
    kc, vc = filled(m, 6, 2, ["p", "c"])
    pool = CPUBlockPool(4, 2, 2, 4, np.float32)
    q = np.random.default_rng(1).standard_normal((2, 4, 4)).astype(np.float32)
    lens = np.array([3, 3], np.int32)
    before = paged_attention(q, kc, vc, m.block_tables(["p", "c"]), lens)
    out = m.swap_out(["p", "c"])
    assert sorted(g for g, _ in out) == [0, 1]  # a shared block moves once
    assert m.num_free_blocks == 6 and m.num_free_cpu_blocks == 2
    assert m.is_swapped("p") and m.cpu_block_table("p") == m.cpu_block_table("c")
    pool.copy_out(kc, vc, out)
    kc[:] = np.nan  # the GPU blocks are reused by others meanwhile
    m.allocate("other", [9, 9, 9, 9])
    m.free("other")
    back = m.swap_in(["p", "c"])
    pool.copy_in(kc, vc, back)
    assert m.block_table("p") == m.block_table("c")  # still shared after the round trip
    assert m.ref_count(m.block_table("p")[0]) == 2
    after = paged_attention(q, kc, vc, m.block_tables(["p", "c"]), lens)
    assert np.array_equal(before, after)
    assert m.num_free_cpu_blocks == 4
    check_invariants(m)


def test_swap_is_all_or_nothing():
    m = KVCacheManager(8, 2, num_cpu_blocks=2)
    m.allocate("a", range(3))
    m.allocate("b", range(3))
    with pytest.raises(OutOfBlocksError, match="CPU pool") as e:
        m.swap_out(["a", "b"])  # 4 blocks, CPU has 2
    assert (e.value.needed, e.value.free) == (4, 2)
    assert not m.is_swapped("a") and m.num_free_blocks == 4 and m.num_free_cpu_blocks == 2
    m.swap_out(["a"])
    m.allocate("c", range(12))  # the GPU fills up meanwhile
    assert not m.can_swap_in(["a"])
    with pytest.raises(OutOfBlocksError, match="to swap in"):
        m.swap_in(["a"])
    assert m.is_swapped("a") and m.cpu_block_table("a") == [0, 1]
    check_invariants(m)


def test_swapped_sequence_cannot_be_appended_and_can_be_freed():
    m = KVCacheManager(4, 2, num_cpu_blocks=4)
    m.allocate("a", [1, 2, 3])
    m.swap_out(["a"])
    with pytest.raises(ValueError, match="seq_id='a' is swapped out; swap_in it first"):
        m.append_slot("a", 1)
    with pytest.raises(ValueError, match="swapped out"):
        m.block_table("a")
    assert m.seq_len("a") == 3 and m.token_ids("a") == [1, 2, 3]
    m.free("a")
    assert m.num_free_cpu_blocks == 4 and m.seq_ids == []


def test_swap_bad_inputs():
    m = KVCacheManager(4, 2)
    m.allocate("a", [1])
    with pytest.raises(ValueError, match="num_cpu_blocks=0"):
        m.swap_out(["a"])
    m = KVCacheManager(4, 2, num_cpu_blocks=2)
    m.allocate("a", [1])
    with pytest.raises(ValueError, match="duplicates"):
        m.swap_out(["a", "a"])
    with pytest.raises(ValueError, match="seq_ids is empty"):
        m.swap_out([])
    with pytest.raises(KeyError, match="not swapped out"):
        m.swap_in(["a"])
    m.fork("a", "b")
    m.append_slot("b", 5)  # copy-on-write pending into b's new block
    with pytest.raises(ValueError, match="take_copies"):
        m.swap_out(["b"])
    with pytest.raises(ValueError, match="num_cpu_blocks=-1"):
        KVCacheManager(4, 2, num_cpu_blocks=-1)


def test_a_group_is_a_collection_of_ids_not_one_id():
    """swap_out('a') read the string as the group ['a'] (and swapped sequence 'a' out); 5 and a
    bytes id failed with "not iterable" or on its first byte. So did block_tables('a')."""
    m = KVCacheManager(4, 2, num_cpu_blocks=4)
    m.allocate("a", [1])
    m.allocate(5, [2])
    before = snapshot(m)
    for call in (m.swap_out, m.swap_in, m.preempt_by_recompute, m.can_swap_out, m.can_swap_in,
                 m.block_tables, m.blocks_needed_to_append, m.can_append_slots):
        for bad, kind in (("a", "str"), (b"a", "bytes"), (5, "int")):
            with pytest.raises(TypeError, match=rf"seq_ids={bad!r} must be a list of seq ids, "
                                                rf"got {kind}"):
                call(bad)
    assert snapshot(m) == before


def test_recompute_frees_and_reports_tokens():
    m = KVCacheManager(4, 2, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3])
    m.append_slot("a", 4)
    m.append_slot("a", 5)
    tokens = m.preempt_by_recompute(["a"])
    assert tokens == {"a": [1, 2, 3, 4, 5]} and m.seq_ids == []
    assert m.num_free_blocks == 4
    # with prefix caching, re-prefill finds most of its blocks still cached
    assert m.allocate("a", tokens["a"]) == 4


def test_swap_in_with_prefix_caching_makes_blocks_findable_again():
    m = KVCacheManager(4, 2, enable_prefix_caching=True, num_cpu_blocks=4)
    m.allocate("a", [1, 2, 3, 4, 5])
    m.swap_out(["a"])
    m.allocate("x", range(8))  # evicts a's cached blocks
    m.free("x")
    m.swap_in(["a"])
    assert m.allocate("b", [1, 2, 3, 4, 5]) == 4
    check_invariants(m)


def test_cpu_pool_bad_shape():
    with pytest.raises(ValueError, match="num_blocks=0"):
        CPUBlockPool(0, 2, 2, 4)
    with pytest.raises(ValueError, match=r"num_blocks=10{30} is out of range"):  # numpy's words
        CPUBlockPool(10**30, 2, 2, 4)
    for dtype in (None, "foo", np.int32):  # None was silently float64, like the others' default
        with pytest.raises(TypeError, match="dtype=.* is not supported"):
            CPUBlockPool(2, 2, 2, 4, dtype)
    pool = CPUBlockPool(2, 2, 2, 4)
    kc = np.zeros((4, 2, 4, 4), np.float32)
    with pytest.raises(ValueError, match="block shapes differ"):
        pool.copy_out(kc, kc.copy(), [(0, 0)])
    kc[0] = 1.0
    ok = np.zeros((4, 2, 2, 4), np.float32)
    ok[0] = 1.0
    pool.copy_out(ok, ok.copy(), [(0, 1)])
    assert (pool.key_cache[1] == 1.0).all()
    reshape_and_cache(np.zeros((1, 2, 4), np.float32), np.zeros((1, 2, 4), np.float32),
                      ok, ok.copy(), np.array([0]))


def test_cache_blocks_refuses_a_swapped_out_sequence_and_changes_nothing():
    """It recorded the sequence's computed blocks before it failed, so swap_in then cached blocks
    whose K/V were never written and a new prompt hit them."""
    m = KVCacheManager(8, 4, enable_prefix_caching=True, num_cpu_blocks=8)
    m.allocate("d", [5, 6, 7, 8, 9, 10, 11, 12, 13], cache=False)
    m.swap_out(["d"])
    with pytest.raises(ValueError, match="seq_id='d' is swapped out"):
        m.cache_blocks("d", 8)
    m.swap_in(["d"])
    assert m.allocate("e", [5, 6, 7, 8, 9, 10, 11, 12, 1]) == 0  # nothing was cached
    with pytest.raises(KeyError, match="seq_id='zz' is not allocated"):
        KVCacheManager(8, 4).cache_blocks("zz", 99)  # checked with prefix caching off too
