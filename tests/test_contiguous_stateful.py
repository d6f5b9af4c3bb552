"""Stateful test of the contiguous KV cache: reserve / write / release at random, under every
policy, with and without exact fit (the invariants are in CacheMachine's docstring)."""

from __future__ import annotations

import numpy as np
import pytest
from contiguous_helpers import HKV, D, kv_data, usage_by_slot
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from invariants import check_invariants

from minipaged import ContiguousKVCache
from minipaged.contiguous.buddy import next_pow2
from minipaged.contiguous.cache import OutOfMemoryError
from minipaged.contiguous.usage import CATEGORIES


class CacheMachine(RuleBasedStateMachine):
    """Reserve / write / release at random, any policy, with and without exact fit.

    Invariants (prose; each asserted below after every step):
      - no two reservations overlap; each holds at least its policy's size;
      - free + allocated = total: num_free + sum(held) == num_slots;
      - the usage categories add up to num_slots (KVUsage checks it) and agree with the
        definition painted slot by slot (usage_by_slot), for several region sizes ``need``;
      - token = tokens written, reserved = sum(final_len - tokens), both >= 0;
      - the K/V of every live request read back exactly as written: an operation on one
        request never changes another's;
      - reserve fails exactly when can_reserve says so, and then changes nothing;
      - releasing everything restores the arena's starting free blocks.
    """

    @initialize(num_slots=st.integers(32, 700), policy=st.sampled_from(["max", "pow2", "oracle"]),
                exact=st.booleans(), msl_frac=st.floats(0.05, 1.0))
    def setup(self, num_slots, policy, exact, msl_frac):
        largest = 1 << (num_slots.bit_length() - 1)
        self.msl = max(1, int(msl_frac * largest))
        self.c = ContiguousKVCache(num_slots, HKV, D, policy=policy, max_seq_len=self.msl,
                                   exact_fit=exact)
        self.expect: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.next_id = 0
        self.rng = np.random.default_rng(num_slots)

    @rule(f=st.floats(0, 1), p=st.floats(0, 1))
    def reserve(self, f, p):
        final = 1 + int(f * (self.msl - 1))
        prompt = 1 + int(p * (final - 1))
        sid = self.next_id
        self.next_id += 1
        if self.c.can_reserve(prompt, final):
            off = self.c.reserve(sid, prompt, final)
            r = self.c.reservation(sid)
            assert r.offset == off and r.held >= r.size >= final
            self.expect[sid] = (np.zeros((0, HKV, D), np.float32),) * 2
        else:
            before = (self.c.usage(), self.c.allocator.free_blocks())
            with pytest.raises(OutOfMemoryError):
                self.c.reserve(sid, prompt, final)
            assert (self.c.usage(), self.c.allocator.free_blocks()) == before

    @precondition(lambda self: self.expect)
    @rule(i=st.integers(0, 10**6), frac=st.floats(0, 1))
    def write(self, i, frac):
        sid = sorted(self.expect)[i % len(self.expect)]
        r = self.c.reservation(sid)
        t = int(frac * (r.final_len - r.num_tokens))
        k, v = kv_data(self.rng, t)
        self.c.write(sid, k, v)
        ek, ev = self.expect[sid]
        self.expect[sid] = (np.concatenate([ek, k]), np.concatenate([ev, v]))

    @precondition(lambda self: self.expect)
    @rule(i=st.integers(0, 10**6))
    def release(self, i):
        sid = sorted(self.expect)[i % len(self.expect)]
        self.c.release(sid)
        del self.expect[sid]

    @invariant()
    def consistent(self):
        c = self.c
        check_invariants(c.allocator)
        regions = sorted((r.offset, r.held) for r in map(c.reservation, c.seq_ids))
        for (o1, h1), (o2, _) in zip(regions, regions[1:]):
            assert o1 + h1 <= o2, "two reservations overlap"
        assert c.num_free + sum(h for _, h in regions) == c.num_slots
        for need in {None, 1, self.msl, c.num_slots}:
            u = c.usage(need)
            assert u == usage_by_slot(c, need)
            assert sum(getattr(u, cat) for cat in CATEGORIES) == c.num_slots
        assert sum(c.breakdown().values()) == c.num_slots
        assert c.usage().token == sum(len(k) for k, _ in self.expect.values())
        for sid, (ek, ev) in self.expect.items():
            k, v = c.kv(sid)
            assert np.array_equal(k, ek) and np.array_equal(v, ev)

    def teardown(self):
        if hasattr(self, "c"):
            for sid in list(self.expect):
                self.c.release(sid)
            n = self.c.num_slots
            assert self.c.num_free == n and self.c.usage().free + \
                self.c.usage().external_fragmentation == n
            assert self.c.allocator.largest_free() == 1 << (n.bit_length() - 1)
            assert sum(s for _, s in self.c.allocator.free_blocks()) == n
            assert next_pow2(n) == n or len(self.c.allocator.free_blocks()) > 1


CacheMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30)
TestCacheMachine = CacheMachine.TestCase
