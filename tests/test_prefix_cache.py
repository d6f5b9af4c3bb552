"""Prefix caching: chained hashes, verified hits, the LRU free queue, eviction on demand."""

from __future__ import annotations

import pytest

from minipaged.paged.block_allocator import OutOfBlocksError
from minipaged.paged.block_manager import KVCacheManager
from minipaged.sharing.prefix_cache import BROKEN, ROOT_SERIAL, PrefixCachingBlockAllocator


def test_second_request_reuses_full_blocks_and_recomputes_the_last_token():
    m = KVCacheManager(16, 4, enable_prefix_caching=True)
    assert m.allocate("a", range(10)) == 0
    assert m.allocate("b", range(10)) == 8  # two full blocks hit; the partial one is private
    assert m.block_table("b")[:2] == m.block_table("a")[:2]
    assert m.block_table("b")[2] != m.block_table("a")[2]
    # exactly 8 tokens: a hit on both blocks would leave nothing to compute; one block is
    # recomputed so that the model still produces logits for the last token
    assert m.allocate("c", range(8)) == 4
    assert m.allocate("d", range(12)) == 8  # a's third block was partial: never cached


def test_hash_is_chained_so_equal_blocks_after_different_prefixes_do_not_match():
    m = KVCacheManager(16, 2, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3, 4, 9])
    assert m.allocate("b", [7, 7, 3, 4, 9]) == 0  # block [3, 4] equal, its prefix is not


def test_freed_blocks_stay_cached_until_memory_is_needed():
    m = KVCacheManager(6, 2, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3, 4, 5])
    m.free("a")
    alloc = m.allocator
    assert m.num_free_blocks == 6 and alloc.num_cached_free_blocks == 2  # [1,2] and [3,4]
    m.allocate("x", [9, 9, 9])  # 2 blocks: never-cached blocks first, nothing evicted
    assert alloc.evictions == 0
    assert m.allocate("b", [1, 2, 3, 4, 6]) == 4  # hits taken out of the middle of the queue
    m.free("b")
    m.free("x")
    m.allocate("big", range(12))  # needs all 6 blocks: the 3 cached ones are evicted now
    assert alloc.evictions == 3  # [1, 2], [3, 4] and x's full block [9, 9]
    assert sorted(alloc.cached_blocks().values()) == sorted(m.block_table("big"))
    m.free("big")
    assert m.allocate("c", [1, 2, 3, 4, 5]) == 0  # evicted: a miss


def test_lru_order_evicts_the_least_recently_used_and_the_tail_first():
    m = KVCacheManager(4, 1, enable_prefix_caching=True)
    m.allocate("a", [1, 2])  # blocks for [1] and [1, 2]
    m.allocate("b", [5, 6])
    m.free("a")  # a's tail block first: it will be evicted before a's head block
    m.free("b")
    alloc = m.allocator
    assert list(alloc._lru) == [1, 0, 3, 2]
    m.allocate("z", [7])  # no clean block left: evicts block 1 ([1, 2], least recent)
    assert alloc.evictions == 1
    m.free("z")
    assert m.allocate("a2", [1, 2, 3]) == 1  # [1] still cached, [1, 2] gone


def test_allocate_counts_hits_in_the_lru_queue_as_not_free():
    m = KVCacheManager(3, 2, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3, 4, 5])
    m.free("a")  # 3 free, 2 of them cached
    with pytest.raises(OutOfBlocksError) as e:
        m.allocate("b", [1, 2, 3, 4, 5, 6, 7, 8, 9])  # 2 hits + 3 new > 3 - 2 + ...
    assert (e.value.needed, e.value.free) == (3, 1)
    assert m.seq_ids == [] and m.num_free_blocks == 3 and m.allocator.num_cached_free_blocks == 2
    m.check_invariants()


def test_collisions_are_caught_by_checking_token_ids():
    # a hash function that maps every block to the same value: every lookup collides
    m = KVCacheManager(16, 2, enable_prefix_caching=True, hash_fn=lambda parent, toks: 42)
    m.allocate("a", [1, 2, 3])
    assert m.allocate("b", [8, 9, 3]) == 0  # same hash, other tokens: a miss, not a wrong hit
    assert m.allocate("c", [1, 2, 3]) == 2  # same tokens: a real hit
    alloc = m.allocator
    for b in alloc.cached_blocks().values():
        assert alloc.block_token_ids(b) == (1, 2)


def test_blocks_filled_by_decode_are_cached_too():
    m = KVCacheManager(8, 2, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3])
    m.append_slot("a", 4)  # block [3, 4] is now full: cached
    m.append_slot("a", 5)
    assert m.allocate("b", [1, 2, 3, 4, 5]) == 4


def test_tables_are_append_only_and_hits_are_counted():
    m = KVCacheManager(8, 2, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3, 4, 5])
    m.allocate("b", [1, 2, 3, 4, 5])
    before = m.block_table("b")
    for t in range(5):
        m.append_slot("b", t)
        assert m.block_table("b")[:len(before)] == before
    alloc = m.allocator
    assert (alloc.hits, alloc.queries) == (2, 4)


def test_allocator_bad_inputs_and_invariants():
    a = PrefixCachingBlockAllocator(3)
    b = a.allocate()
    assert a.register_block(b, 7, ROOT_SERIAL, (1, 2)) == a.serial(b)
    assert a.register_block(b, 8, ROOT_SERIAL, (1, 3)) == BROKEN  # a block carries one hash
    c = a.allocate()
    assert a.register_block(c, 7, ROOT_SERIAL, (1, 2)) == a.serial(b)  # a duplicate: b stands
    assert a.register_block(c, 7, ROOT_SERIAL, (5, 5)) == BROKEN  # a collision
    assert a.register_block(c, 9, BROKEN, (5, 5)) == BROKEN  # a broken chain stays broken
    a.free(b)
    a.free(c)
    assert a.num_free_blocks == 3 and a.num_cached_free_blocks == 1
    a.check_invariants()
    with pytest.raises(ValueError, match="double free"):
        a.free(b)


def test_lazy_lru_queue_matches_a_linked_list_model():
    """The deque with stale entries (lazy removal from the middle, compaction) evicts in exactly
    the order of a real linked list (an OrderedDict model), through many hits on free blocks."""
    import random
    from collections import OrderedDict

    rnd = random.Random(5)
    a = PrefixCachingBlockAllocator(200)
    model: OrderedDict[int, None] = OrderedDict()  # free cached blocks, least recent first
    used: list[int] = []
    compactions = 0
    for step in range(4000):
        op = rnd.random()
        if op < 0.35 and a.num_free_blocks:
            b = a.allocate()
            if b in model:  # evicted: must be the least recently used one
                assert b == next(iter(model)) and len(a._free) == 0
                del model[b]
            a.register_block(b, step, ROOT_SERIAL, (step,))
            used.append(b)
        elif op < 0.7 and used:
            b = used.pop(rnd.randrange(len(used)))
            a.free(b)
            model[b] = None
        elif model:
            b = rnd.choice(list(model))  # a prefix-cache hit on a free block: out of the middle
            stale_before = a._num_stale
            a.touch(b)
            compactions += a._num_stale < stale_before
            del model[b]
            used.append(b)
        assert a.lru_blocks() == list(model)
        assert a.num_cached_free_blocks == len(model)
    a.check_invariants()
    assert compactions > 0  # the stale entries were dropped at least once
