"""Paging changes where K and V live, never what attention computes: the proofs.

For random shapes, GQA ratios, dtypes, block sizes 1..64, ragged lengths and random physical
placements (Hypothesis):
* paged_attention(method="gather") == dense_attention on the sequence's K/V, bit for bit;
* paged_attention(method="online") == dense_attention(..., tile=BS), bit for bit;
* the same two equalities for paged_prefill_attention (ragged new tokens over a cached prefix);
* moving physical blocks and rewriting the tables to match changes no output bit;
* garbage (NaN, inf, huge) in free blocks, in the unused slots of last blocks and in table
  entries past a sequence's length changes no output bit, and the caches are never written.
Every cache in these tests starts as NaN, so a single stray read of an unused slot would show.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.attention import dense_attention
from minipaged.paged.paged_attention import gather_kv, paged_attention, paged_prefill_attention

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


BIG = [big_scenario(dt, bs) for dt in DTYPES for bs in (1, 7, 16, 64)]


@pytest.mark.parametrize("sc", BIG, ids=lambda sc: f"{sc.dtype.__name__}-BS{sc.bs}")
def test_long_ragged_contexts_bit_for_bit(sc):
    q = decode_queries(sc)
    qp, qlens = prefill_queries(sc, np.random.default_rng(5))
    starts = np.concatenate([[0], np.cumsum(qlens)])
    for method, tile in (("gather", None), ("online", sc.bs)):
        out = paged_attention(q, sc.key_cache, sc.value_cache, sc.tables, sc.lens, method=method)
        pre = paged_prefill_attention(qp, sc.key_cache, sc.value_cache, sc.tables, sc.lens,
                                      qlens, method=method)
        for s in range(len(sc.lens)):
            rows = slice(starts[s], starts[s + 1])
            assert np.array_equal(out[s:s + 1],
                                  dense_attention(q[s:s + 1], sc.k[s], sc.v[s], tile=tile))
            assert np.array_equal(pre[rows], dense_attention(qp[rows], sc.k[s], sc.v[s],
                                                             tile=tile))


@settings(max_examples=50)
@given(scenarios())
def test_decode_equals_dense_bit_for_bit(sc):
    q = decode_queries(sc)
    gather = paged_attention(q, sc.key_cache, sc.value_cache, sc.tables, sc.lens)
    online = paged_attention(q, sc.key_cache, sc.value_cache, sc.tables, sc.lens,
                             method="online")
    assert gather.shape == online.shape == q.shape and gather.dtype == online.dtype == q.dtype
    for s in range(len(sc.lens)):
        assert np.array_equal(gather[s:s + 1], dense_attention(q[s:s + 1], sc.k[s], sc.v[s]))
        assert np.array_equal(online[s:s + 1],
                              dense_attention(q[s:s + 1], sc.k[s], sc.v[s], tile=sc.bs))
    assert np.isfinite(gather).all() and np.isfinite(online).all()


@settings(max_examples=25)
@given(scenarios(max_len=150), st.integers(0, 2**32 - 1))
def test_prefill_equals_dense_bit_for_bit(sc, seed):
    q, qlens = prefill_queries(sc, np.random.default_rng(seed))
    args = (q, sc.key_cache, sc.value_cache, sc.tables, sc.lens, qlens)
    gather = paged_prefill_attention(*args)
    online = paged_prefill_attention(*args, method="online")
    starts = np.concatenate([[0], np.cumsum(qlens)])
    for s in range(len(sc.lens)):
        rows = slice(starts[s], starts[s + 1])
        assert np.array_equal(gather[rows], dense_attention(q[rows], sc.k[s], sc.v[s]))
        assert np.array_equal(online[rows],
                              dense_attention(q[rows], sc.k[s], sc.v[s], tile=sc.bs))


@settings(max_examples=20)
@given(scenarios(max_len=100))
def test_prefill_of_one_token_is_decode(sc):
    """A prefill chunk of one token per sequence is exactly a decode step."""
    q = decode_queries(sc)
    ones = np.ones(len(sc.lens), np.int32)
    for method in ("gather", "online"):
        assert np.array_equal(
            paged_prefill_attention(q, sc.key_cache, sc.value_cache, sc.tables, sc.lens, ones,
                                    method=method),
            paged_attention(q, sc.key_cache, sc.value_cache, sc.tables, sc.lens, method=method))


@settings(max_examples=20)
@given(scenarios(max_len=120), st.integers(0, 2**32 - 1))
def test_moving_physical_blocks_changes_nothing(sc, seed):
    rng = np.random.default_rng(seed)
    q = decode_queries(sc)
    qp, qlens = prefill_queries(sc, rng)

    def outputs():
        return [paged_attention(q, sc.key_cache, sc.value_cache, sc.tables, sc.lens, method=m)
                for m in ("gather", "online")] + \
               [paged_prefill_attention(qp, sc.key_cache, sc.value_cache, sc.tables, sc.lens,
                                        qlens, method=m) for m in ("gather", "online")]

    before, old_tables = outputs(), sc.tables.copy()
    # A derangement of the old placement: with more than one block, every block moves.
    shift = int(rng.integers(1, sc.nb)) if sc.nb > 1 else 0
    sc.place(sc.physical[(np.arange(sc.nb) + shift) % sc.nb], rng)
    if sc.nb > 1:
        assert not np.array_equal(old_tables[:, 0], sc.tables[:, 0])
    for a, b in zip(before, outputs()):
        assert np.array_equal(a, b)


@settings(max_examples=20)
@given(scenarios(max_len=120), st.sampled_from([np.inf, -np.inf, 6e4, 0.0]))
def test_garbage_outside_the_sequences_changes_nothing(sc, junk):
    """Free blocks, unused slots of last blocks and table padding: overwrite them all."""
    q = decode_queries(sc)
    qlens = np.minimum(sc.lens, 3).astype(np.int32)
    qp = np.random.default_rng(1).standard_normal((int(qlens.sum()), sc.h, sc.d)).astype(sc.dtype)

    def outputs():
        return [paged_attention(q, sc.key_cache, sc.value_cache, sc.tables, sc.lens, method=m)
                for m in ("gather", "online")] + \
               [paged_prefill_attention(qp, sc.key_cache, sc.value_cache, sc.tables, sc.lens,
                                        qlens, method=m) for m in ("gather", "online")]

    before = outputs()
    unused = np.isnan(sc.key_cache)                   # every slot no sequence owns
    sc.key_cache[unused] = junk
    sc.value_cache[unused] = -junk
    used = np.arange(sc.mb)[None, :] < -(-sc.lens[:, None] // sc.bs)
    sc.tables[~used] = 123456                        # padding entries: out of range on purpose
    for a, b in zip(before, outputs()):
        assert np.array_equal(a, b)


@settings(max_examples=20)
@given(scenarios(max_len=100))
def test_caches_and_tables_are_never_written(sc):
    q = decode_queries(sc)
    kc, vc, bt = sc.key_cache.copy(), sc.value_cache.copy(), sc.tables.copy()
    for m in ("gather", "online"):
        paged_attention(q, sc.key_cache, sc.value_cache, sc.tables, sc.lens, method=m)
        paged_prefill_attention(q, sc.key_cache, sc.value_cache, sc.tables, sc.lens,
                                np.ones(len(sc.lens), np.int32), method=m)
    assert np.array_equal(kc, sc.key_cache, equal_nan=True)
    assert np.array_equal(vc, sc.value_cache, equal_nan=True)
    assert np.array_equal(bt, sc.tables)


@settings(max_examples=30)
@given(scenarios(max_len=200))
def test_online_close_to_plain(sc):
    """The online walk reorders the sums, so it equals the *plain* oracle only within rounding.
    Tolerances: float64 ~1e-15 per add, float32 ~1e-7 per add over <= 200 keys; float16 output
    is rounded once from float32, and two float32 values a hair apart may round one float16 ulp
    apart (2**-10 relative)."""
    tol = {np.float16: 2e-3, np.float32: 1e-5, np.float64: 1e-12}[sc.dtype]
    q = decode_queries(sc)
    online = paged_attention(q, sc.key_cache, sc.value_cache, sc.tables, sc.lens,
                             method="online")
    for s in range(len(sc.lens)):
        plain = dense_attention(q[s:s + 1], sc.k[s], sc.v[s])
        np.testing.assert_allclose(online[s:s + 1].astype(np.float64),
                                   plain.astype(np.float64), rtol=tol, atol=tol)


@settings(max_examples=20)
@given(scenarios(max_len=200), st.integers(0, 2**32 - 1))
def test_prefill_online_close_to_plain(sc, seed):
    """The prefill path's second guarantee: its online walk is within rounding of the plain
    oracle, with the tolerances of test_online_close_to_plain (same reasons, same <= 200 keys)."""
    tol = {np.float16: 2e-3, np.float32: 1e-5, np.float64: 1e-12}[sc.dtype]
    qp, qlens = prefill_queries(sc, np.random.default_rng(seed))
    online = paged_prefill_attention(qp, sc.key_cache, sc.value_cache, sc.tables, sc.lens, qlens,
                                     method="online")
    starts = np.concatenate([[0], np.cumsum(qlens)])
    for s in range(len(sc.lens)):
        rows = slice(starts[s], starts[s + 1])
        plain = dense_attention(qp[rows], sc.k[s], sc.v[s])
        np.testing.assert_allclose(online[rows].astype(np.float64), plain.astype(np.float64),
                                   rtol=tol, atol=tol)


@settings(max_examples=30)
@given(scenarios(max_len=200))
def test_gather_kv_returns_the_logical_sequence(sc):
    for s in range(len(sc.lens)):
        k, v = gather_kv(sc.key_cache, sc.value_cache, sc.tables[s], int(sc.lens[s]))
        assert np.array_equal(k, sc.k[s]) and np.array_equal(v, sc.v[s])


def test_shared_blocks_read_by_two_sequences():
    """Prefix sharing: two tables may point at the same physical block; both read it."""
    rng = np.random.default_rng(3)
    BS, Hkv, D = 4, 2, 8
    kc, vc = rng.standard_normal((2, 6, Hkv, BS, D)).astype(np.float32)
    tables = np.array([[0, 1, 2], [0, 1, 5]], np.int32)       # blocks 0 and 1 shared
    lens = np.array([10, 12], np.int32)
    q = rng.standard_normal((2, 4, D)).astype(np.float32)
    out = paged_attention(q, kc, vc, tables, lens)
    for s in range(2):
        k, v = gather_kv(kc, vc, tables[s], int(lens[s]))
        assert np.array_equal(k[:8], gather_kv(kc, vc, tables[1 - s], 8)[0])
        assert np.array_equal(out[s:s + 1], dense_attention(q[s:s + 1], k, v))


def test_int64_tables_and_lists_are_accepted():
    rng = np.random.default_rng(4)
    kc, vc = rng.standard_normal((2, 3, 1, 2, 4))
    q = rng.standard_normal((1, 2, 4))
    a = paged_attention(q, kc, vc, np.array([[2, 0]], np.int32), np.array([3], np.int32))
    b = paged_attention(q, kc, vc, [[2, 0]], [3])
    assert np.array_equal(a, b)


def test_empty_batch():
    kc = np.zeros((4, 1, 2, 3), np.float32)
    q = np.zeros((0, 2, 3), np.float32)
    out = paged_attention(q, kc, kc.copy(), np.zeros((0, 2), np.int32), np.zeros(0, np.int32))
    assert out.shape == (0, 2, 3)


@pytest.mark.parametrize("chunk_bytes", [1, 3000, 1 << 30])
@pytest.mark.parametrize("sc", BIG[4:8], ids=lambda sc: f"{sc.dtype.__name__}-BS{sc.bs}")
def test_gather_in_head_chunks_changes_nothing(sc, chunk_bytes, monkeypatch):
    """The gather path fetches a few KV heads at a time (one at a time for long contexts);
    the chunking is invisible in the output, whatever its size."""
    # importlib, not "import minipaged.paged.paged_attention as pa": the package exports a function
    # of the same name, which that form would return instead of the module.
    pa = importlib.import_module("minipaged.paged.paged_attention")
    q = decode_queries(sc)
    qp, qlens = prefill_queries(sc, np.random.default_rng(6))
    monkeypatch.setattr(pa, "GATHER_CHUNK_BYTES", chunk_bytes)
    out = paged_attention(q, sc.key_cache, sc.value_cache, sc.tables, sc.lens)
    pre = paged_prefill_attention(qp, sc.key_cache, sc.value_cache, sc.tables, sc.lens, qlens)
    starts = np.concatenate([[0], np.cumsum(qlens)])
    for s in range(len(sc.lens)):
        rows = slice(starts[s], starts[s + 1])
        assert np.array_equal(out[s:s + 1], dense_attention(q[s:s + 1], sc.k[s], sc.v[s]))
        assert np.array_equal(pre[rows], dense_attention(qp[rows], sc.k[s], sc.v[s]))


# ---- behaviours a wrong implementation could hide (each would pass the tests above if the
# ---- oracle made the same mistake, so each is checked against arithmetic, not the oracle) --
SC = big_scenario(np.float32, 16)


@pytest.mark.parametrize("method", ["gather", "online"])
def test_the_callers_scale_is_used(method):
    """scale=0.3 must give the same as dense attention with 0.3, and differ from the default."""
    q = decode_queries(SC)
    out = paged_attention(q, SC.key_cache, SC.value_cache, SC.tables, SC.lens, scale=0.3,
                          method=method)
    default = paged_attention(q, SC.key_cache, SC.value_cache, SC.tables, SC.lens,
                              method=method)
    tile = None if method == "gather" else SC.bs
    want = np.concatenate([dense_attention(q[s:s + 1], SC.k[s], SC.v[s], scale=0.3, tile=tile)
                           for s in range(len(SC.lens))])
    assert np.array_equal(out, want) and not np.allclose(out, default)
    qp, qlens = prefill_queries(SC, np.random.default_rng(1))
    pre = paged_prefill_attention(qp, SC.key_cache, SC.value_cache, SC.tables, SC.lens, qlens,
                                  scale=0.3, method=method)
    pre_default = paged_prefill_attention(qp, SC.key_cache, SC.value_cache, SC.tables, SC.lens,
                                          qlens, method=method)
    assert not np.allclose(pre, pre_default)
    rows = np.concatenate([[0], np.cumsum(qlens)])
    for s in range(len(SC.lens)):
        want = dense_attention(qp[rows[s]:rows[s + 1]], SC.k[s], SC.v[s], scale=0.3, tile=tile)
        assert np.array_equal(pre[rows[s]:rows[s + 1]], want)


@pytest.mark.parametrize("method", ["gather", "online"])
def test_large_logits_stay_finite(method):
    """Logits of about 1e4 overflow exp() unless the running max is subtracted first."""
    q = decode_queries(SC) * 100
    out = paged_attention(q, SC.key_cache, SC.value_cache, SC.tables, SC.lens, scale=1.0,
                          method=method)
    assert np.isfinite(out).all()
    # Each output is a convex combination of V rows: inside their range, per sequence.
    for s in range(len(SC.lens)):
        assert (out[s] >= SC.v[s].min() - 1e-4).all() and (out[s] <= SC.v[s].max() + 1e-4).all()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NaN arithmetic, on purpose
@pytest.mark.parametrize("method", ["gather", "online"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_bad_query_spoils_its_own_row_only(method, bad):
    """NaN or inf in one sequence's query is not checked for (it costs a pass over the data on
    the hot path); it spoils that sequence's output and no other's."""
    q = decode_queries(SC)
    clean = paged_attention(q, SC.key_cache, SC.value_cache, SC.tables, SC.lens, method=method)
    q[1, 0, 0] = bad
    out = paged_attention(q, SC.key_cache, SC.value_cache, SC.tables, SC.lens, method=method)
    others = [s for s in range(len(SC.lens)) if s != 1]
    assert np.array_equal(out[others], clean[others])
    assert not np.isfinite(out[1]).all()


def test_a_scale_that_overflows_is_rejected():
    q = decode_queries(SC)
    with pytest.raises(ValueError, match="scale=1e\\+300 overflows float32"):
        paged_attention(q, SC.key_cache, SC.value_cache, SC.tables, SC.lens, scale=1e300)
    with pytest.raises(ValueError, match="overflows"):
        dense_attention(q[:1], SC.k[0], SC.v[0], scale=1e300)
