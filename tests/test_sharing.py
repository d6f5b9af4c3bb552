"""fork + copy-on-write (sharing/cow.py), parallel sampling and beam search (sampling.py)."""

from __future__ import annotations

import numpy as np
import pytest
from invariants import check_invariants
from test_kv_cache_stateful import snapshot

from minipaged.paged.block_allocator import OutOfBlocksError
from minipaged.paged.cache_ops import copy_blocks, reshape_and_cache
from minipaged.serving.swap import KVCacheManager
from minipaged.sharing.sampling import (
    BeamSearch,
    Candidate,
    append_group,
    blocks_with_sharing,
    blocks_without_sharing,
    free_group,
    select_beams,
    start_parallel_sampling,
)


def test_fork_shares_every_block_and_copies_nothing():
    m = KVCacheManager(8, 4)
    m.allocate("p", range(6))
    m.fork("p", "c")
    assert m.block_table("c") == m.block_table("p") == [0, 1]
    assert [m.ref_count(b) for b in (0, 1)] == [2, 2]
    assert m.num_free_blocks == 6 and m.take_copies() == []
    check_invariants(m)


def test_copy_on_write_only_for_the_shared_last_block():
    m = KVCacheManager(8, 4)
    m.allocate("p", range(6))  # blocks [0, 1]; block 1 holds 2 of 4 tokens
    m.fork("p", "c")
    slot_c = m.append_slot("c", 9)  # c writes into shared block 1: copy-on-write
    assert m.block_table("c") == [0, 2] and slot_c == 2 * 4 + 2
    assert m.ref_count(1) == 2 and m.ref_count(2) == 1  # p's table + the pending copy's read
    slot_p = m.append_slot("p", 8)  # p is now the only table holding block 1: in place
    assert m.block_table("p") == [0, 1] and slot_p == 1 * 4 + 2
    assert m.take_copies() == [(1, 2)]
    assert m.ref_count(1) == 1  # the copy is handed over: it no longer holds its source
    assert m.take_copies() == []  # taken means cleared
    check_invariants(m)


