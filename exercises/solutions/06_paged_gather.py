"""SPOILER: reference solution of exercise 06 (paged attention by gathering).

Try the exercise first: exercises/06_paged_gather.py, graded by `minipaged check 6`.
"""

from __future__ import annotations

import numpy as np

EXERCISE = "06_paged_gather"


def gather_kv(key_cache, value_cache, block_table_row, seq_len):
    nb, hkv, bs, d = key_cache.shape
    if seq_len < 1:
        raise ValueError(f"seq_len={seq_len} must be >= 1")
    n = -(-seq_len // bs)
    row = np.asarray(block_table_row)
    if n > row.shape[0]:
        raise ValueError(f"seq_len={seq_len} needs {n} blocks; the table holds {row.shape[0]}")
    blocks = row[:n]
    if blocks.min() < 0 or blocks.max() >= nb:
        raise ValueError(f"block table entries {blocks.tolist()} must lie in [0, NB={nb})")
    k = key_cache[blocks].transpose(0, 2, 1, 3).reshape(n * bs, hkv, d)[:seq_len]
    v = value_cache[blocks].transpose(0, 2, 1, 3).reshape(n * bs, hkv, d)[:seq_len]
    return k, v


def paged_attention_gather(query, key_cache, value_cache, block_tables, seq_lens, scale=None):
    s_count, h, d = query.shape
    hkv = key_cache.shape[1]
    if h % hkv:
        raise ValueError(f"H={h} query heads is not a multiple of Hkv={hkv} KV heads")
    if key_cache.shape[3] != d:
        raise ValueError(f"query head size {d} != cache head size {key_cache.shape[3]}")
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    out = np.empty_like(query)
    for s in range(s_count):
        k, v = gather_kv(key_cache, value_cache, block_tables[s], int(seq_lens[s]))
        k = np.repeat(k, h // hkv, axis=1)                  # [Tk, H, D]
        v = np.repeat(v, h // hkv, axis=1)
        logits = np.einsum("hd,thd->ht", query[s], k) * scale   # [H, Tk]
        logits = logits - logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        out[s] = np.einsum("ht,thd->hd", p, v)
    return out
