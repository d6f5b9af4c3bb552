"""The sharing machine's base: its K/V model, its state, the rules that share, and the invariants.

``SharingBase`` drives a KVCacheManager, a NumPy paged cache and a CPU block pool with real K/V,
next to a dense model: the list of K/V rows each live sequence should see. Its rules allocate
(with prefix-cache hits when ``prefix_mode`` is on), append, fork and free, and compare paged
attention with dense attention; its invariants run after every step. SharingMachine in
tests/test_sharing_stateful.py adds the rules that preempt (swap out and in, recompute, readmit),
and that file states the invariants S1-S11 they check together.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from invariants import check_invariants
from test_kv_cache_stateful import snapshot

from minipaged.attention import dense_attention
from minipaged.paged.block_allocator import OutOfBlocksError
from minipaged.paged.cache_ops import copy_blocks, reshape_and_cache
from minipaged.paged.paged_attention import paged_attention
from minipaged.serving.swap import CPUBlockPool, KVCacheManager

HKV, D, H = 2, 4, 4
STEMS = [(), (1, 2, 3, 1, 2, 3, 1), (1, 2, 3, 1, 2, 0, 0, 2, 2, 1, 0, 3)]


def prefix_kv(prev_key: int, token: int) -> tuple[int, np.ndarray, np.ndarray]:
    """K/V of a token as a function of its whole prefix (a chain key), like a real model."""
    key = hash((prev_key, token)) & 0xFFFFFFFF
    kv = np.random.default_rng(key).standard_normal((2, HKV, D)).astype(np.float32)
    return key, kv[0], kv[1]


def attention_outputs(kc, vc, mgr, seqs, q):
    """Paged decode attention for ``seqs`` (one query row each): [S, H, D]."""
    tables = mgr.block_tables(seqs)
    lens = np.array([mgr.seq_len(s) for s in seqs], dtype=np.int32)
    return paged_attention(q, kc, vc, tables, lens, method="gather")


def dense_outputs(model, seqs, q):
    """Dense attention over each sequence's model K/V: the cold-run reference, [S, H, D]."""
    return np.concatenate([dense_attention(q[i:i + 1], np.stack(model[s][0]),
                                           np.stack(model[s][1])) for i, s in enumerate(seqs)])


