"""Writing K/V into the pages: reshape_and_cache, copy_blocks, swap_blocks.

What this teaches: the data side of the paged cache (``block_manager.py`` keeps the books), in its
one layout, NumPy and CUDA alike: ``key_cache, value_cache [NB, Hkv, BS, D]``, C-contiguous. The
block comes first as the unit of allocation, copy and swap (one block, one memcpy); heads before
tokens so that a decode thread block, reading one KV head of a block, reads a contiguous [BS, D]
tile. (vLLM splits the key cache's D into 16-byte vectors, ``split_kv_cache`` in
vllm/v1/attention/ops/paged_attn.py; ``cuda/paged_attention.cu`` says why minipaged does not.)
Paper: vLLM sections 4.4 (copy-on-write, ``copy_blocks``) and 4.5 (swapping, ``swap_blocks``).

Read before: ``paged/block_manager.py``. Read next: ``paged/paged_attention.py``.
"""

from __future__ import annotations

import numpy as np

from minipaged._checks import check_int_array


def check_caches(key_cache: np.ndarray, value_cache: np.ndarray,
                 names: tuple[str, str] = ("key_cache", "value_cache"),
                 *, writable: bool = False) -> None:
    """Both caches NumPy [NB, Hkv, BS, D], same shape and dtype; ``writable``: about to be
    written, so writable and not sharing memory (else every value would overwrite its key)."""
    for name, c in zip(names, (key_cache, value_cache)):
        if not isinstance(c, np.ndarray):
            raise TypeError(f"{name} must be a numpy array, got {type(c).__name__}")
        if c.ndim != 4:
            raise ValueError(f"{name} must be [NB, Hkv, BS, D] (4-D), got shape {c.shape}")
        if writable and not c.flags.writeable:
            raise ValueError(f"{name} is read-only: the cache must be writable")
    if key_cache.shape != value_cache.shape:
        raise ValueError(f"{names[0]}.shape={key_cache.shape} != "
                         f"{names[1]}.shape={value_cache.shape}; expected both [NB, Hkv, BS, D]")
    if key_cache.dtype != value_cache.dtype:
        raise TypeError(f"{names[0]}.dtype={key_cache.dtype} != "
                        f"{names[1]}.dtype={value_cache.dtype}")
    if writable and np.shares_memory(key_cache, value_cache):
        raise ValueError(f"{names[0]} and {names[1]} share memory: K and V need separate caches")


def check_scatter(key: np.ndarray, value: np.ndarray, key_cache: np.ndarray,
                  slot_mapping: object) -> np.ndarray:
    """What reshape_and_cache checks after the caches (NumPy and CUDA alike): key, value
    [T, Hkv, D] in the cache's dtype, one slot per token, in range, none twice. Slots int64 [T]."""
    nb, hkv, bs, d = key_cache.shape
    for name, x in (("key", key), ("value", value)):
        if not isinstance(x, np.ndarray):  # the words of check_caches and check_query
            raise TypeError(f"{name} must be a numpy array, got {type(x).__name__}")
        if x.ndim != 3:
            raise ValueError(f"{name} must be [T, Hkv, D] (3-D), got shape {x.shape}")
        if x.shape[1:] != (hkv, d):
            raise ValueError(f"{name}.shape={x.shape} must be [T, Hkv={hkv}, D={d}] "
                             "to match key_cache [NB, Hkv, BS, D]")
        if x.dtype != key_cache.dtype:
            raise TypeError(f"{name}.dtype={x.dtype} != key_cache.dtype={key_cache.dtype}")
    if key.shape != value.shape:
        raise ValueError(f"key.shape={key.shape} != value.shape={value.shape}")
    slots = check_int_array("slot_mapping", slot_mapping, 1)
    if slots.shape != (key.shape[0],):
        raise ValueError(f"slot_mapping.shape={slots.shape} must be [T={key.shape[0]}]")
    for t in np.flatnonzero(slots >= nb * bs)[:1]:
        raise ValueError(f"slot_mapping[{t}]={int(slots[t])} is out of range "
                         f"[0, NB*BS={nb * bs}) (NB={nb}, BS={bs})")
    uniq, counts = np.unique(slots[slots >= 0], return_counts=True)
    for dup in uniq[counts > 1][:1]:
        raise ValueError(f"slot_mapping writes slot {dup} twice (tokens "
                         f"{np.flatnonzero(slots == dup).tolist()}); each token needs its own slot")
    return slots


