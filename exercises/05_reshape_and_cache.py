"""Exercise 05: write new tokens' K/V into the pages (vLLM's reshape_and_cache).

Lesson: lessons/03_*.py (paging).  Check: minipaged check 5

Shapes (the project's one cache layout, NumPy and CUDA alike):
    key, value                [T, Hkv, D]        the new tokens' keys and values
    key_cache, value_cache    [NB, Hkv, BS, D]   the pool of physical blocks
    slot_mapping              int [T]            slot = physical_block * BS + offset

Token t goes to block slot_mapping[t] // BS at offset slot_mapping[t] % BS, for every KV head:
    key_cache[b, :, o, :] = key[t]
A negative slot means "padding, skip this token" (batches are padded to a common length).
"""

from __future__ import annotations

import numpy as np

EXERCISE = "05_reshape_and_cache"


def reshape_and_cache(key: np.ndarray, value: np.ndarray, key_cache: np.ndarray,
                      value_cache: np.ndarray, slot_mapping: np.ndarray) -> None:
    """Scatter key/value [T, Hkv, D] into key_cache/value_cache [NB, Hkv, BS, D], in place.

    Invariants: only the slots named by non-negative entries change; nothing is returned.
    Errors: ValueError (or IndexError) when a slot is >= NB * BS; ValueError when shapes
    disagree (key vs value, Hkv or D vs the cache, len(slot_mapping) vs T).
    Hint: keep = slot_mapping >= 0; blocks, offsets = divmod(slot_mapping[keep], BS);
    key_cache[blocks, :, offsets, :] = key[keep] (fancy indexing: no loop needed).
    """
    raise NotImplementedError
