"""What the cache kernels trust (reshape_and_cache, copy_blocks), checked before the launch.

What it teaches: the same discipline as checks.py for the two kernels that write the cache:
every slot and block index a kernel will follow is checked on the host, and so is everything
that would make their blocks race (two tokens for one slot, a block both copied from and to),
because the blocks of a launch run in no particular order. Oracle: minipaged.paged.cache_ops.
Read next: launch.py.
"""

from __future__ import annotations

import numpy as np

from minipaged.cuda.checks import (
    _check_backend,
    _check_contiguous,
    _check_float,
    _check_int,
    _check_type,
    _dtype_name,
    _to_host,
)


def _check_array(name: str, a, ndim: int, backend: str) -> None:
    _check_type(name, a, backend)
    if a.ndim != ndim:
        raise ValueError(f"{name} has shape {tuple(a.shape)}; expected {ndim} dimensions")
    _check_contiguous(name, a)


def _check_writeable(name: str, a) -> None:
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        raise ValueError(f"{name} is read-only; the kernel writes into it in place")




def check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, *,
                            backend) -> tuple[str, int]:
    """Validate; return (dtype, T)."""
    _check_backend(backend)
    _check_array("key", key, 3, backend)
    _check_array("value", value, 3, backend)
    _check_array("key_cache", key_cache, 4, backend)
    _check_array("value_cache", value_cache, 4, backend)
    _check_array("slot_mapping", slot_mapping, 1, backend)
    dt = _check_float("key_cache", key_cache)
    for name, a in (("key", key), ("value", value), ("value_cache", value_cache)):
        if _dtype_name(a) != dt:
            raise TypeError(f"{name}.dtype is {_dtype_name(a)} but key_cache.dtype is {dt}; "
                            "they must match (the kernel copies bits, it does not convert)")
    _check_writeable("key_cache", key_cache)
    _check_writeable("value_cache", value_cache)
    if tuple(key_cache.shape) != tuple(value_cache.shape):
        raise ValueError(f"key_cache has shape {tuple(key_cache.shape)} but value_cache has "
                         f"{tuple(value_cache.shape)}; both must be [NB, Hkv, BS, D]")
    nb, hkv, bs, d = (int(x) for x in key_cache.shape)
    if tuple(key.shape) != tuple(value.shape):
        raise ValueError(f"key has shape {tuple(key.shape)} but value has {tuple(value.shape)}")
    t = int(key.shape[0])
    if tuple(key.shape[1:]) != (hkv, d):
        raise ValueError(f"key has shape {tuple(key.shape)}; expected [T, Hkv={hkv}, D={d}] to "
                         "match the caches")
    if slot_mapping.shape[0] != t:
        raise ValueError(f"slot_mapping has {slot_mapping.shape[0]} entries; expected T={t}")
    _check_int("slot_mapping", slot_mapping, ("int32", "int64"))
    slots = _to_host(slot_mapping).astype(np.int64)
    bad = np.flatnonzero(slots >= nb * bs)
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"slot_mapping[{i}] = {int(slots[i])} is out of range: NB={nb} blocks "
                         f"of BS={bs} hold slots 0..{nb * bs - 1} (negative means skip)")
    valid = slots[slots >= 0]
    if np.unique(valid).size != valid.size:
        raise ValueError("slot_mapping names one slot twice; two tokens cannot share a slot "
                         "(and the kernel's blocks run in no particular order)")
    return dt, t


def check_copy_blocks(key_cache, value_cache, block_mapping, *, backend) -> tuple[str, np.ndarray]:
    """Validate; return (dtype, mapping as int64 [N, 2] on the host)."""
    _check_backend(backend)
    _check_array("key_cache", key_cache, 4, backend)
    _check_array("value_cache", value_cache, 4, backend)
    dt = _check_float("key_cache", key_cache)
    if _dtype_name(value_cache) != dt:
        raise TypeError(f"value_cache.dtype is {_dtype_name(value_cache)} but key_cache.dtype "
                        f"is {dt}; they must match")
    if tuple(key_cache.shape) != tuple(value_cache.shape):
        raise ValueError(f"key_cache has shape {tuple(key_cache.shape)} but value_cache has "
                         f"{tuple(value_cache.shape)}; both must be [NB, Hkv, BS, D]")
    _check_writeable("key_cache", key_cache)
    _check_writeable("value_cache", value_cache)
    nb = int(key_cache.shape[0])
    if hasattr(block_mapping, "shape"):  # a NumPy or CuPy array
        m = _to_host(block_mapping)
        if m.dtype.kind not in "iu":
            raise TypeError(f"block_mapping.dtype is {m.dtype}; expected an integer array [N, 2]")
        m = m.astype(np.int64)
    else:
        pairs = list(block_mapping)
        for i, p in enumerate(pairs):
            if (not isinstance(p, (tuple, list)) or len(p) != 2
                    or not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool)
                               for x in p)):
                raise TypeError(f"block_mapping[{i}] = {p!r}; expected a (src, dst) pair of ints")
        m = np.array(pairs, dtype=np.int64).reshape(len(pairs), 2)
    if m.ndim != 2 or m.shape[1] != 2:
        raise ValueError(f"block_mapping has shape {m.shape}; expected [N, 2] (src, dst) pairs")
    bad = np.argwhere((m < 0) | (m >= nb))
    if bad.size:
        i, j = (int(x) for x in bad[0])
        raise ValueError(f"block_mapping[{i}, {j}] = {int(m[i, j])} is out of range [0, NB={nb})")
    srcs, dsts = m[:, 0], m[:, 1]
    if np.unique(dsts).size != dsts.size:
        raise ValueError("block_mapping writes one destination block twice")
    overlap = np.intersect1d(srcs, dsts)
    if overlap.size:
        raise ValueError(f"block_mapping uses block {int(overlap[0])} both as a source and as a "
                         "destination; the copies run in no particular order, so that is "
                         "ambiguous")
    return dt, np.ascontiguousarray(m)


