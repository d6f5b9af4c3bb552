"""Stateful tests of sharing: fork + copy-on-write, prefix caching (with fork and copy-on-write
too), eviction, swap, recompute.

Three machines drive a KVCacheManager, a NumPy paged cache and a CPU block pool with real K/V,
next to a dense model: the list of K/V rows each live sequence should see. Steps follow an
engine's order: operations record the K/V writes a step would make; ``flush`` then applies the
pending copy-on-write copies (``take_copies`` + ``copy_blocks``) and only then the writes.

Invariants, checked after every step or at every flush (prose here, code in the machines):
    S1  the core invariants (``check_invariants`` of every stage): tables hold ceil(len / BS)
        entries, reference counts equal the table entries pointing at a block plus the pending
        copies reading it, free + used = total, the free queue in eviction order, every full
        block of a table cached under its chain hash; CPU reference counts = CPU table entries;
    S2  a block held by more than one user is never written (checked at every write);
    S3  every live sequence's logical K/V equal what was written for it: paged attention over
        the cache equals dense attention over the model, bit for bit (so no operation on one
        sequence changed another's K/V, copies landed where they should, swaps round-trip);
    S4  a swap-out / swap-in round trip leaves attention outputs bit-identical;
    S5  a prefix-cache hit yields attention bit-identical to a cold run (the dense model is the
        cold run: the K/V of a token are a function of its whole prefix, as in a real model);
    S6  the hash table never maps to a block whose tokens differ from what was written there,
        and a hit serves blocks holding exactly the prompt's tokens;
    S7  full blocks never leave a table while its sequence stays on the GPU: a table only grows,
        or replaces its partly filled last block by a copy (copy-on-write);
    S8  freeing everything returns every GPU and CPU block to free;
    S9  OutOfBlocksError (allocate, append, swap in/out) leaves the manager unchanged;
    S10 until the copies are taken, a copy's source stays allocated (it cannot be handed out
        and overwritten before it is read) and its destination belongs to exactly one sequence;
    S11 the O(#sequences) ``usage`` equals its block-by-block oracle ``usage_slow`` (shared
        blocks counted once), with and without planned final lengths.
With a hash function that collides on purpose, S5 cannot hold (two prefixes with colliding
chain hashes followed by equal tokens match: the risk vLLM and nano-vllm accept too); that
machine checks everything else, S6 included, with the model taking a hit's K/V as served.

The machine's K/V model, its state and the rules that share (allocate, append, fork, free,
check attention), with the invariants, are SharingBase in tests/sharing_machine.py; here
SharingMachine adds the rules that preempt and readmit, and the three machines are run.
"""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule
from sharing_machine import D, H, SharingBase, attention_outputs
from test_kv_cache_stateful import snapshot

from minipaged.paged.block_allocator import OutOfBlocksError


class SharingMachine(SharingBase):
    """SharingBase and preemption: swap out, swap in, a swap round trip, recompute, readmission
    of a recomputed sequence."""

    @precondition(lambda self: self.readmit)
    @rule(data=st.data())
    def readmit_recomputed(self, data):
        self.flush()
        sid = data.draw(st.sampled_from(sorted(self.readmit)))
        if self._admit(sid, self.readmit[sid]):
            del self.readmit[sid]

    @precondition(lambda self: any(not self.mgr.is_swapped(s) for s in self.model))
    @rule(data=st.data())
    def swap_out(self, data):
        self.flush()
        group = data.draw(st.lists(st.sampled_from(self._gpu_seqs()), min_size=1, unique=True))
        before = snapshot(self.mgr)
        try:
            mapping = self.mgr.swap_out(group)
        except OutOfBlocksError as e:
            assert e.needed > e.free and snapshot(self.mgr) == before  # S9
            return
        self.pool.copy_out(self.kc, self.vc, mapping)
        for s in group:
            self.tables_seen.pop(s, None)

    @precondition(lambda self: self.mgr.swapped_seq_ids if hasattr(self, "mgr") else False)
    @rule(data=st.data())
    def swap_in(self, data):
        self.flush()
        group = data.draw(st.lists(st.sampled_from(sorted(self.mgr.swapped_seq_ids, key=repr)),
                                   min_size=1, unique=True))
        before = snapshot(self.mgr)
        try:
            mapping = self.mgr.swap_in(group)
        except OutOfBlocksError as e:
            assert e.needed > e.free and snapshot(self.mgr) == before  # S9
            return
        self.pool.copy_in(self.kc, self.vc, mapping)
        for _cpu, g in mapping:  # the tokens in the copied blocks travel with them
            self.slot_tokens[g] = [None] * self.mgr.block_size
        for s in group:
            table = self.mgr.block_table(s)
            for p, t in enumerate(self.mgr.token_ids(s)):
                self.slot_tokens[table[p // self.mgr.block_size]][p % self.mgr.block_size] = t
            self._seen(s)

    @precondition(lambda self: any(not self.mgr.is_swapped(s) for s in self.model))
    @rule(data=st.data())
    def swap_round_trip(self, data):
        self.flush()
        group = data.draw(st.lists(st.sampled_from(self._gpu_seqs()), min_size=1, unique=True))
        q = np.random.default_rng(1).standard_normal((len(group), H, D)).astype(np.float32)
        before = attention_outputs(self.kc, self.vc, self.mgr, group, q)
        if not self.mgr.can_swap_out(group):
            return
        self.pool.copy_out(self.kc, self.vc, self.mgr.swap_out(group))
        if not self.mgr.can_swap_in(group):
            return  # stays swapped out; other rules may bring it back
        self.pool.copy_in(self.kc, self.vc, self.mgr.swap_in(group))
        after = attention_outputs(self.kc, self.vc, self.mgr, group, q)
        assert np.array_equal(before, after)  # S4
        for s in group:
            self._seen(s)
            table = self.mgr.block_table(s)
            for p, t in enumerate(self.mgr.token_ids(s)):
                bs = self.mgr.block_size
                self.slot_tokens.setdefault(table[p // bs], [None] * bs)[p % bs] = t

    @precondition(lambda self: any(not self.mgr.is_swapped(s) for s in self.model))
    @rule(data=st.data())
    def preempt_by_recompute(self, data):
        self.flush()
        group = data.draw(st.lists(st.sampled_from(self._gpu_seqs()), min_size=1, unique=True))
        expected = {s: self.mgr.token_ids(s) for s in group}
        tokens = self.mgr.preempt_by_recompute(group)
        assert tokens == expected
        for s in group:
            assert s not in self.mgr.seq_ids
            del self.model[s]
            self.tables_seen.pop(s, None)
        self.readmit.update(tokens)


class PrefixCachingMachine(SharingMachine):
    prefix_mode = True


def colliding_hash(parent: int, token_ids: tuple[int, ...]) -> int:
    """A terrible hash on purpose: it keeps only the parity of the parent's hash and 3 bits
    in all, so different blocks collide all the time. A hit still serves only blocks holding
    the prompt's own tokens (S6: the token ids are compared), and nothing else breaks."""
    return hash((parent % 2, token_ids)) % 8


class CollidingHashMachine(PrefixCachingMachine):
    hash_fn = staticmethod(colliding_hash)
    exact_hash = False


SharingMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=35)
PrefixCachingMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=35)
CollidingHashMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=35)
TestCopyOnWrite = SharingMachine.TestCase
TestPrefixCaching = PrefixCachingMachine.TestCase
TestPrefixCachingUnderCollisions = CollidingHashMachine.TestCase
