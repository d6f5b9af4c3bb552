"""The dense attention oracle (minipaged/attention.py) against an obvious loop, and its errors.

Everything paged is checked against ``dense_attention`` bit for bit, so ``dense_attention``
itself must be right: here it is compared with a per-(token, head) float64 loop that anyone can
read, for every dtype, GQA ratio, causal offset and tile size."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.attention import dense_attention

DTYPES = (np.float16, np.float32, np.float64)

# Tolerances against the float64 loop, per input dtype. The inputs are the same numbers (the
# loop upcasts them exactly); what differs is rounding inside the computation:
#   float64: summation order only -> a few ulps of 1;
#   float32: float32 accumulation over up to ~100 keys -> ~1e-6 relative, 1e-5 is generous;
#   float16: computed in float32 but the output is rounded to float16: half an ulp is 2**-11
#            relative (~5e-4), plus float32 error; outputs are averages of N(0, 1) values.
TOL = {np.float16: dict(rtol=2e-3, atol=2e-3), np.float32: dict(rtol=1e-5, atol=1e-5),
       np.float64: dict(rtol=1e-12, atol=1e-12)}


def loop_attention(q, k, v, scale=None, causal=True):
    """The definition, one query token and one head at a time, in float64 Python floats."""
    T, H, D = q.shape
    Tk, Hkv, _ = k.shape
    group = H // Hkv
    scale = 1 / math.sqrt(D) if scale is None else scale
    out = np.zeros((T, H, D))
    for t in range(T):
        last = Tk - T + t if causal else Tk - 1             # causal with offset
        for h in range(H):
            kv_head = h // group                             # grouped-query attention
            logits = [scale * sum(float(q[t, h, d]) * float(k[j, kv_head, d]) for d in range(D))
                      for j in range(last + 1)]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            total = sum(weights)
            for j, w in enumerate(weights):
                out[t, h] += (w / total) * v[j, kv_head].astype(np.float64)
    return out


@st.composite
def attention_inputs(draw, max_t=6, max_tk=24):
    dtype = draw(st.sampled_from(DTYPES))
    hkv = draw(st.integers(1, 3))
    group = draw(st.integers(1, 3))
    d = draw(st.integers(1, 8))
    tk = draw(st.integers(1, max_tk))
    t = draw(st.integers(1, min(max_t, tk)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((t, hkv * group, d)).astype(dtype)
    k = rng.standard_normal((tk, hkv, d)).astype(dtype)
    v = rng.standard_normal((tk, hkv, d)).astype(dtype)
    return q, k, v


@settings(max_examples=40)
@given(attention_inputs(), st.booleans(), st.one_of(st.none(), st.integers(1, 30)),
       st.one_of(st.none(), st.floats(0.05, 2.0)))
def test_dense_matches_obvious_loop(qkv, causal, tile, scale):
    q, k, v = qkv
    out = dense_attention(q, k, v, scale=scale, causal=causal, tile=tile)
    assert out.shape == q.shape and out.dtype == q.dtype
    np.testing.assert_allclose(out.astype(np.float64), loop_attention(q, k, v, scale, causal),
                               **TOL[q.dtype.type])


@given(attention_inputs(max_t=8, max_tk=80), st.integers(1, 90), st.booleans())
def test_online_softmax_close_to_plain(qkv, tile, causal):
    """Same attention, different summation order: equal within rounding, not bit for bit.
    (Between two float16 results: both round a float32 value to float16, and float32 values a
    hair apart can round one float16 ulp apart, ~1e-3 relative, hence the float16 tolerance.)"""
    q, k, v = qkv
    plain = dense_attention(q, k, v, causal=causal)
    online = dense_attention(q, k, v, causal=causal, tile=tile)
    np.testing.assert_allclose(online.astype(np.float64), plain.astype(np.float64),
                               **TOL[q.dtype.type])


@given(attention_inputs(), st.one_of(st.none(), st.integers(1, 8)))
def test_float16_accumulates_in_float32(qkv, tile):
    """The documented accumulation dtype, pinned exactly: float16 in, float32 math, one rounding."""
    q, k, v = qkv
    if q.dtype != np.float16:
        q, k, v = (x.astype(np.float16) for x in (q, k, v))
    wide = dense_attention(*(x.astype(np.float32) for x in (q, k, v)), tile=tile)
    assert np.array_equal(dense_attention(q, k, v, tile=tile), wide.astype(np.float16))


def test_gqa_equals_repeated_kv_heads():
    """Query head h reads KV head h // (H // Hkv): repeating each KV head G times gives MHA."""
    rng = np.random.default_rng(0)
    q = rng.standard_normal((3, 8, 16))
    k, v = rng.standard_normal((2, 10, 2, 16))
    mha = dense_attention(q, np.repeat(k, 4, axis=1), np.repeat(v, 4, axis=1))
    np.testing.assert_allclose(dense_attention(q, k, v), mha, rtol=1e-13, atol=1e-13)


