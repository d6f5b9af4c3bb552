"""SPOILER: reference solution of exercise 07 (online softmax over blocks).

Try the exercise first: exercises/07_online_softmax.py, graded by `minipaged check 7`.
"""

from __future__ import annotations

import numpy as np

EXERCISE = "07_online_softmax"


def merge_partials(m_a, l_a, o_a, m_b, l_b, o_b):
    m = np.maximum(m_a, m_b)
    la = l_a * np.exp(m_a - m)
    lb = l_b * np.exp(m_b - m)
    l = la + lb
    o = (la[..., None] * o_a + lb[..., None] * o_b) / l[..., None]
    return m, l, o


def paged_attention_online(query, key_cache, value_cache, block_tables, seq_lens, scale=None):
    s_count, h, d = query.shape
    nb, hkv, bs, dk = key_cache.shape
    if h % hkv:
        raise ValueError(f"H={h} query heads is not a multiple of Hkv={hkv} KV heads")
    if dk != d:
        raise ValueError(f"query head size {d} != cache head size {dk}")
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    group = h // hkv
    out = np.empty_like(query)
    for s in range(s_count):
        seq_len = int(seq_lens[s])
        if seq_len < 1:
            raise ValueError(f"seq_lens[{s}]={seq_len} must be >= 1")
        q = query[s]                                                   # [H, D]
        m = l = o = None
        for i in range(-(-seq_len // bs)):
            b = int(block_tables[s, i])
            if not 0 <= b < nb:
                raise ValueError(f"block_tables[{s}, {i}]={b} is outside [0, NB={nb})")
            n = min(bs, seq_len - i * bs)
            k = np.repeat(key_cache[b, :, :n, :].transpose(1, 0, 2), group, axis=1)  # [n, H, D]
            v = np.repeat(value_cache[b, :, :n, :].transpose(1, 0, 2), group, axis=1)
            logits = np.einsum("hd,nhd->hn", q, k) * scale             # [H, n]
            mb = logits.max(axis=1)
            p = np.exp(logits - mb[:, None])
            lb = p.sum(axis=1)
            ob = np.einsum("hn,nhd->hd", p, v) / lb[:, None]
            if m is None:
                m, l, o = mb, lb, ob
            else:
                m, l, o = merge_partials(m, l, o, mb, lb, ob)
        out[s] = o
    return out
