"""The contiguous KV cache: the policies' reservations, the four categories and their
accounting, checked by hand, and the K/V read back as written. Bad inputs are in
tests/test_contiguous_errors.py, the stateful model in tests/test_contiguous_stateful.py."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from contiguous_helpers import HKV, D, kv_data, usage_by_slot
from hypothesis import given
from hypothesis import strategies as st

from minipaged import ContiguousKVCache
from minipaged.contiguous.usage import KVUsage

# ---- policies and accounting, small enough to check by hand -------------------------------------

@pytest.mark.parametrize("policy, want", [("max", 256), ("pow2", 132), ("oracle", 125)])
def test_policy_reservation_size(policy, want):
    # The paper's Orca (Pow2) example (section 6.1): an output of 25 reserves 32 positions for
    # outputs; with a prompt of 100, that is 132 slots.
    c = ContiguousKVCache(1024, HKV, D, policy=policy, max_seq_len=256)
    assert c.reservation_size(100, 125) == want
    off = c.reserve("a", 100, 125)
    assert c.reservation("a").size == want and c.reservation("a").held == want
    assert c.num_free == 1024 - want and off == 0


def test_pow2_rounds_the_output_only_and_is_capped_at_max_seq_len():
    c = ContiguousKVCache(4096, HKV, D, policy="pow2", max_seq_len=3000)
    assert c.reservation_size(1000, 2100) == 3000  # 1000 + 2048, capped at max_seq_len
    assert c.reservation_size(100, 1500) == 2148  # 100 + next_pow2(1400)
    assert c.reservation_size(500, 1500) == 1524  # 500 + next_pow2(1000): not next_pow2(1500)
    assert c.reservation_size(7, 7) == 7  # no output token to reserve for
    assert c.reservation_size(1, 2) == 2  # one output token: next_pow2(1) = 1


@given(prompt=st.integers(1, 2048), output=st.integers(0, 2048))
def test_pow2_over_reserves_the_output_by_less_than_2x(prompt, output):
    """Against the paper's wording (section 6.1: "over-reserves the space for outputs by at
    most 2x"): the reservation is prompt + a power of two in [output, 2 * output), capped."""
    c = ContiguousKVCache(8192, 1, 1, policy="pow2", max_seq_len=4096, store_kv=False)
    final = prompt + output
    if final > 4096:
        with pytest.raises(ValueError, match="final_len"):
            c.reservation_size(prompt, final)
        return
    r = c.reservation_size(prompt, final)
    extra = r - prompt  # what is reserved for the output
    assert final <= r <= 4096
    assert r == 4096 or (extra & (extra - 1) == 0 and output <= extra < max(2 * output, 1))


def test_usage_categories_by_hand():
    c = ContiguousKVCache(1024, HKV, D, policy="pow2", max_seq_len=256, store_kv=False)
    c.reserve("a", 64, 100)  # 64 + next_pow2(36) = 128 slots at [0, 128)
    c.advance("a", 30)
    u = c.usage()
    assert (u.token, u.reserved, u.internal_fragmentation) == (30, 70, 28)
    # free blocks: 128 @128, 256 @256, 512 @512; a max-length (256) region fits in two of them
    assert (u.external_fragmentation, u.free) == (128, 768)
    assert c.usage(need=100) == KVUsage(1024, 30, 70, 28, 0, 896)  # a 128-block serves 100
    assert c.usage(need=1024).external_fragmentation == 896  # nothing serves 1024 now


def test_empty_arena_not_a_power_of_two_has_external_fragmentation():
    # 15,728 = 8192 + 4096 + 2048 + (1024 + 256 + 64 + 32 + 16): the last 1392 slots are in
    # blocks too small for a 2048-slot region, even with nothing allocated
    c = ContiguousKVCache(15728, 1, 1, max_seq_len=2048, store_kv=False)
    assert c.usage() == KVUsage(15728, 0, 0, 0, 1392, 14336)
    assert c.usage(need=16).external_fragmentation == 0


def test_rounding_slack_is_reported_apart_from_the_policy():
    c = ContiguousKVCache(1024, HKV, D, policy="oracle", max_seq_len=256, exact_fit=False)
    c.reserve("a", 10, 100)
    b = c.breakdown()
    assert (b["internal_policy"], b["internal_rounding"]) == (0, 28)  # 100 asked, 128 held
    assert c.usage().internal_fragmentation == 28
    assert sum(b.values()) == 1024


def test_max_policy_internal_fragmentation_is_the_unused_tail():
    c = ContiguousKVCache(1024, HKV, D, policy="max", max_seq_len=256)
    c.reserve("a", 10, 100)
    b = c.breakdown()
    assert (b["internal_policy"], b["internal_rounding"]) == (156, 0)


def test_written_kv_comes_back_exactly_and_views_are_read_only():
    rng = np.random.default_rng(0)
    c = ContiguousKVCache(256, HKV, D, policy="oracle", max_seq_len=64, dtype=np.float16)
    c.reserve(1, 5, 20)
    k1, v1 = kv_data(rng, 5, np.float16)
    k2, v2 = kv_data(rng, 3, np.float16)
    c.write(1, k1, v1)
    c.write(1, k2, v2)
    k, v = c.kv(1)
    assert k.shape == (8, HKV, D) and k.dtype == np.float16
    assert np.array_equal(k, np.concatenate([k1, k2]))
    assert np.array_equal(v, np.concatenate([v1, v2]))
    with pytest.raises(ValueError):
        k[0, 0, 0] = 1
    assert np.shares_memory(k, c.key_arena)  # a view: no gather, which contiguity buys


@pytest.mark.skipif(importlib.util.find_spec("minipaged.attention") is None,
                    reason="minipaged.attention is not written yet")
def test_dense_attention_reads_the_cache():
    from minipaged.attention import dense_attention

    rng = np.random.default_rng(1)
    c = ContiguousKVCache(128, HKV, D, policy="pow2", max_seq_len=32)
    c.reserve("x", 6, 9)
    c.reserve("y", 3, 4)
    kx, vx = kv_data(rng, 7)
    c.write("x", kx, vx)
    c.write("y", *kv_data(rng, 2))
    q = rng.standard_normal((1, 4, D)).astype(np.float32)  # [T=1, H=4, D], GQA 2 heads per KV
    # Same arithmetic on the same numbers: equal bit for bit
    assert np.array_equal(dense_attention(q, *c.kv("x")), dense_attention(q, kx, vx))


def test_release_everything_restores_the_arena():
    c = ContiguousKVCache(1000, HKV, D, policy="oracle", max_seq_len=200)
    for i, f in enumerate([37, 200, 5, 64, 99]):
        c.reserve(i, 1, f)
    for i in (3, 0, 4, 1, 2):
        c.release(i)
    assert c.allocator.free_blocks() == [(0, 512), (512, 256), (768, 128), (896, 64), (960, 32),
                                         (992, 8)]
    assert c.usage() == usage_by_slot(c)