def reshape_and_cache(key: np.ndarray, value: np.ndarray, key_cache: np.ndarray,
                      value_cache: np.ndarray, slot_mapping: np.ndarray) -> None:
    """Write key[t], value[t] ([Hkv, D] each) at cache slot ``slot_mapping[t]``, in place; a
    slot < 0 is padding, skipped. Every argument is checked before the first write."""
    check_caches(key_cache, value_cache, writable=True)
    slots = check_scatter(key, value, key_cache, slot_mapping)
    valid = slots >= 0
    blocks, offsets = np.divmod(slots[valid], key_cache.shape[2])  # slot = block * BS + offset
    # Advanced indices split by a slice put the token axis first: [T', Hkv, D] on both sides.
    key_cache[blocks, :, offsets, :] = key[valid]
    value_cache[blocks, :, offsets, :] = value[valid]


def reshape_and_cache_loop(key: np.ndarray, value: np.ndarray, key_cache: np.ndarray,
                           value_cache: np.ndarray, slot_mapping: np.ndarray) -> None:
    """The oracle: the same scatter one token at a time, the way the GPU kernel's threads do."""
    bs = key_cache.shape[2]
    for t, slot in enumerate(np.asarray(slot_mapping).tolist()):
        if slot >= 0:
            key_cache[slot // bs, :, slot % bs, :] = key[t]
            value_cache[slot // bs, :, slot % bs, :] = value[t]


def check_block_mapping(block_mapping: object, num_src: int, num_dst: int, name: str,
                        *, same_pool: bool) -> np.ndarray:
    """``block_mapping`` as int64 [N, 2] of (src, dst); errors name the bad pair."""
    try:
        m = np.asarray(block_mapping)
    except ValueError:  # NumPy's "inhomogeneous shape" names no argument
        raise ValueError(f"{name}={block_mapping!r:.60} has pairs of different lengths") from None
    if m.size == 0:  # [] has no integer dtype, but an empty mapping is a valid no-op
        m = np.zeros((0, 2), dtype=np.int64)
    if m.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integer block ids, got dtype {m.dtype}")
    if m.ndim != 2 or m.shape[1] != 2:
        raise ValueError(f"{name} must be (src, dst) pairs, shape [N, 2], got {m.shape}")
    m = m.astype(np.int64)
    for col, label, limit in ((0, "src", num_src), (1, "dst", num_dst)):
        for i in np.flatnonzero((m[:, col] < 0) | (m[:, col] >= limit))[:1]:
            raise ValueError(f"{name}[{i}] = {tuple(m[i].tolist())}: {label} block "
                             f"{int(m[i, col])} is out of range [0, {limit})")
    dst, counts = np.unique(m[:, 1], return_counts=True)
    for b in dst[counts > 1][:1]:
        raise ValueError(f"{name} copies into block {b} more than once")
    both = np.intersect1d(m[:, 0], m[:, 1]) if same_pool else []  # src and dst in one pool
    for b in both[:1]:
        raise ValueError(f"{name} overlaps: block {b} is both a source and a "
                         "destination, so the result would depend on the copy order")
    return m


def copy_blocks(key_cache: np.ndarray, value_cache: np.ndarray, block_mapping: object) -> None:
    """Copy whole blocks src -> dst for every pair, in place: the copy-on-write copies of
    ``KVCacheManager.take_copies()`` in one call (vLLM launches one kernel)."""
    check_caches(key_cache, value_cache, writable=True)
    nb = key_cache.shape[0]
    m = check_block_mapping(block_mapping, nb, nb, "block_mapping", same_pool=True)
    key_cache[m[:, 1]] = key_cache[m[:, 0]]
    value_cache[m[:, 1]] = value_cache[m[:, 0]]


def swap_blocks(src_key_cache: np.ndarray, src_value_cache: np.ndarray,
                dst_key_cache: np.ndarray, dst_value_cache: np.ndarray,
                block_mapping: object) -> None:
    """Copy blocks from one pool to another (GPU -> CPU on swap-out, CPU -> GPU on swap-in)."""
    check_caches(src_key_cache, src_value_cache, ("src_key_cache", "src_value_cache"))
    check_caches(dst_key_cache, dst_value_cache, ("dst_key_cache", "dst_value_cache"),
                 writable=True)
    if src_key_cache.shape[1:] != dst_key_cache.shape[1:]:
        raise ValueError(f"block shapes differ: src [Hkv, BS, D]={src_key_cache.shape[1:]} "
                         f"vs dst {dst_key_cache.shape[1:]}")
    if src_key_cache.dtype != dst_key_cache.dtype:
        raise TypeError(f"src dtype {src_key_cache.dtype} != dst dtype {dst_key_cache.dtype}")
    m = check_block_mapping(block_mapping, src_key_cache.shape[0], dst_key_cache.shape[0],
                            "block_mapping", same_pool=False)
    dst_key_cache[m[:, 1]] = src_key_cache[m[:, 0]]
    dst_value_cache[m[:, 1]] = src_value_cache[m[:, 0]]
