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
The online walk's rounding, and the behaviours a wrong implementation could hide from this
oracle, are in tests/test_paged_attention_numerics.py; the scenarios in
paged_attention_helpers.py.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paged_attention_helpers import DTYPES, big_scenario, decode_queries, prefill_queries, scenarios

from minipaged.attention import dense_attention
from minipaged.paged.paged_attention import gather_kv, paged_attention, paged_prefill_attention

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
