"""Paged attention's arithmetic. The online walk reorders the sums, so it is within rounding
of the plain oracle, not bit for bit. And behaviours a wrong implementation could hide (each
would pass the bit-for-bit tests of tests/test_paged_attention.py if the oracle made the same
mistake, so each is checked against arithmetic, not the oracle): the caller's scale is used,
large logits stay finite, a bad query spoils its own row only, a scale that overflows is
rejected.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paged_attention_helpers import big_scenario, decode_queries, prefill_queries, scenarios

from minipaged.attention import dense_attention
from minipaged.paged.paged_attention import paged_attention, paged_prefill_attention

SC = big_scenario(np.float32, 16)


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
