"""SPOILER: reference solution of exercise 05 (reshape_and_cache).

Try the exercise first: exercises/05_reshape_and_cache.py, graded by `minipaged check 5`.
"""

from __future__ import annotations

import numpy as np

EXERCISE = "05_reshape_and_cache"


def reshape_and_cache(key: np.ndarray, value: np.ndarray, key_cache: np.ndarray,
                      value_cache: np.ndarray, slot_mapping: np.ndarray) -> None:
    nb, hkv, bs, d = key_cache.shape
    if key.shape != value.shape:
        raise ValueError(f"key.shape={key.shape} != value.shape={value.shape}")
    if value_cache.shape != key_cache.shape:
        raise ValueError(f"value_cache.shape={value_cache.shape} != "
                         f"key_cache.shape={key_cache.shape}")
    if key.ndim != 3 or key.shape[1:] != (hkv, d):
        raise ValueError(f"key.shape={key.shape}; expected [T, {hkv}, {d}]")
    slots = np.asarray(slot_mapping)
    if slots.shape != (key.shape[0],):
        raise ValueError(f"slot_mapping.shape={slots.shape}; expected ({key.shape[0]},)")
    if slots.size and slots.max() >= nb * bs:
        raise ValueError(f"slot {int(slots.max())} >= NB * BS = {nb * bs}")
    keep = slots >= 0
    blocks, offsets = np.divmod(slots[keep], bs)
    key_cache[blocks, :, offsets, :] = key[keep]
    value_cache[blocks, :, offsets, :] = value[keep]
