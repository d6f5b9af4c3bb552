"""Stateful test of the paged block manager (allocate / append_slot / free), real K/V written.

A Hypothesis RuleBasedStateMachine drives a manager and a NumPy paged cache side by side with a
plain dense model: for each live sequence, the list of K/V rows written for it, in order.
Invariants checked after every step (in prose, then in code below):

    I1  no physical block appears in two live sequences' tables (there is no sharing here), nor
        twice in one table;
    I2  free blocks + blocks in use = num_blocks;
    I3  every block's reference count equals the number of table entries pointing at it;
    I4  each block table has exactly ceil(len / block_size) entries;
    I5  every live sequence's K/V, read back through its block table, equals exactly what was
        written for it: so no operation on one sequence ever changed another's K/V;
    I6  OutOfBlocksError leaves the manager exactly as it was, and says needed > free; so does
        every call with a bad argument (unhashable or unknown seq_id, a negative, float or bool
        token id), which raises a clear error;
    I7  freeing every sequence returns the pool to full;
    I8  the O(#sequences) ``usage`` equals its block-by-block oracle ``usage_slow``, with and
        without planned final lengths;
    I9  paged attention over the cache equals dense attention over each sequence's own K/V,
        bit for bit.
"""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from invariants import check_invariants

from minipaged.attention import dense_attention
from minipaged.paged.block_allocator import OutOfBlocksError
from minipaged.paged.block_manager import BlockManager
from minipaged.paged.cache_ops import reshape_and_cache
from minipaged.paged.paged_attention import paged_attention
from minipaged.serving.swap import KVCacheManager


