"""Prefix caching: chained hashes, token-checked hits, one free queue in eviction order."""

from __future__ import annotations

import random

import pytest
from invariants import check_invariants
from test_kv_cache_stateful import snapshot

from minipaged.paged.block_allocator import OutOfBlocksError
from minipaged.serving.swap import KVCacheManager
from minipaged.sharing.prefix_cache import PrefixCachingBlockAllocator


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
    m.allocate("b", [5, 6, 7, 8, 9])
    # block [5, 6] hits b's; block [3, 4] equals a's second block, but a's came after [1, 2]
    assert m.allocate("c", [5, 6, 3, 4, 9]) == 2
    # The test can fail: a hash of the block's own tokens only (not chained) would hit both.
    unchained = KVCacheManager(16, 2, enable_prefix_caching=True,
                               hash_fn=lambda parent, tokens: hash(tokens))
    unchained.allocate("a", [1, 2, 3, 4, 9])
    unchained.allocate("b", [5, 6, 7, 8, 9])
    assert unchained.allocate("c", [5, 6, 3, 4, 9]) == 4


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
    assert alloc.lru_blocks() == alloc.free_queue() == [1, 0, 3, 2]
    m.allocate("z", [7])  # no block without a hash left: evicts block 1 ([1, 2], least recent)
    assert alloc.evictions == 1 and alloc.block_hash(1) is not None  # now z's block [7]
    m.free("z")
    assert m.allocate("a2", [1, 2, 3]) == 1  # [1] still cached, [1, 2] gone


def test_free_puts_blocks_without_a_hash_at_the_head():
    """vLLM 0.32 (vllm/v1/core/block_pool.py free_blocks): a freed block that no prompt can hit
    is reused first; cached ones wait at the tail, least recently used first."""
    m = KVCacheManager(6, 4, enable_prefix_caching=True)
    m.allocate("a", range(6))  # block 0 full and cached, block 1 partial
    m.allocate("b", range(50, 62))  # blocks 2, 3, 4: all full, all cached
    m.free("a")
    assert m.allocator.free_queue() == [1, 5, 0]
    m.free("b")
    assert m.allocator.free_queue() == [1, 5, 0, 4, 3, 2]
    assert m.allocator.lru_blocks() == [0, 4, 3, 2]
    m.allocate("c", range(100, 108))  # two blocks: 1 and 5, nothing evicted
    assert m.block_table("c") == [1, 5] and m.allocator.evictions == 0


def test_a_block_computed_twice_stays_cached_twice():
    """Duplicates are kept, as in vLLM (block_pool.py cache_full_blocks): the copy still hits
    after the first one is evicted."""
    m = KVCacheManager(4, 4, enable_prefix_caching=True)
    m.allocate("a", range(8))  # blocks 0, 1
    assert m.allocate("b", range(8)) == 4  # the last token's block is recomputed: block 2
    alloc = m.allocator
    assert alloc.block_hash(2) == alloc.block_hash(1) is not None
    assert alloc.cached_blocks()[alloc.block_hash(1)] == 1  # a lookup returns the earliest
    m.free("a")
    m.free("b")
    m.allocate("x", range(50, 53))  # block 3, never cached
    m.allocate("y", range(60, 63))  # evicts block 1, the least recently used
    assert alloc.block_hash(1) is None and alloc.evictions == 1
    m.free("x")
    m.free("y")
    assert m.allocate("c", range(9)) == 8 and m.block_table("c")[:2] == [0, 2]
    check_invariants(m)


def test_a_reply_fed_back_as_the_next_prompt_hits_every_full_block():
    m = KVCacheManager(32, 2, enable_prefix_caching=True)
    turn1 = [1, 2, 3, 4]
    m.allocate("t1", turn1)
    for t in (5, 6, 7):  # the reply, decoded: block [5, 6] is cached when it fills
        m.append_slot("t1", t)
    m.free("t1")
    turn2 = turn1 + [5, 6, 7] + [8, 9]
    assert m.allocate("t2", turn2) == 6  # [1, 2], [3, 4], [5, 6]; [7, 8] was never full


def test_allocate_counts_hits_in_the_lru_queue_as_not_free():
    m = KVCacheManager(3, 2, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3, 4, 5])
    m.free("a")  # 3 free, 2 of them cached
    with pytest.raises(OutOfBlocksError) as e:
        m.allocate("b", [1, 2, 3, 4, 5, 6, 7, 8, 9])  # 2 hits + 3 new > 3 - 2 + ...
    assert (e.value.needed, e.value.free) == (3, 1)
    assert m.seq_ids == [] and m.num_free_blocks == 3 and m.allocator.num_cached_free_blocks == 2
    check_invariants(m)


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
    a.cache_block(b, 7, (1, 2))
    with pytest.raises(ValueError, match="not cached yet"):
        a.cache_block(b, 8, (1, 3))  # a block carries one hash
    with pytest.raises(ValueError, match="must be in use"):
        a.cache_block(2, 9, (5, 5))  # a free block holds no K/V of ours
    assert a.lookup(7, (1, 2)) == b and a.lookup(7, (5, 5)) is None  # tokens are compared
    a.free(b)
    assert a.num_free_blocks == 3 and a.num_cached_free_blocks == 1
    check_invariants(a)
    with pytest.raises(ValueError, match="double free"):
        a.free(b)


