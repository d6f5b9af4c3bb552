"""What the contiguous KV cache's tests share: the shape of their K/V, random K/V of that
shape, and the slot-by-slot oracle for ``usage``.

tests/test_contiguous.py checks the policies, the accounting and the K/V read back,
tests/test_contiguous_errors.py every bad input, and tests/test_contiguous_stateful.py all of it
under random reserve / write / release.
"""

from __future__ import annotations

import numpy as np

from minipaged import ContiguousKVCache
from minipaged.contiguous.buddy import next_pow2
from minipaged.contiguous.usage import CATEGORIES, KVUsage

HKV, D = 2, 4


def usage_by_slot(c: ContiguousKVCache, need: int | None = None) -> KVUsage:
    """The oracle for ``usage``: the definition slot by slot. Each slot of the arena is painted
    with its category (a request's slots: n token, then F - n reserved, then H - F internal; a
    free block's slots: free if the block could hold a region of ``need``, else external)."""
    need = c.max_seq_len if need is None else need
    paint = np.full(c.num_slots, "", dtype=object)
    for sid in c.seq_ids:
        r = c.reservation(sid)
        paint[r.offset:r.offset + r.num_tokens] = "token"
        paint[r.offset + r.num_tokens:r.offset + r.final_len] = "reserved"
        paint[r.offset + r.final_len:r.offset + r.held] = "internal_fragmentation"
    for off, n in c.allocator.free_blocks():
        paint[off:off + n] = "free" if n >= next_pow2(need) else "external_fragmentation"
    assert (paint != "").all(), "a slot is neither held nor free"
    return KVUsage(total=c.num_slots, **{cat: int((paint == cat).sum()) for cat in CATEGORIES})


def kv_data(rng: np.random.Generator, t: int, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    return (rng.standard_normal((t, HKV, D)).astype(dtype),  # [T, Hkv, D]
            rng.standard_normal((t, HKV, D)).astype(dtype))
