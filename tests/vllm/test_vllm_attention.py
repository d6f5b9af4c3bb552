"""Paged attention: minipaged's NumPy paths against vLLM's CPU attention op, same inputs.

Same queries, same K/V, block tables from minipaged's prefix-caching manager (shared prefix
blocks, tables scattered over the pool): ``minipaged.paged_attention`` (decode) and
``minipaged.paged_prefill_attention`` (ragged prefill after prefix-cache hits, mixed with
decodes) against ``vllm._custom_ops.cpu_attention_with_kv_cache`` with its
``cpu_attn_get_scheduler_metadata``; the K/V are written on each side by its own
``reshape_and_cache`` (tests/vllm/peer_attention.py).

vLLM's CPU code path is pinned, since each has its own cache layout: ``isa="vec16"`` at block
size 16 and ``isa="vec"`` at block size 32. On an x86 machine without AMX these are the paths
vLLM itself picks (``_get_attn_isa``, vllm/v1/attention/backends/cpu_attn.py:520-558: "amx"
only with AMX tiles, bf16 and a block size that is a multiple of 32); the paths are passed
explicitly anyway, so an AMX machine runs the same comparison.

Tolerances, and why:
  fp32  both sides compute in float32, in different orders (vLLM in SIMD lanes and its own
        tiles, NumPy pairwise): |vLLM - minipaged| <= 4e-6 + 4e-6 |minipaged|, about 34
        float32 ulps at 1.0, for softmax-weighted sums over at most ~150 keys. Measured on
        this suite: at most 1.1e-6, no element above 17% of its tolerance; each side is as
        far from a float64 run of minipaged's oracle path as from the other.
  bf16  vLLM runs in bf16 (bf16 caches, queries and output); minipaged computes in float32 on
        the very same bf16-rounded inputs. vLLM rounds its output to bf16 (at most 2^-8
        relative) and may round the softmax weights to bf16 before P.V (at most
        2^-8 * max|V| absolute): |vLLM - minipaged| <= 2^-8 * (|minipaged| + max|V|), the sum
        of the two bounds. Measured: at most 7.6e-3, no element above 31% of its tolerance;
        minipaged's fp32 result is within 6e-7 of float64, so this is vLLM's bf16 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

import minipaged

pytestmark = pytest.mark.requires("vllm")

BLOCK_SIZES = (16, 32)
GQA = (1, 2, 8)          # query heads per KV head, H = 8
H, D = 8, 64


@pytest.fixture(scope="module")
def peer():
    import peer_attention
    import torch

    return peer_attention, torch


def _dtype(torch, name):
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


def _builder(peer, torch, block_size, gqa, dtype_name, seed):
    pa, _ = peer
    rng = np.random.default_rng(seed)
    return pa.BatchBuilder(rng, block_size, H // gqa, H, D, _dtype(torch, dtype_name)), rng


def _prompts(rng, block_size):
    """A system prompt of 2.5 blocks, then suffixes: one ends exactly on a block boundary
    (its last block is recomputed), one is shorter than a block."""
    system = list(rng.integers(1000, size=5 * block_size // 2))
    ends = [block_size // 2 + 1, 3 * block_size // 2, 1, 2 * block_size + 3]
    return [system + list(rng.integers(1000, size=n)) for n in ends]


def decode_batch(b, rng, block_size):
    """Five sequences (four sharing a prefix), each decoded across block boundaries."""
    seqs = []
    for i, tokens in enumerate(_prompts(rng, block_size) + [list(rng.integers(1000, size=7))]):
        b.prefill(f"s{i}", tokens)
        b.decode(f"s{i}", int(rng.integers(1, block_size + 5)))
        seqs.append(f"s{i}")
    return b.batch(seqs)


def prefill_batch(b, rng, block_size):
    """Two sequences decoding (one new token each) and four prefilling after cache hits, in
    one ragged batch: query_lens < seq_lens wherever the prefix cache hit."""
    b.prefill("d0", list(rng.integers(1000, size=block_size + 3)))
    b.prefill("d1", list(rng.integers(1000, size=3 * block_size)))
    b.decode("d0", 2)
    b.decode("d1", block_size)
    seqs = ["d0", "d1"]
    for i, tokens in enumerate(_prompts(rng, block_size)):
        b.prefill(f"p{i}", tokens)
        seqs.append(f"p{i}")
    batch = b.batch(seqs)
    assert (batch.query_lens < batch.seq_lens).sum() >= 4  # hits and decodes are in there
    return batch


def _tolerance(dtype_name, ref, value_cache):
    if dtype_name == "fp32":
        return 4e-6 + 4e-6 * np.abs(ref)
    return 2.0 ** -8 * (np.abs(ref) + np.abs(value_cache).max())


@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_layout_conversion_is_vllms_own_byte_for_byte(peer, block_size, dtype_name):
    """Every token written by both sides: converting minipaged's caches gives exactly the
    bytes vLLM's cpu_attn_reshape_and_cache wrote (and back again)."""
    pa, torch = peer
    b, rng = _builder(peer, torch, block_size, 2, dtype_name, seed=1)
    prefill_batch(b, rng, block_size)
    key, value = pa.to_vllm_layout(b.key_cache, b.value_cache, b.dtype)
    assert b.key_cache.any()
    assert pa.same_bytes(key, b.vllm_key)
    assert pa.same_bytes(value, b.vllm_value)
    k, v = pa.from_vllm_layout(b.vllm_key, b.vllm_value)
    assert np.array_equal(k, b.key_cache) and np.array_equal(v, b.value_cache)
    # The layout is really transposed: the untransposed copy differs (so the check can fail).
    plain = torch.from_numpy(b.key_cache).to(b.dtype)
    assert not pa.same_bytes(plain, b.vllm_key)