def test_copy_on_write_keeps_kv_of_both_sides():
    m = KVCacheManager(8, 2)
    kc = np.zeros((8, 1, 2, 1), np.float32)  # [NB, Hkv, BS, D]
    vc = np.zeros_like(kc)
    m.allocate("p", [1])
    reshape_and_cache(np.ones((1, 1, 1), np.float32), np.ones((1, 1, 1), np.float32), kc, vc,
                      m.slot_mapping("p", 0, 1))
    m.fork("p", "c")
    sp, sc = m.append_slot("p", 2), m.append_slot("c", 3)
    copy_blocks(kc, vc, m.take_copies())  # before the step's writes
    for slot, val in ((sp, 2.0), (sc, 3.0)):
        x = np.full((1, 1, 1), val, np.float32)
        reshape_and_cache(x, x, kc, vc, np.array([slot]))
    for s, want in (("p", [1, 2]), ("c", [1, 3])):
        table = m.block_table(s)
        got = [kc[table[i // 2], 0, i % 2, 0] for i in range(2)]
        assert got == want


def test_no_cap_on_sharing():
    # vllm-facts.md: "There is no cap on a block's reference count in vLLM ... 16 is the
    # default block size." 40 children of one parent: 41 users of each block.
    m = KVCacheManager(4, 16)
    m.allocate(0, range(20))
    for c in range(1, 41):
        m.fork(0, c)
    assert m.ref_count(0) == 41 and m.ref_count(1) == 41


def test_copy_source_freed_in_the_same_step_is_not_reused_before_the_copy():
    m = KVCacheManager(3, 4)
    m.allocate("p", range(2))  # block 0, partly filled
    m.fork("p", "c")
    m.append_slot("c", 5)  # copy (0 -> 1) pending
    m.free("p")  # block 0's last table user leaves, but the copy still reads it
    assert m.ref_count(0) == 1 and m.num_free_blocks == 1
    m.allocate("q", range(3))  # must get block 2, not block 0
    assert m.block_table("q") == [2]
    check_invariants(m)
    assert m.take_copies() == [(0, 1)]
    assert m.ref_count(0) == 0 and m.num_free_blocks == 1
    check_invariants(m)


def test_copy_destination_freed_before_the_copy_drops_the_copy():
    m = KVCacheManager(4, 4)
    m.allocate("p", range(2))
    m.fork("p", "c")
    m.append_slot("c", 5)
    m.free("c")
    assert m.take_copies() == []
    check_invariants(m)


def test_blocks_needed_to_append_counts_copies():
    m = KVCacheManager(16, 4)
    m.allocate("p", range(6))
    for c in ("c1", "c2"):
        m.fork("p", c)
    # three writers of a block shared three ways: two copies, the last one writes in place
    assert m.blocks_needed_to_append(["p", "c1", "c2"]) == 2
    assert m.blocks_needed_to_append(["p"]) == 1
    m.allocate("full", range(8))
    assert m.blocks_needed_to_append(["full"]) == 1


def test_fork_bad_inputs():
    m = KVCacheManager(4, 4)
    m.allocate("p", [1])
    before = snapshot(m)
    with pytest.raises(KeyError, match="seq_id='nobody' is not allocated"):
        m.fork("nobody", "c")
    with pytest.raises(ValueError, match="child_seq_id='p' is already allocated"):
        m.fork("p", "p")
    with pytest.raises(TypeError, match=r"child_seq_id=\['c'\] must be hashable"):
        m.fork("p", ["c"])
    assert snapshot(m) == before


def test_fork_and_copy_on_write_with_prefix_caching():
    """Full blocks shared by hash and reference count, the partial last block by reference
    count with copy-on-write; the copy is cached once it becomes full (vLLM v0 allowed both)."""
    m = KVCacheManager(16, 4, enable_prefix_caching=True)
    m.allocate("p", range(6))  # block 0 full (cached), block 1 holds 2 of 4 tokens
    m.fork("p", "c")
    assert m.block_table("c") == m.block_table("p") == [0, 1] and m.ref_count(0) == 2
    m.append_slot("c", 6)  # copy-on-write of block 1
    assert m.take_copies() == [(1, 2)] and m.block_table("c") == [0, 2]
    m.append_slot("c", 7)  # block 2 is now full: cached under the chain hash of range(8)
    alloc = m.allocator
    assert alloc.block_hash(2) is not None and alloc.block_hash(1) is None
    assert m.allocate("q", range(9)) == 8  # a new prompt hits the forked child's copied block
    assert m.block_table("q")[:2] == [0, 2]
    for s in ("p", "c", "q"):
        m.free(s)
    assert m.num_free_blocks == 16
    check_invariants(m)


def test_a_pending_copy_holds_its_source_and_a_dropped_copy_releases_it():
    m = KVCacheManager(4, 4)
    m.allocate("p", range(2))
    m.fork("p", "c")
    m.append_slot("c", 5)  # copy 0 -> 1 pending
    assert m.ref_count(0) == 2  # p's table + the pending copy
    m.free("c")  # the destination's only user leaves: nobody will read the copy
    assert m.take_copies() == [] and m.ref_count(0) == 1 and m.ref_count(1) == 0
    check_invariants(m)


@pytest.mark.parametrize("prefix", [False, True])
def test_parallel_sampling_shares_the_prompt(prefix):
    m = KVCacheManager(32, 4, enable_prefix_caching=prefix)
    prompt = list(range(10))  # 2 full blocks + a partial one
    group, computed = start_parallel_sampling(m, "r", prompt, n=4)
    assert len(group.seq_ids) == 4
    if prefix:  # v1: full blocks shared, partial block private, no fork
        assert list(computed.values()) == [0, 8, 8, 8]
        assert blocks_with_sharing(m, group.seq_ids) == 2 + 4
    else:  # v0: every block shared, the children need no prefill
        assert list(computed.values()) == [0, 10, 10, 10]
        assert blocks_with_sharing(m, group.seq_ids) == 3
    assert blocks_without_sharing(m, group.seq_ids) == 12
    slots = append_group(m, group, {s: 1 for s in group.seq_ids})
    assert len(set(slots.values())) == 4  # every sample writes its own slot
    m.take_copies()
    free_group(m, group)
    assert m.num_free_blocks == 32 and group.seq_ids == []


def test_parallel_sampling_is_all_or_nothing():
    m = KVCacheManager(4, 4, enable_prefix_caching=True)
    with pytest.raises(OutOfBlocksError):
        start_parallel_sampling(m, "r", range(10), n=3)  # 3 + 1 + 1 blocks > 4
    assert m.seq_ids == [] and m.num_free_blocks == 4
    with pytest.raises(ValueError, match="n=0"):
        start_parallel_sampling(m, "r", [1], n=0)
    with pytest.raises(TypeError, match="n=True"):
        start_parallel_sampling(m, "r", [1], n=True)


def test_parallel_sampling_that_fails_evicts_no_cached_prefix():
    m = KVCacheManager(5, 4, enable_prefix_caching=True)
    m.allocate("old", range(100, 108))  # two full blocks, cached
    m.free("old")  # ... and free: they wait in the free queue, still hits
    before = snapshot(m)
    with pytest.raises(OutOfBlocksError) as e:  # 3 blocks + 1 per further sample > 5 free
        start_parallel_sampling(m, "r", range(10), n=4)
    assert (e.value.needed, e.value.free) == (6, 5)
    assert snapshot(m) == before and m.allocator.evictions == 0
    assert m.allocate("again", range(100, 109)) == 8


@pytest.mark.parametrize("prefix", [False, True])
def test_parallel_sampling_by_fork_in_both_modes(prefix):
    m = KVCacheManager(32, 4, enable_prefix_caching=prefix)
    group, computed = start_parallel_sampling(m, "r", range(10), n=3, by_fork=True)
    assert list(computed.values()) == [0, 10, 10] and blocks_with_sharing(m, group.seq_ids) == 3
    append_group(m, group, {s: 1 for s in group.seq_ids})
    assert len(m.take_copies()) == 2  # the last writer of the shared block keeps it
    check_invariants(m)
    free_group(m, group)
    assert m.num_free_blocks == 32


def test_append_group_checks_room_first():
    m = KVCacheManager(3, 2)
    group, _ = start_parallel_sampling(m, "r", [1], n=3)  # one block, shared three ways
    m.allocate("other", [1, 2])
    with pytest.raises(OutOfBlocksError, match="needed 2"):
        append_group(m, group, {s: 0 for s in group.seq_ids})
    assert [m.seq_len(s) for s in group.seq_ids] == [1, 1, 1]
    with pytest.raises(ValueError, match="one token for each"):
        append_group(m, group, {})
    before = snapshot(m)
    with pytest.raises(ValueError, match=r"tokens\[\('r', 2\)\]=-1"):
        append_group(m, group, {("r", 0): 1, ("r", 1): 2, ("r", 2): -1})
    assert snapshot(m) == before


@pytest.mark.parametrize("prefix", [False, True])
def test_beam_search_forks_survivors_and_frees_dropped_beams(prefix):
    m = KVCacheManager(32, 2, enable_prefix_caching=prefix)
    bs = BeamSearch(m, "r", [5, 6, 7], width=2)
    (root,) = bs.beams
    bs.step([Candidate(root, 1, -0.1), Candidate(root, 2, -0.2), Candidate(root, 3, -5.0)])
    a, b = bs.beams
    assert m.block_table(a)[0] == m.block_table(b)[0]  # the full prompt block is shared
    m.take_copies()
    # both survivors come from beam a: b is dropped, a is forked
    bs.step([Candidate(a, 4, -0.3), Candidate(a, 5, -0.4), Candidate(b, 6, -9.0)])
    assert b not in bs.beams and len(bs.beams) == 2
    assert bs.beams[0] == a  # the forked child is listed right after its parent
    m.take_copies()
    check_invariants(m)
    out = bs.finish()
    assert sorted(out.values()) == [[5, 6, 7, 1, 4], [5, 6, 7, 1, 5]]
    assert m.num_free_blocks == 32
    with pytest.raises(ValueError, match="width=0"):
        BeamSearch(m, "x", [1], width=0)


def test_select_beams_is_one_rule_for_the_lesson_and_the_engine():
    """The best 2 * width by score, ties in the order given; <eos> ones finish, the first width
    others survive. Without an end token (the lesson's BeamSearch) that is the width best."""
    c = [Candidate("a", 1, -2.0), Candidate("b", 9, -1.0), Candidate("a", 2, -1.0),
         Candidate("b", 3, -0.5), Candidate("a", 4, -3.0)]
    assert select_beams(c, 2) == ([c[3], c[1]], [])
    survivors, finished = select_beams(c, 2, eos_id=9)
    assert survivors == [c[3], c[2]] and finished == [c[1]]   # c[0] (4th) comes too late
    assert select_beams(c, 1, eos_id=3) == ([c[1]], [c[3]])


@pytest.mark.parametrize("bad, exc, words", [
    (Candidate(("r", 99), 1, 0.0), ValueError, "not a live beam"),
    (Candidate(("r", 0), -3, 0.0), ValueError, r"candidates\[1\].token=-3"),
    (Candidate(("r", 0), 1.5, 0.0), TypeError, r"candidates\[1\].token=1.5"),
    (Candidate(("r", 0), 1, float("nan")), ValueError, r"candidates\[1\].score=nan"),
    (Candidate(("r", 0), 1, "high"), TypeError, r"candidates\[1\].score='high'"),
    ((("r", 0), 1, 0.0), TypeError, "must be a Candidate"),
])
def test_beam_search_step_checks_every_candidate_before_changing_anything(bad, exc, words):
    m = KVCacheManager(8, 2)
    beam = BeamSearch(m, "r", [1, 2, 3], width=2)
    beam.step([Candidate(("r", 0), 4, -1.0), Candidate(("r", 0), 5, -2.0)])
    m.take_copies()
    before, beams, scores = snapshot(m), beam.beams, dict(beam.scores)
    with pytest.raises(exc, match=words):  # a good candidate first, then the bad one
        beam.step([Candidate(("r", 0), 6, -0.5), bad, Candidate(("r", 1), 7, -0.7)])
    assert snapshot(m) == before and beam.beams == beams and beam.scores == scores
    with pytest.raises(ValueError, match="candidates is empty"):
        beam.step([])


def test_usage_counts_shared_blocks_once():
    m = KVCacheManager(10, 4)
    m.allocate("p", range(6))  # blocks [0, 1]: 6 tokens
    for c in ("c1", "c2"):
        m.fork("p", c)
    u = m.usage()
    # 2 physical blocks in use, 6 token states in them, 2 unfilled slots: counted once each
    assert (u.token, u.internal_fragmentation, u.free) == (6, 2, 32)
    u = m.usage({"p": 7, "c1": 8, "c2": 6})  # the longest user decides what is reserved
    assert (u.token, u.reserved, u.internal_fragmentation) == (6, 2, 0)
    m.append_slot("c1", 1)  # copy-on-write: a third block, 7 tokens in it for c1
    u = m.usage()
    assert u.used == 3 * 4 and u.token == 6 + 3
