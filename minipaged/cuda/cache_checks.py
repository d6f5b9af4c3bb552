"""What the cache kernels trust (reshape_and_cache, copy_blocks), checked before the launch.

What it teaches: the same discipline as checks.py for the two kernels that write the cache:
every slot and block index a kernel will follow is checked on the host, and so is everything
that would make their blocks race (two tokens for one slot, a block both copied from and to),
because the blocks of a launch run in no particular order. Oracle: minipaged.paged.cache_ops,
whose check of the cache pair runs here too.
Read next: launch.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipaged.cuda import checks
from minipaged.paged.cache_ops import check_caches


def _check_arrays(backend: str, key_cache: Any, value_cache: Any, **others: Any
                  ) -> tuple[str, tuple[int, int, int, int]]:
    """Every array of the backend's kind and C-contiguous; the caches pass NumPy's cache check
    (and, NumPy arrays, its writable check) in a compiled dtype. Returns (dtype, shape)."""
    arrays = {"key_cache": key_cache, "value_cache": value_cache, **others}
    checks.check_types(backend, **arrays)
    check_caches(checks.host_view(key_cache), checks.host_view(value_cache),
                 writable=isinstance(key_cache, np.ndarray))
    for name, a in arrays.items():
        checks.check_contiguous(name, a)
    dtype = checks.check_float_dtype("key_cache", key_cache)
    return dtype, tuple(int(x) for x in key_cache.shape)


def check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, *,
                            backend) -> tuple[str, np.ndarray]:
    """Validate; return (dtype, the slots as int64 [T] on the host)."""
    dt, (nb, hkv, bs, d) = _check_arrays(backend, key_cache, value_cache, key=key, value=value,
                                         slot_mapping=slot_mapping)
    for name, a, ndim in (("key", key, 3), ("value", value, 3), ("slot_mapping", slot_mapping, 1)):
        if a.ndim != ndim:
            raise ValueError(f"{name} has shape {tuple(a.shape)}; expected {ndim} dimensions")
    for name, a in (("key", key), ("value", value)):
        if np.dtype(a.dtype).name != dt:
            raise TypeError(f"{name}.dtype is {np.dtype(a.dtype).name} but key_cache.dtype is "
                            f"{dt}; they must match (the kernel copies bits, it does not convert)")
    if tuple(key.shape) != tuple(value.shape):
        raise ValueError(f"key has shape {tuple(key.shape)} but value has {tuple(value.shape)}")
    t = int(key.shape[0])
    if tuple(key.shape[1:]) != (hkv, d):
        raise ValueError(f"key has shape {tuple(key.shape)}; expected [T, Hkv={hkv}, D={d}] to "
                         "match the caches")
    if slot_mapping.shape[0] != t:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries; expected T={t}")
    checks.check_int_dtype("slot_mapping", slot_mapping, ("int32", "int64"))
    slots = checks.to_host(slot_mapping).astype(np.int64)
    bad = np.flatnonzero(slots >= nb * bs)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"slot_mapping[{i}] = {int(slots[i])} is out of range: NB={nb} blocks "
                         f"of BS={bs} hold slots 0..{nb * bs - 1} (negative means skip)")
    valid = slots[slots >= 0]
    if np.unique(valid).size != valid.size:
        raise ValueError("slot_mapping names one slot twice; two tokens cannot share a slot "
                         "(and the kernel's blocks run in no particular order)")
    return dt, slots


def check_copy_blocks(key_cache, value_cache, block_mapping, *, backend) -> tuple[str, np.ndarray]:
    """Validate; return (dtype, mapping as int64 [N, 2] on the host)."""
    dt, (nb, _, _, _) = _check_arrays(backend, key_cache, value_cache)
    if hasattr(block_mapping, "shape"):  # a NumPy or CuPy array
        m = checks.to_host(block_mapping)
        if m.dtype.kind not in "iu":
            raise TypeError(f"block_mapping.dtype is {m.dtype}; expected an integer array [N, 2]")
    else:
        m = list(block_mapping)
        for i, p in enumerate(m):
            if (not isinstance(p, (tuple, list)) or len(p) != 2
                    or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                               for x in p)):
                raise TypeError(f"block_mapping[{i}] = {p!r}; expected a (src, dst) pair of ints")
        m = np.array(m, dtype=np.int64).reshape(len(m), 2)
    if m.ndim != 2 or m.shape[1] != 2:
        raise ValueError(f"block_mapping has shape {m.shape}; expected [N, 2] (src, dst) pairs")
    bad = np.argwhere((m < 0) | (m >= nb))
    if bad.size:
        i, j = (int(x) for x in bad[0])
        raise ValueError(f"block_mapping[{i}, {j}] = {int(m[i, j])} is out of range [0, NB={nb})")
    if np.unique(m[:, 1]).size != m.shape[0]:
        raise ValueError("block_mapping writes one destination block twice")
    overlap = np.intersect1d(m[:, 0], m[:, 1])
    if overlap.size:
        raise ValueError(f"block_mapping uses block {int(overlap[0])} both as a source and as a "
                         "destination; the copies run in no particular order, so that is "
                         "ambiguous")
    return dt, np.ascontiguousarray(m, dtype=np.int64)