def test_a_hash_fn_that_fails_changes_nothing():
    def hash_fn(parent, tokens):  # like sha256(bytes(tokens)): fails on a token >= 256
        return hash((parent, bytes(tokens)))

    m = KVCacheManager(8, 2, enable_prefix_caching=True, hash_fn=hash_fn)
    m.allocate("a", [1, 2, 3])
    before = snapshot(m)
    with pytest.raises(ValueError, match="bytes must be in range"):
        m.append_slot("a", 300)  # fills block [3, 300]: hashed before anything changes
    with pytest.raises(ValueError, match="bytes must be in range"):
        m.allocate("b", [1, 2, 999, 4])
    assert snapshot(m) == before and m.token_ids("a") == [1, 2, 3]
    m.append_slot("a", 4)
    assert m.allocate("c", [1, 2, 3, 4, 5]) == 4
    bad = KVCacheManager(8, 2, enable_prefix_caching=True, hash_fn=lambda p, t: [p, t])
    with pytest.raises(TypeError, match="hash_fn returned .* not hashable"):
        bad.allocate("a", [1, 2, 3])
    assert bad.seq_ids == [] and bad.num_free_blocks == 8
    with pytest.raises(TypeError, match="hash_fn=42 must be callable"):
        KVCacheManager(8, 2, enable_prefix_caching=True, hash_fn=42)


def test_free_queue_matches_a_plain_list_model():
    """The OrderedDict queue against the rules written out on a plain list (O(NB) each):
    allocate pops the head (evicting a cached block), free appends a cached block at the tail
    and puts the others at the head, a hit takes a free block out of the middle."""
    rnd = random.Random(5)
    a = PrefixCachingBlockAllocator(50)
    model = list(range(50))  # the free queue, head first
    cached: set[int] = set()
    used: list[int] = []
    for step in range(3000):
        op = rnd.random()
        if op < 0.35 and model:
            b = a.allocate()
            assert b == model.pop(0)
            cached.discard(b)
            if rnd.random() < 0.7:
                a.cache_block(b, step, (step,))
                cached.add(b)
            used.append(b)
        elif op < 0.7 and used:
            freed = [used.pop(rnd.randrange(len(used))) for _ in range(min(3, len(used)))]
            a.free_many(freed)
            model = [b for b in freed if b not in cached] + model
            model += [b for b in freed if b in cached]
        elif cached & set(model):
            b = rnd.choice(sorted(cached & set(model)))  # a prefix-cache hit on a free block
            a.touch([b])
            model.remove(b)
            used.append(b)
        assert a.free_queue() == model
        assert a.lru_blocks() == [b for b in model if b in cached]
    check_invariants(a)


def test_blocks_are_found_only_once_their_kv_are_computed():
    """Chunked prefill: a prompt allocated with cache=False is findable block by block as
    cache_blocks says its K/V are written, never before (vLLM caches computed blocks only)."""
    from minipaged import KVCacheManager

    bs, prompt = 4, list(range(1, 18))          # 17 tokens: 4 full blocks
    m = KVCacheManager(32, bs, enable_prefix_caching=True)
    assert m.allocate("a", prompt, cache=False) == 0
    assert m.allocate("b", prompt, cache=False) == 0  # nothing of "a" is computed yet
    m.free("b")                                  # b computed nothing either: nothing cached
    m.cache_blocks("a", 9)                       # the first chunk wrote tokens 0..8
    assert m.allocate("c", prompt) == 2 * bs     # two full blocks are computed
    m.cache_blocks("a", len(prompt))
    assert m.allocate("d", prompt) == 4 * bs     # (n - 1) // BS = 4 hits at most
    check_invariants(m)
    with pytest.raises(ValueError, match="num_computed_tokens=18 is out of range"):
        m.cache_blocks("a", 18)


def test_no_append_or_fork_before_the_prompt_kv_are_computed():
    # Appending to a prompt allocated with cache=False would fill, and cache, a block whose
    # earlier tokens have no K/V yet; a later prompt would hit it. Both calls refuse instead.
    m = KVCacheManager(8, 4, enable_prefix_caching=True)
    m.allocate("a", [1, 2, 3], cache=False)
    before = snapshot(m)
    for call in (lambda: m.append_slot("a", 4), lambda: m.fork("a", "b")):
        with pytest.raises(ValueError, match="has K/V for 0 of its 3 tokens"):
            call()
        assert snapshot(m) == before
    m.cache_blocks("a", 3)
    m.append_slot("a", 4)  # fills block 0, now cached: its K/V are all written
    assert m.allocate("c", [1, 2, 3, 4, 5]) == 4
    check_invariants(m)
