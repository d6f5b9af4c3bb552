"""Shared data for the CUDA tests (no tests here): random paged-attention cases, placements.

A *case* is the logical content (queries and each sequence's K/V in token order); a *placement*
puts that content into a physical pool through block tables. The kernels must give the same
bits for every placement of one case, and match the float64 reference within a stated bound.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np


def examples(dev: int, ci: int) -> int:
    """Hypothesis examples for a slow emulated test: few in the dev profile (the harness runs
    every CUDA thread as a fiber, on shared cores), more in the ci profile."""
    return ci if os.environ.get("HYPOTHESIS_PROFILE") == "ci" else dev


@dataclass
class Case:
    q: np.ndarray              # [S, H, D]
    keys: list[np.ndarray]     # per sequence [n, Hkv, D]
    values: list[np.ndarray]   # per sequence [n, Hkv, D]
    block_size: int

    @property
    def seq_lens(self) -> np.ndarray:
        return np.array([k.shape[0] for k in self.keys], dtype=np.int32)


def make_case(seed: int, *, dtype: str, num_heads: int, num_kv_heads: int, head_size: int,
              block_size: int, lens: list[int]) -> Case:
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    q = rng.standard_normal((len(lens), num_heads, head_size)).astype(dt)
    keys = [rng.standard_normal((n, num_kv_heads, head_size)).astype(dt) for n in lens]
    values = [rng.standard_normal((n, num_kv_heads, head_size)).astype(dt) for n in lens]
    return Case(q, keys, values, block_size)


def place(case: Case, *, seed: int | None = None):
    """(key_cache, value_cache, block_tables) for this case.

    seed=None: the contiguous placement: sequence after sequence, identity-like block tables,
    unused slots zero, table padding -1. Otherwise a random placement: the blocks permuted in a
    larger pool, every unused slot and free block NaN, table padding random garbage."""
    bs = case.block_size
    nblocks = [-(-k.shape[0] // bs) for k in case.keys]
    total = sum(nblocks)
    hkv, d = case.keys[0].shape[1:]
    dt = case.q.dtype
    rng = np.random.default_rng(seed)
    extra = 0 if seed is None else int(rng.integers(0, 6))
    nb = total + extra
    mb = max(nblocks) + (0 if seed is None else int(rng.integers(0, 3)))
    fill = 0.0 if seed is None else np.nan
    kc = np.full((nb, hkv, bs, d), fill, dtype=dt)
    vc = np.full((nb, hkv, bs, d), fill, dtype=dt)
    physical = np.arange(nb) if seed is None else rng.permutation(nb)
    if seed is None:
        tables = np.full((len(case.keys), mb), -1, dtype=np.int32)
    else:
        tables = rng.integers(-(10**6), 10**6, size=(len(case.keys), mb)).astype(np.int32)
    nxt = 0
    for i, (k, v) in enumerate(zip(case.keys, case.values)):
        n = k.shape[0]
        for j in range(nblocks[i]):
            p = int(physical[nxt])
            nxt += 1
            tables[i, j] = p
            lo, hi = j * bs, min(n, (j + 1) * bs)
            kc[p, :, : hi - lo] = k[lo:hi].transpose(1, 0, 2)
            vc[p, :, : hi - lo] = v[lo:hi].transpose(1, 0, 2)
    return kc, vc, tables


def reference(case: Case, scale: float | None = None) -> np.ndarray:
    """Softmax attention of each query row over its sequence's K/V, in float64: [S, H, D]."""
    s, h, d = case.q.shape
    hkv = case.keys[0].shape[1]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    out = np.empty((s, h, d))
    for i in range(s):
        k = case.keys[i].astype(np.float64)                          # [n, Hkv, D]
        v = case.values[i].astype(np.float64)
        q = case.q[i].astype(np.float64).reshape(hkv, h // hkv, d)  # [Hkv, H/Hkv, D]
        logits = np.einsum("kgd,nkd->kgn", q, k) * scale
        w = np.exp(logits - logits.max(axis=-1, keepdims=True))
        w /= w.sum(axis=-1, keepdims=True)
        out[i] = np.einsum("kgn,nkd->kgd", w, v).reshape(h, d)
    return out


def tolerance(dtype: str, ref: np.ndarray) -> np.ndarray:
    """Allowed |kernel - float64 reference|, elementwise.

    float32: the kernel sums in a different order than the reference and uses expf; with inputs
    ~N(0, 1) that costs a few float32 ulps, so 2e-5 absolute plus 2e-5 relative.
    float16: inputs are exact in float64; the kernel computes in float32 and rounds the output
    once to float16, which is off by at most half an ulp (2^-11 relative), and the float32 error
    can push a value just across a rounding boundary: one full ulp (2^-10 relative) plus 1e-4."""
    if dtype == "float16":
        return 2.0**-10 * np.abs(ref) + 1e-4
    return 2e-5 * np.abs(ref) + 2e-5
