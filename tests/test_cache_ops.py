"""cache_ops: reshape_and_cache (vectorised == slot-by-slot oracle), copy_blocks, swap_blocks,
and their bad-input errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged.paged.cache_ops import (
    copy_blocks,
    reshape_and_cache,
    reshape_and_cache_loop,
    swap_blocks,
)

DTYPES = [np.float16, np.float32, np.float64]


def caches(nb=4, hkv=2, bs=4, d=3, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    kc = rng.standard_normal((nb, hkv, bs, d)).astype(dtype)  # [NB, Hkv, BS, D]
    return kc, (kc + 100).astype(dtype)


@settings(max_examples=30)
@given(nb=st.integers(1, 8), hkv=st.integers(1, 3), bs=st.integers(1, 8), d=st.integers(1, 5),
       dtype=st.sampled_from(DTYPES), data=st.data())
def test_reshape_and_cache_equals_slot_by_slot_oracle(nb, hkv, bs, d, dtype, data):
    n_slots = nb * bs
    t = data.draw(st.integers(0, n_slots))
    slots = np.array(data.draw(st.permutations(range(n_slots)))[:t], dtype=np.int64)
    pad = data.draw(st.lists(st.booleans(), min_size=t, max_size=t))
    slots[np.array(pad, dtype=bool)] = -1  # padding tokens: skipped
    rng = np.random.default_rng(t)
    key = rng.standard_normal((t, hkv, d)).astype(dtype)  # [T, Hkv, D]
    value = rng.standard_normal((t, hkv, d)).astype(dtype)
    kc, vc = caches(nb, hkv, bs, d, dtype)
    kc2, vc2 = kc.copy(), vc.copy()
    reshape_and_cache(key, value, kc, vc, slots)
    reshape_and_cache_loop(key, value, kc2, vc2, slots)
    assert np.array_equal(kc, kc2) and np.array_equal(vc, vc2)
    for i, s in enumerate(slots.tolist()):
        if s >= 0:
            assert np.array_equal(kc[s // bs, :, s % bs], key[i])


def test_negative_slots_touch_nothing():
    kc, vc = caches()
    before = kc.copy(), vc.copy()
    key = np.ones((3, 2, 3), np.float32)
    reshape_and_cache(key, key, kc, vc, np.array([-1, -5, -1]))
    assert np.array_equal(kc, before[0]) and np.array_equal(vc, before[1])


@pytest.mark.parametrize("slots, words", [
    ([0, 16], r"slot_mapping\[1\]=16 is out of range \[0, NB\*BS=16\)"),
    ([3, 3], "writes slot 3 twice"),
    ([0.0, 1.0], "must hold integers"),
    ([0, 1, 2], r"slot_mapping.shape=\(3,\) must be \[T=2\]"),
])
def test_reshape_and_cache_bad_slots(slots, words):
    kc, vc = caches()
    key = np.ones((2, 2, 3), np.float32)
    with pytest.raises((ValueError, TypeError), match=words):
        reshape_and_cache(key, key, kc, vc, np.array(slots))


def test_reshape_and_cache_bad_shapes_and_dtypes():
    kc, vc = caches()
    ok = np.ones((2, 2, 3), np.float32)
    with pytest.raises(TypeError, match="key.dtype=float64 != key_cache.dtype=float32"):
        reshape_and_cache(ok.astype(np.float64), ok, kc, vc, np.array([0, 1]))
    with pytest.raises(ValueError, match=r"key.shape=\(2, 3, 3\) must be \[T, Hkv=2, D=3\]"):
        reshape_and_cache(np.ones((2, 3, 3), np.float32), ok, kc, vc, np.array([0, 1]))
    with pytest.raises(ValueError, match=r"value must be \[T, Hkv, D\] \(3-D\), got shape"):
        reshape_and_cache(ok, ok[0], kc, vc, np.array([0, 1]))
    with pytest.raises(TypeError, match="key must be a numpy array, got list"):
        reshape_and_cache(ok.tolist(), ok, kc, vc, np.array([0, 1]))
    with pytest.raises(TypeError, match="key_cache.dtype=float32 != value_cache.dtype=float16"):
        reshape_and_cache(ok, ok, kc, vc.astype(np.float16), np.array([0, 1]))
    with pytest.raises(ValueError, match=r"key_cache must be \[NB, Hkv, BS, D\]"):
        reshape_and_cache(ok, ok, kc[0], vc, np.array([0, 1]))
    with pytest.raises(ValueError, match="key_cache.shape"):
        reshape_and_cache(ok, ok, kc, vc[:2], np.array([0, 1]))


def test_copy_blocks_copies_every_pair_at_once():
    kc, vc = caches(nb=6)
    want_k, want_v = kc.copy(), vc.copy()
    pairs = [(0, 3), (0, 4), (1, 5)]  # one source may feed several copies (several writers)
    for s, d in pairs:
        want_k[d], want_v[d] = kc[s], vc[s]
    copy_blocks(kc, vc, pairs)
    assert np.array_equal(kc, want_k) and np.array_equal(vc, want_v)
    copy_blocks(kc, vc, [])  # nothing to copy is fine
    copy_blocks(kc, vc, np.array([[2, 1]], dtype=np.int32))
    assert np.array_equal(kc[1], kc[2])


@pytest.mark.parametrize("pairs, words", [
    ([(0, 6)], r"dst block 6 is out of range \[0, 6\)"),
    ([(-1, 2)], "src block -1 is out of range"),
    ([(0, 1), (1, 2)], "block 1 is both a source and a destination"),
    ([(0, 2), (1, 2)], "into block 2 more than once"),
    ([(0, 0)], "block 0 is both a source and a destination"),
    ([(0, 1, 2)], r"shape \[N, 2\]"),
    ([(0.5, 1.0)], "integer block ids"),
    ([(0, 1), (2,)], r"block_mapping=\[\(0, 1\), \(2,\)\] has pairs of different lengths"),
])
def test_copy_blocks_rejects_bad_pairs(pairs, words):
    kc, vc = caches(nb=6)
    before = kc.copy()
    with pytest.raises((ValueError, TypeError), match=words):
        copy_blocks(kc, vc, pairs)
    assert np.array_equal(kc, before)  # validated before anything is written


def test_swap_blocks_between_pools():
    gk, gv = caches(nb=4, seed=1)
    ck, cv = caches(nb=3, seed=2)
    swap_blocks(gk, gv, ck, cv, [(3, 0), (1, 2)])
    assert np.array_equal(ck[0], gk[3]) and np.array_equal(cv[2], gv[1])
    with pytest.raises(ValueError, match=r"dst block 3 is out of range \[0, 3\)"):
        swap_blocks(gk, gv, ck, cv, [(0, 3)])
    with pytest.raises(ValueError, match="block shapes differ"):
        swap_blocks(gk, gv, *caches(nb=3, bs=8), [(0, 0)])
    with pytest.raises(TypeError, match="dtype"):
        swap_blocks(gk, gv, ck.astype(np.float64), cv.astype(np.float64), [(0, 0)])


@pytest.mark.parametrize("which", ["key_cache", "value_cache"])
def test_a_read_only_cache_is_refused_before_anything_is_written(which):
    kc, vc = caches()
    before = (kc.copy(), vc.copy())
    (kc if which == "key_cache" else vc).flags.writeable = False
    kv = np.ones((1, 2, 3), np.float32)  # [T, Hkv, D]
    with pytest.raises(ValueError, match=f"{which} is read-only"):
        reshape_and_cache(kv, kv, kc, vc, np.array([5]))
    with pytest.raises(ValueError, match=f"{which} is read-only"):
        copy_blocks(kc, vc, [(0, 1)])
    with pytest.raises(ValueError, match=f"dst_{which} is read-only"):
        swap_blocks(*caches(seed=1), kc, vc, [(0, 1)])
    assert np.array_equal(kc, before[0]) and np.array_equal(vc, before[1])


def test_key_and_value_caches_must_not_share_memory():
    kc, _ = caches()
    before = kc.copy()
    kv = np.ones((1, 2, 3), np.float32)
    with pytest.raises(ValueError, match="share memory"):
        reshape_and_cache(kv, kv, kc, kc, np.array([5]))
    both = np.zeros((5, 2, 4, 3), np.float32)
    with pytest.raises(ValueError, match="share memory"):
        copy_blocks(both[:4], both[1:], [(0, 1)])  # overlapping views of one buffer
    assert np.array_equal(kc, before)
    halves = np.zeros((2, 4, 2, 4, 3), np.float32)  # one buffer, two disjoint halves: fine
    reshape_and_cache(kv, kv + 1, halves[0], halves[1], np.array([5]))
    assert halves[0, 1, :, 1].tolist() == [[1.0] * 3] * 2 and halves[1, 1, 0, 1, 0] == 2.0


def test_empty_lists_are_empty_int_arrays():
    from minipaged.paged.paged_attention import paged_attention
    # [] has NumPy's default dtype, float64: it was refused as "must hold integers".
    kc, vc = caches()
    empty = np.ones((0, 2, 3), np.float32)
    reshape_and_cache(empty, empty, kc, vc, [])
    assert paged_attention(empty, kc, vc, np.zeros((0, 1), np.int32), []).shape == (0, 2, 3)
