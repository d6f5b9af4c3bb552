"""Paged attention on both sides: minipaged's NumPy paths and vLLM's CPU attention op.

A batch is built the way an engine builds one: sequences sharing a system prompt are
allocated in a prefix-caching ``minipaged.KVCacheManager`` (so block tables share blocks and
are scattered over the pool), K/V are written only for the tokens a sequence computes (a
prefix-cache hit reads K/V written by an earlier sequence), at the slots the manager maps them
to. Each token's K/V go through *each side's own* write op: ``minipaged.reshape_and_cache``
into the [NB, Hkv, BS, D] NumPy caches, ``vllm._custom_ops.cpu_attn_reshape_and_cache`` into
vLLM's. ``to_vllm_layout`` converts minipaged's caches to vLLM's layout, and the tests check
it against what vLLM's own writer produced, byte for byte.

vLLM's layout on the vectorised CPU paths (``isa`` "vec" and "vec16"): the backend declares
each cache [NB, Hkv, BS, D] (vllm/v1/attention/backends/cpu_attn.py:411-415, a view of one
[NB, Hkv, 2*BS, D] tensor split into K and V), V is stored in that order, but within each
(block, head) K is stored transposed, [D, BS]: element (t, d) at offset d * BS + t. (This is
measured, not read: the layout test below writes through vLLM's op and compares.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import vllm._custom_ops as ops

import minipaged

ISA = {16: "vec16", 32: "vec"}  # the CPU path pinned per block size (see test module)


def to_vllm_layout(key_cache: np.ndarray, value_cache: np.ndarray,
                   dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """minipaged's caches [NB, Hkv, BS, D] as vLLM's CPU caches: K transposed within each
    (block, head) to [D, BS] in memory, then viewed with vLLM's declared shape
    [NB, Hkv, BS, D]; V unchanged. Values are cast to ``dtype`` (exact for bf16-rounded
    inputs)."""
    k = np.ascontiguousarray(key_cache.transpose(0, 1, 3, 2))      # [NB, Hkv, D, BS]
    key = torch.from_numpy(k).to(dtype).reshape(key_cache.shape)   # same bytes, vLLM's shape
    value = torch.from_numpy(value_cache.copy()).to(dtype)         # [NB, Hkv, BS, D]
    return key, value


def from_vllm_layout(key: torch.Tensor, value: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of ``to_vllm_layout``, in float32."""
    nb, hkv, bs, d = key.shape
    k = key.float().reshape(nb, hkv, d, bs).numpy().transpose(0, 1, 3, 2)
    return np.ascontiguousarray(k), value.float().numpy().copy()


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(
        a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@dataclass
class Batch:
    """One attention call's worth of inputs, on both sides."""
    query: np.ndarray           # [T, H, D] float32 (values exactly representable in dtype)
    block_tables: np.ndarray    # int32 [S, MB], padded with -1
    seq_lens: np.ndarray        # int32 [S], tokens in the cache, the new ones included
    query_lens: np.ndarray      # int32 [S], new tokens per sequence (1 for a decode)
    key_cache: np.ndarray       # minipaged's caches [NB, Hkv, BS, D] float32
    value_cache: np.ndarray
    vllm_key: torch.Tensor      # vLLM's caches, written by its own reshape_and_cache
    vllm_value: torch.Tensor


class BatchBuilder:
    """Sequences in a prefix-caching manager, their K/V written on both sides as computed."""

    def __init__(self, rng: np.random.Generator, block_size: int, num_kv_heads: int,
                 num_heads: int, head_size: int, dtype: torch.dtype, num_blocks: int = 96):
        self.rng, self.bs, self.hkv, self.h, self.d = (rng, block_size, num_kv_heads,
                                                       num_heads, head_size)
        self.dtype = dtype
        self.mgr = minipaged.KVCacheManager(num_blocks, block_size, enable_prefix_caching=True)
        shape = (num_blocks, num_kv_heads, block_size, head_size)
        self.key_cache = np.zeros(shape, np.float32)
        self.value_cache = np.zeros(shape, np.float32)
        self.vllm_key = torch.zeros(shape, dtype=dtype)
        self.vllm_value = torch.zeros(shape, dtype=dtype)
        self.new: dict[str, int] = {}  # seq -> tokens computed in the current batch

    def _randn(self, *shape: int) -> np.ndarray:
        """Normal values rounded to ``dtype`` (then exactly float32 again): both sides see the
        very same numbers."""
        x = torch.from_numpy(self.rng.standard_normal(shape).astype(np.float32))
        return x.to(self.dtype).float().numpy()

    def _write(self, seq: str, start: int, end: int) -> None:
        """K/V of positions [start, end) of ``seq``, on both sides, at the manager's slots."""
        n = end - start
        k, v = self._randn(n, self.hkv, self.d), self._randn(n, self.hkv, self.d)
        slots = self.mgr.slot_mapping(seq, start, end)
        minipaged.reshape_and_cache(k, v, self.key_cache, self.value_cache, slots)
        ops.cpu_attn_reshape_and_cache(torch.from_numpy(k).to(self.dtype),
                                       torch.from_numpy(v).to(self.dtype), self.vllm_key,
                                       self.vllm_value, torch.from_numpy(slots),
                                       ISA[self.bs])

    def prefill(self, seq: str, tokens: list[int]) -> None:
        """Allocate a prompt; compute (write) only what the prefix cache did not hold."""
        hits = self.mgr.allocate(seq, tokens)
        self._write(seq, hits, len(tokens))
        self.new[seq] = len(tokens) - hits

    def decode(self, seq: str, steps: int) -> None:
        """``steps`` decode steps: one token each, its K/V written at its new slot."""
        for _ in range(steps):
            n = self.mgr.seq_len(seq)
            self.mgr.append_slot(seq, int(self.rng.integers(1000)))
            self._write(seq, n, n + 1)
        self.new[seq] = 1

    def batch(self, seqs: list[str]) -> Batch:
        """The attention inputs for the tokens computed last in each of ``seqs``."""
        qlens = np.array([self.new[s] for s in seqs], np.int32)
        return Batch(self._randn(int(qlens.sum()), self.h, self.d),
                     self.mgr.block_tables(seqs), np.array([self.mgr.seq_len(s) for s in seqs],
                                                           np.int32), qlens,
                     self.key_cache, self.value_cache, self.vllm_key, self.vllm_value)


def vllm_attention(b: Batch, key: torch.Tensor, value: torch.Tensor, block_size: int,
                   dtype: torch.dtype) -> np.ndarray:
    """vLLM's CPU attention op on ``b`` (causal, no sliding window, no softcap, no sinks), on
    the pinned ``isa``; returns [T, H, D] as float32."""
    num_heads, head_size = b.query.shape[1], b.query.shape[2]
    num_kv_heads = key.shape[1]
    qsl = torch.from_numpy(np.concatenate([[0], np.cumsum(b.query_lens)]).astype(np.int32))
    seq_lens = torch.from_numpy(b.seq_lens)
    isa = ISA[block_size]
    metadata = ops.cpu_attn_get_scheduler_metadata(
        len(b.seq_lens), num_heads, num_kv_heads, head_size, seq_lens, dtype, qsl,
        True, -1, isa, False)
    query = torch.from_numpy(b.query).to(dtype)
    out = torch.empty_like(query)
    ops.cpu_attention_with_kv_cache(query, key, value, out, qsl, seq_lens, head_size ** -0.5,
                                    True, None, -1, torch.from_numpy(b.block_tables), 0.0,
                                    metadata, None)
    return out.float().numpy()