class SharingBase(RuleBasedStateMachine):
    """SharingMachine without the preemption rules (tests/test_sharing_stateful.py)."""

    prefix_mode = False
    hash_fn = None
    exact_hash = True  # False: hits may serve another prefix's K/V (equal tokens, S6 only)

    @initialize(num_blocks=st.integers(2, 14), block_size=st.sampled_from([1, 2, 3, 4]),
                num_cpu_blocks=st.integers(1, 10))
    def setup(self, num_blocks, block_size, num_cpu_blocks):
        self.mgr = KVCacheManager(num_blocks, block_size, num_cpu_blocks=num_cpu_blocks,
                                  enable_prefix_caching=self.prefix_mode,
                                  hash_fn=type(self).hash_fn)
        shape = (num_blocks, HKV, block_size, D)  # [NB, Hkv, BS, D]
        self.kc = np.full(shape, np.nan, np.float32)
        self.vc = np.full(shape, np.nan, np.float32)
        self.pool = CPUBlockPool(num_cpu_blocks, HKV, block_size, D, np.float32)
        self.model: dict[int, tuple[list, list, list]] = {}  # seq -> (K rows, V rows, chain keys)
        self.slot_tokens: dict[int, list] = {}  # block -> token id written at each offset
        self.pending: list[tuple[int, int, int, np.ndarray, np.ndarray]] = []
        self.readmit: dict[int, list[int]] = {}  # recomputed seqs waiting for re-prefill
        self.tables_seen: dict[int, tuple[list[int], int]] = {}  # seq -> (table, length)
        self.next_id = 0
        self.writes = 0

    # ---- helpers ---------------------------------------------------------------------------
    def _kv(self, sid, token):
        ks, vs, keys = self.model[sid]
        if self.prefix_mode:
            key, k, v = prefix_kv(keys[-1] if keys else 0, token)
        else:  # unique values per write: any aliasing between sequences shows up
            self.writes += 1
            key = self.writes
            k, v = np.random.default_rng(key).standard_normal((2, HKV, D)).astype(np.float32)
        ks.append(k)
        vs.append(v)
        keys.append(key)
        return k, v

    def _write(self, sid, slot, token, k, v):
        bs = self.mgr.block_size
        block = slot // bs
        assert self.mgr.ref_count(block) == 1, f"S2: writing block {block} shared by others"
        assert block in self.mgr.block_table(sid)
        reshape_and_cache(k[None], v[None], self.kc, self.vc, np.array([slot]))
        self.slot_tokens.setdefault(block, [None] * bs)[slot % bs] = token

    def flush(self):
        copies = self.mgr.take_copies()
        copy_blocks(self.kc, self.vc, copies)
        for src, dst in copies:
            self.slot_tokens[dst] = list(self.slot_tokens.get(src, [None] * self.mgr.block_size))
        for sid, slot, token, k, v in self.pending:
            self._write(sid, slot, token, k, v)
        self.pending.clear()

    def _gpu_seqs(self):
        return sorted(s for s in self.model if not self.mgr.is_swapped(s))

    def _new_prompt(self, data):
        if self.prefix_mode:
            stem = data.draw(st.sampled_from(STEMS))
            tail = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=6))
            return list(stem) + tail
        return data.draw(st.lists(st.integers(0, 9), min_size=1, max_size=14))

    def _admit(self, sid, tokens):
        before = snapshot(self.mgr)
        try:
            computed = self.mgr.allocate(sid, tokens)
        except OutOfBlocksError as e:
            assert e.needed > e.free and snapshot(self.mgr) == before  # S9
            return False
        bs = self.mgr.block_size
        if not self.prefix_mode:
            assert computed == 0
        assert computed % bs == 0 and computed <= len(tokens) - 1  # the last token recomputed
        self.model[sid] = ([], [], [])
        slots = self.mgr.slot_mapping(sid, 0, len(tokens))
        for p, t in enumerate(tokens):
            k, v = self._kv(sid, t)
            if p >= computed:  # hits are not written again: their K/V must already be there
                self._write(sid, int(slots[p]), t, k, v)
                continue
            block, off = divmod(int(slots[p]), bs)
            assert self.slot_tokens[block][off] == t, "S6: a hit on other tokens"
            if not self.exact_hash:  # the sequence sees what the cache serves
                self.model[sid][0][-1] = self.kc[block, :, off].copy()
                self.model[sid][1][-1] = self.vc[block, :, off].copy()
        self._seen(sid)
        return True

    def _seen(self, sid):
        self.tables_seen[sid] = (self.mgr.block_table(sid), self.mgr.seq_len(sid))

    # ---- rules -----------------------------------------------------------------------------
    @rule(data=st.data())
    def allocate(self, data):
        self.flush()
        sid = self.next_id
        self.next_id += 1
        self._admit(sid, self._new_prompt(data))

    @precondition(lambda self: any(not self.mgr.is_swapped(s) for s in self.model))
    @rule(data=st.data(), token=st.integers(0, 3))
    def append(self, data, token):
        self._append(data.draw(st.sampled_from(self._gpu_seqs())), token)

    def _append(self, sid, token):
        before = snapshot(self.mgr)
        try:
            slot = self.mgr.append_slot(sid, token)
        except OutOfBlocksError as e:
            assert e.needed > e.free and snapshot(self.mgr) == before  # S9
            return
        k, v = self._kv(sid, token)
        self.pending.append((sid, slot, token, k, v))

    @precondition(lambda self: any(not self.mgr.is_swapped(s) for s in self.model))
    @rule(data=st.data())
    def fork(self, data):
        self._fork(data.draw(st.sampled_from(self._gpu_seqs())))

    @precondition(lambda self: any(not self.mgr.is_swapped(s) for s in self.model))
    @rule(data=st.data(), tokens=st.lists(st.integers(0, 3), min_size=2, max_size=2))
    def fork_then_decode(self, data, tokens):
        """Parallel sampling's step: fork, then child and parent each append (a shared partly
        filled last block is copied for the first writer; the second writes in place)."""
        parent = data.draw(st.sampled_from(self._gpu_seqs()))
        child = self._fork(parent)
        for sid, token in zip((child, parent), tokens):
            self._append(sid, token)

    def _fork(self, parent):
        self.flush()  # an engine forks between steps, after the step's K/V are written
        child = self.next_id
        self.next_id += 1
        self.mgr.fork(parent, child)
        ks, vs, keys = self.model[parent]
        self.model[child] = (list(ks), list(vs), list(keys))
        assert self.mgr.block_table(child) == self.mgr.block_table(parent)
        self._seen(child)
        return child

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def free(self, data):
        if self.prefix_mode:
            # Prefix caching registers a block when it becomes full, before the step's forward
            # pass writes its K/V (as vLLM v1 does); an engine frees between steps, so flush.
            self.flush()
        sid = data.draw(st.sampled_from(sorted(self.model)))
        self.mgr.free(sid)
        del self.model[sid]
        self.pending = [w for w in self.pending if w[0] != sid]

    @precondition(lambda self: any(not self.mgr.is_swapped(s) for s in self.model))
    @rule()
    def check_attention(self):
        self.flush()
        seqs = self._gpu_seqs()
        q = np.random.default_rng(0).standard_normal((len(seqs), H, D)).astype(np.float32)
        got = attention_outputs(self.kc, self.vc, self.mgr, seqs, q)
        assert np.array_equal(got, dense_outputs(self.model, seqs, q))  # S3, S5

    # ---- invariants ------------------------------------------------------------------------
    @invariant()
    def structure(self):
        if not hasattr(self, "mgr"):
            return
        check_invariants(self.mgr)  # S1
        u = self.mgr.usage()  # KVUsage itself checks that the categories add up to the total
        assert u.free == self.mgr.num_free_blocks * self.mgr.block_size
        assert u == self.mgr.usage_slow()  # S11: the fast count equals its oracle
        finals = {s: self.mgr.seq_len(s) + i % 9 for i, s in enumerate(sorted(self.model))}
        assert self.mgr.usage(finals) == self.mgr.usage_slow(finals)  # S11
        for src, dst in self.mgr.pending_copies:  # S10
            assert self.mgr.ref_count(src) >= 1, f"copy source {src} is free before the copy"
            assert self.mgr.ref_count(dst) == 1, f"copy destination {dst} shared or free"
        for s, (old, n) in list(self.tables_seen.items()):  # S7
            if s in self.model and not self.mgr.is_swapped(s):
                new, full = self.mgr.block_table(s), n // self.mgr.block_size
                assert new[:full] == old[:full] and len(new) >= len(old), (
                    f"seq {s}: table {old} (length {n}) became {new}")
                self._seen(s)
        if self.prefix_mode:
            pending_blocks = {slot // self.mgr.block_size for _, slot, *_ in self.pending}
            alloc = self.mgr.allocator
            for h, b in alloc.cached_blocks().items():  # S6
                if b not in pending_blocks:
                    assert tuple(self.slot_tokens[b]) == alloc.block_token_ids(b), (
                        f"hash {h} -> block {b} holding {self.slot_tokens[b]}")

    def teardown(self):
        if not hasattr(self, "mgr"):
            return
        if any(not self.mgr.is_swapped(s) for s in self.model):
            self.check_attention()
        for s in list(self.model):
            self.mgr.free(s)
        self.mgr.take_copies()
        assert self.mgr.num_free_blocks == self.mgr.num_blocks  # S8
        assert self.mgr.num_free_cpu_blocks == self.pool.key_cache.shape[0]
        check_invariants(self.mgr)
