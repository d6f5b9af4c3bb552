"""What the paged attention tests share: random scenarios (sequences with their true K/V,
written into a NaN-filled paged cache at random physical blocks), their queries, and the large
deterministic scenarios.

tests/test_paged_attention.py proves with them that paging never changes what attention
computes, tests/test_paged_attention_numerics.py that the arithmetic itself is right (rounding,
the caller's scale, large logits, a bad query). Every cache starts as NaN, so a single stray
read of an unused slot would show.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

DTYPES = (np.float16, np.float32, np.float64)


def write_sequence(key_cache, value_cache, table, k, v):
    """Test-local writer: token p of k/v [Tk, Hkv, D] goes to block table[p // BS], slot
    p % BS (what reshape_and_cache does with slot = block * BS + offset)."""
    BS = key_cache.shape[2]
    for i in range(-(-k.shape[0] // BS)):
        chunk = slice(i * BS, (i + 1) * BS)
        n = k[chunk].shape[0]
        key_cache[table[i], :, :n] = k[chunk].transpose(1, 0, 2)
        value_cache[table[i], :, :n] = v[chunk].transpose(1, 0, 2)


class Scenario:
    """S sequences with their true K/V, written into a NaN-filled paged cache at random blocks."""

    def __init__(self, rng, dtype, hkv, group, d, bs, lens, extra_blocks, pad_garbage):
        self.dtype, self.hkv, self.h, self.d, self.bs = dtype, hkv, hkv * group, d, bs
        self.lens = np.array(lens, np.int32)
        nblocks = -(-self.lens // bs)
        self.nb = int(nblocks.sum()) + extra_blocks
        self.mb = int(nblocks.max()) + int(rng.integers(0, 3))
        self.k = [rng.standard_normal((n, hkv, d)).astype(dtype) for n in lens]
        self.v = [rng.standard_normal((n, hkv, d)).astype(dtype) for n in lens]
        self.place(rng.permutation(self.nb), rng if pad_garbage else None)

    def place(self, physical, garbage_rng=None):
        """Write every sequence into blocks taken from ``physical`` in order; NaN elsewhere."""
        self.physical = physical
        shape = (self.nb, self.hkv, self.bs, self.d)
        self.key_cache = np.full(shape, np.nan, self.dtype)
        self.value_cache = np.full(shape, np.nan, self.dtype)
        self.tables = np.full((len(self.lens), self.mb), -1, np.int32)
        if garbage_rng is not None:     # entries past a sequence's length: anything at all
            self.tables[:] = garbage_rng.choice([-1, -7, self.nb, 2**31 - 1], self.tables.shape)
        start = 0
        for s, n in enumerate(-(-self.lens // self.bs)):
            self.tables[s, :n] = physical[start:start + n]
            start += n
            write_sequence(self.key_cache, self.value_cache, self.tables[s], self.k[s], self.v[s])


@st.composite
def scenarios(draw, max_len=300, max_seqs=4):
    dtype = draw(st.sampled_from(DTYPES))
    hkv = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 4]))
    d = draw(st.sampled_from([1, 3, 8, 16]))
    bs = draw(st.one_of(st.sampled_from([1, 16, 64]), st.integers(1, 64)))
    lens = draw(st.lists(st.integers(1, max_len), min_size=1, max_size=max_seqs))
    if bs == 1:  # keep the online walk (one step per block) short enough for CI
        lens = [min(n, 64) for n in lens]
    extra = draw(st.integers(0, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    garbage = draw(st.booleans())
    return Scenario(np.random.default_rng(seed), dtype, hkv, group, d, bs, lens, extra, garbage)


def decode_queries(sc, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((len(sc.lens), sc.h, sc.d)).astype(sc.dtype)     # [S, H, D]


def prefill_queries(sc, rng):
    qlens = np.array([rng.integers(1, n + 1) for n in sc.lens], np.int32)
    return rng.standard_normal((int(qlens.sum()), sc.h, sc.d)).astype(sc.dtype), qlens


def big_scenario(dtype, bs, seed=0):
    """Deterministic large cases next to the random ones: long ragged contexts, GQA 4:1."""
    rng = np.random.default_rng(seed)
    lens = [300, 1, bs + 1, 2 * bs, 257] if bs > 1 else [64, 1, 33]
    return Scenario(rng, dtype, 2, 4, 16, bs, lens, 3, True)