def gather_kv(key_cache: np.ndarray, value_cache: np.ndarray, table: list[int],
              seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Logical K/V [T, Hkv, D] of one sequence, read slot by slot (an obvious oracle)."""
    bs = key_cache.shape[2]
    k = np.stack([key_cache[table[p // bs], :, p % bs, :] for p in range(seq_len)])
    v = np.stack([value_cache[table[p // bs], :, p % bs, :] for p in range(seq_len)])
    return k, v


def snapshot(mgr) -> tuple:
    """Everything observable about a manager of any stage (tables, tokens, counts, the free
    order, pending copies, the prefix cache, the CPU pool), to check that a failed call
    changed nothing."""
    seqs = sorted(mgr.seq_ids, key=repr)
    swapped = set(getattr(mgr, "swapped_seq_ids", ()))
    alloc, cpu = mgr.allocator, getattr(mgr, "cpu_allocator", None)
    return (
        {s: mgr.token_ids(s) for s in seqs},
        {s: mgr.block_table(s) for s in seqs if s not in swapped},
        {s: mgr.cpu_block_table(s) for s in swapped},
        [mgr.ref_count(b) for b in range(mgr.num_blocks)],
        alloc.free_queue(),
        getattr(mgr, "pending_copies", None),
        (alloc.cached_blocks(), alloc.hits, alloc.queries, alloc.evictions)
        if hasattr(alloc, "cached_blocks") else None,
        None if cpu is None else (cpu.free_queue(), [cpu.ref_count(c)
                                                     for c in range(cpu.num_blocks)]),
    )


class PagedCacheMachine(RuleBasedStateMachine):
    manager_class: type = BlockManager  # the lesson-03 manager; below, the complete one too

    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    @initialize(num_blocks=st.integers(1, 16), block_size=st.sampled_from([1, 2, 3, 4, 8]),
                hkv=st.integers(1, 2), d=st.sampled_from([1, 4]))
    def setup(self, num_blocks: int, block_size: int, hkv: int, d: int) -> None:
        self.mgr = self.manager_class(num_blocks, block_size)
        shape = (num_blocks, hkv, block_size, d)  # [NB, Hkv, BS, D]
        # NaN in every slot never written: reading one would poison the comparison.
        self.kc = np.full(shape, np.nan, dtype=np.float32)
        self.vc = np.full(shape, np.nan, dtype=np.float32)
        self.model: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self.next_id = 0

    def _fresh_kv(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(self.writes)
        self.writes += 1
        shape = (t, self.kc.shape[1], self.kc.shape[3])  # [T, Hkv, D]
        return (rng.standard_normal(shape).astype(np.float32),
                rng.standard_normal(shape).astype(np.float32))

    @rule(n=st.integers(1, 20))
    def allocate(self, n: int) -> None:
        sid = self.next_id
        self.next_id += 1
        before = snapshot(self.mgr)
        try:
            computed = self.mgr.allocate(sid, list(range(n)))
        except OutOfBlocksError as e:
            assert e.needed > e.free == self.mgr.num_free_blocks  # I6
            assert snapshot(self.mgr) == before
            return
        assert computed == 0  # no prefix caching: nothing is ever already computed
        k, v = self._fresh_kv(n)
        reshape_and_cache(k, v, self.kc, self.vc, self.mgr.slot_mapping(sid, 0, n))
        self.model[sid] = (list(k), list(v))

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def append(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.model)))
        before = snapshot(self.mgr)
        try:
            slot = self.mgr.append_slot(sid, 7)
        except OutOfBlocksError as e:
            assert e.needed > e.free == self.mgr.num_free_blocks  # I6
            assert snapshot(self.mgr) == before
            return
        n = self.mgr.seq_len(sid)
        assert slot == self.mgr.slot_mapping(sid, n - 1, n)[0]
        k, v = self._fresh_kv(1)
        reshape_and_cache(k, v, self.kc, self.vc, np.array([slot]))
        self.model[sid][0].append(k[0])
        self.model[sid][1].append(v[0])

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.model)))
        self.mgr.free(sid)
        del self.model[sid]

    @rule(data=st.data(), bad=st.sampled_from([-1, 2.0, True, "7", None]))
    def bad_call(self, data: st.DataObject, bad: object) -> None:
        sid = data.draw(st.sampled_from(sorted(self.model) or [0]))
        before = snapshot(self.mgr)
        calls = [lambda: self.mgr.append_slot(sid, bad), lambda: self.mgr.allocate(10**6, [bad]),
                 lambda: self.mgr.allocate([sid], [1]), lambda: self.mgr.append_slot(-5, 1),
                 lambda: self.mgr.free("nobody"), lambda: self.mgr.slot_mapping(sid, 0, bad)]
        for call in calls:  # I6: each raises a clear error and changes nothing
            try:
                call()
            except (TypeError, ValueError, KeyError) as e:
                assert str(e)
            else:
                raise AssertionError("a bad call was accepted")
            assert snapshot(self.mgr) == before

    @precondition(lambda self: self.model)
    @rule()
    def attention_matches_dense(self) -> None:
        seqs = sorted(self.model)
        hkv, d = self.kc.shape[1], self.kc.shape[3]
        q = np.random.default_rng(len(seqs)).standard_normal((len(seqs), 2 * hkv, d))
        q = q.astype(np.float32)  # [S, H, D], two query heads per KV head
        lens = np.array([self.mgr.seq_len(s) for s in seqs], dtype=np.int32)
        got = paged_attention(q, self.kc, self.vc, self.mgr.block_tables(seqs), lens,
                              method="gather")
        for i, s in enumerate(seqs):  # I9
            want = dense_attention(q[i:i + 1], np.stack(self.model[s][0]),
                                   np.stack(self.model[s][1]))
            assert np.array_equal(got[i:i + 1], want)

    @invariant()
    def blocks_are_consistent(self) -> None:
        if not hasattr(self, "mgr"):
            return
        mgr, bs = self.mgr, self.mgr.block_size
        owner: dict[int, int] = {}
        for sid in self.model:
            table = mgr.block_table(sid)
            assert len(table) == -(-mgr.seq_len(sid) // bs)  # I4
            for b in table:
                assert b not in owner, f"block {b} in seq {owner.get(b)} and seq {sid}"  # I1
                owner[b] = sid
        assert mgr.num_free_blocks + len(owner) == mgr.num_blocks  # I2
        for b in range(mgr.num_blocks):
            assert mgr.ref_count(b) == (1 if b in owner else 0)  # I3
        check_invariants(mgr)
        finals = {sid: mgr.seq_len(sid) + sid % 7 for sid in self.model}
        assert mgr.usage() == mgr.usage_slow() and mgr.usage(finals) == mgr.usage_slow(finals)  # I8

    @invariant()
    def kv_is_what_was_written(self) -> None:
        if not hasattr(self, "mgr"):
            return
        for sid, (ks, vs) in self.model.items():  # I5
            k, v = gather_kv(self.kc, self.vc, self.mgr.block_table(sid), self.mgr.seq_len(sid))
            assert np.array_equal(k, np.stack(ks)) and np.array_equal(v, np.stack(vs))

    def teardown(self) -> None:
        if not hasattr(self, "mgr"):
            return
        for sid in list(self.model):
            self.mgr.free(sid)
        assert self.mgr.num_free_blocks == self.mgr.num_blocks  # I7
        check_invariants(self.mgr)


class CompleteManagerMachine(PagedCacheMachine):
    """The same walk through ``KVCacheManager``: without fork or prefix caching every later
    stage must behave exactly like the plain paged manager."""

    manager_class = KVCacheManager


PagedCacheMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=30)
CompleteManagerMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=30)
TestPagedCache = PagedCacheMachine.TestCase
TestCompleteManager = CompleteManagerMachine.TestCase