def test_causal_offset_last_query_sees_everything():
    """Decode (T=1): the one query is the last position and sees every key, so causal and
    non-causal agree exactly; the first of T=Tk prefill queries sees only key 0 (output v[0])."""
    rng = np.random.default_rng(1)
    q = rng.standard_normal((1, 4, 8)).astype(np.float32)
    k, v = rng.standard_normal((2, 9, 2, 8)).astype(np.float32)
    assert np.array_equal(dense_attention(q, k, v), dense_attention(q, k, v, causal=False))
    qp = rng.standard_normal((9, 4, 8))
    out = dense_attention(qp, k.astype(np.float64), v.astype(np.float64))
    np.testing.assert_allclose(out[0], np.repeat(v[0].astype(np.float64), 2, axis=0))


@pytest.mark.parametrize("tile", [None, 3])
def test_changing_a_hidden_key_changes_nothing(tile):
    """Causality: a key after a query's position cannot influence it, not even in the last bit.
    (Its probability is exactly 0 and 0 * v adds exactly 0. That needs v finite: 0 * NaN is NaN,
    which is why the paged paths zero the unused slots of a last block instead of trusting them.)
    """
    rng = np.random.default_rng(2)
    q = rng.standard_normal((4, 2, 8))
    k, v = rng.standard_normal((2, 10, 1, 8))
    before = dense_attention(q, k, v, tile=tile)
    k2, v2 = k.copy(), v.copy()
    k2[-1], v2[-1] = 1e4, -3e4               # only the last query (t=3) sees key 9
    after = dense_attention(q, k2, v2, tile=tile)
    assert np.array_equal(before[:3], after[:3])
    assert not np.array_equal(before[3], after[3])


# ---------------------------------------------------------------------------- bad inputs


def _qkv(t=2, h=4, tk=5, hkv=2, d=8, dtype=np.float32):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((t, h, d)).astype(dtype),
            rng.standard_normal((tk, hkv, d)).astype(dtype),
            rng.standard_normal((tk, hkv, d)).astype(dtype))


def test_rejects_heads_not_multiple():
    q, k, v = _qkv(h=5, hkv=2)
    with pytest.raises(ValueError, match=r"H=5 .*not a multiple of Hkv=2"):
        dense_attention(q, k, v)


def test_rejects_head_size_mismatch():
    q, _, _ = _qkv(d=8)
    _, k, v = _qkv(d=4)
    with pytest.raises(ValueError, match=r"head size differs: q.shape\[2\]=8, k.shape\[2\]=4"):
        dense_attention(q, k, v)


def test_rejects_k_v_shape_mismatch():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"k.shape=\(5, 2, 8\) != v.shape=\(4, 2, 8\)"):
        dense_attention(q, k, v[:4])


def test_rejects_mixed_dtypes():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="dtypes differ"):
        dense_attention(q, k.astype(np.float64), v)


def test_rejects_integer_dtype():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match=r"q.dtype=int64 is not supported"):
        dense_attention(q.astype(np.int64), k, v)


def test_rejects_wrong_rank():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"k must be 3-D"):
        dense_attention(q, k[0], v)


def test_rejects_non_array():
    _, k, v = _qkv()
    with pytest.raises(TypeError, match="q must be a numpy array, got list"):
        dense_attention([[[1.0]]], k, v)


def test_rejects_more_queries_than_keys_when_causal():
    q, k, v = _qkv(t=6, tk=5)
    with pytest.raises(ValueError, match=r"T=6 queries needs at least T keys, got Tk=5"):
        dense_attention(q, k, v)
    assert dense_attention(q, k, v, causal=False).shape == q.shape   # fine without the mask


def test_rejects_empty_context():
    q, k, v = _qkv(tk=0)
    with pytest.raises(ValueError, match="empty input"):
        dense_attention(q, k, v, causal=False)


@pytest.mark.parametrize("tile", [0, -3, 2.5, True, 2**31, 10**30])  # 10**30: numpy's words
def test_rejects_bad_tile(tile):
    with pytest.raises(ValueError, match=rf"tile={tile!r} must be None"):
        dense_attention(*_qkv(), tile=tile)


@pytest.mark.parametrize("causal", ["no", None, 0])
def test_rejects_a_causal_flag_that_is_not_a_bool(causal):
    # 'no' is truthy: it was attended causally, a wrong answer to the question asked.
    with pytest.raises(TypeError, match=f"causal={causal!r} must be a bool"):
        dense_attention(*_qkv(), causal=causal)
    assert np.array_equal(dense_attention(*_qkv(), causal=np.False_),
                          dense_attention(*_qkv(), causal=False))


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), "0.1"])
def test_rejects_bad_scale(scale):
    with pytest.raises(ValueError, match="scale=.* must be None"):
        dense_attention(*_qkv(), scale=scale)