@pytest.mark.parametrize("method", ["gather", "online"])
@pytest.mark.parametrize("dtype_name", ["fp32", "bf16"])
@pytest.mark.parametrize("gqa", GQA)
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_attention_matches_vllm(peer, mode, block_size, gqa, dtype_name, method):
    pa, torch = peer
    b, rng = _builder(peer, torch, block_size, gqa, dtype_name, seed=block_size * 10 + gqa)
    if mode == "decode":
        batch = decode_batch(b, rng, block_size)
        ref = minipaged.paged_attention(batch.query, batch.key_cache, batch.value_cache,
                                        batch.block_tables, batch.seq_lens, method=method)
    else:
        batch = prefill_batch(b, rng, block_size)
        ref = minipaged.paged_prefill_attention(batch.query, batch.key_cache,
                                                batch.value_cache, batch.block_tables,
                                                batch.seq_lens, batch.query_lens,
                                                method=method)
    # vLLM reads minipaged's caches, converted (checked byte for byte above).
    key, value = pa.to_vllm_layout(batch.key_cache, batch.value_cache, b.dtype)
    out = pa.vllm_attention(batch, key, value, block_size, b.dtype)
    err = np.abs(out - ref)
    tol = _tolerance(dtype_name, ref, batch.value_cache)
    worst = np.unravel_index(np.argmax(err - tol), err.shape)
    assert (err <= tol).all(), (f"max |vLLM - minipaged| = {err.max():.3g} at {worst} "
                                f"(tolerance there {tol[worst]:.3g})")
    # vLLM's output is not trivially close: it really attends over many keys per query.
    assert np.abs(out).max() > 0.05 and batch.seq_lens.max() > 3 * block_size


def test_comparison_catches_a_wrong_block_table(peer):
    """The same comparison fails when vLLM is handed a table pointing at another sequence's
    block. (Swapping two full blocks of one table would not do: without positions in the
    arithmetic, attention is invariant to the order of its keys.)"""
    pa, torch = peer
    b, rng = _builder(peer, torch, 16, 2, "fp32", seed=5)
    batch = decode_batch(b, rng, 16)
    ref = minipaged.paged_attention(batch.query, batch.key_cache, batch.value_cache,
                                    batch.block_tables, batch.seq_lens)
    key, value = pa.to_vllm_layout(batch.key_cache, batch.value_cache, b.dtype)
    assert batch.block_tables[4, 0] not in batch.block_tables[0]  # s4 shares nothing with s0
    batch.block_tables[0, 0] = batch.block_tables[4, 0]
    out = pa.vllm_attention(batch, key, value, 16, b.dtype)
    assert np.abs(out - ref).max() > 1e-3
