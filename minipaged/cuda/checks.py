"""What a kernel launch trusts, checked on the host before the launch.

What it teaches: a GPU kernel trusts its arguments completely. CuPy passes raw pointers and does
not check scalar types; the kernel reads wherever a block table points and assumes every array
is C-contiguous and 16-byte aligned. So every check happens here, before the launch: dtypes,
shapes, contiguity, alignment, and every block-table entry a kernel will follow (entries past
a sequence's length are never read, so they may hold anything). Then the launch geometry (grid,
shared memory) is computed once, for both backends. Errors name the argument, the value and
what was expected. The same checks serve NumPy arrays (backend="cpu") and CuPy arrays
(backend="cupy"): both have .shape, .dtype and .flags.

Read next: launch.py, which calls these and then the kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from minipaged.cuda.kernels import (
    BLOCK_SIZES,
    DTYPES,
    HEAD_SIZES,
    NUM_THREADS,
    PARTITION_SIZE,
    VERSIONS,
)

BACKENDS = ("cpu", "cupy")


# ----------------------------------------------------------------------------------------------
# Checks that hold for NumPy and CuPy arrays alike (both have .shape, .dtype, .flags).


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}; expected one of {BACKENDS}")


def _dtype_name(a: Any) -> str:
    return np.dtype(a.dtype).name


def _check_array(name: str, a: Any, ndim: int, backend: str) -> None:
    if backend == "cpu" and not isinstance(a, np.ndarray):
        raise TypeError(f"{name} is a {type(a).__name__}; backend='cpu' takes NumPy arrays")
    if backend == "cupy" and isinstance(a, np.ndarray):
        raise TypeError(f"{name} is a NumPy array; backend='cupy' takes CuPy arrays or torch CUDA "
                        "tensors (use backend='cpu' for NumPy)")
    if a.ndim != ndim:
        raise ValueError(f"{name} has shape {tuple(a.shape)}; expected {ndim} dimensions")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} is not C-contiguous; the kernels index raw memory with the "
                         "row-major strides of its shape (pass np.ascontiguousarray(...))")


def _data_pointer(a: Any) -> int:
    return int(a.ctypes.data) if isinstance(a, np.ndarray) else int(a.data.ptr)


def _check_aligned(name: str, a: Any) -> None:
    """The kernels load 16 bytes at a time; a view that starts mid-vector would fault on a GPU."""
    if a.size and _data_pointer(a) % 16:
        raise ValueError(f"{name} starts at an address that is not a multiple of 16 bytes (a "
                         "view into a larger array?); the kernel's 16-byte loads need it "
                         "aligned: pass a copy")


def _check_float(name: str, a: Any) -> str:
    dt = _dtype_name(a)
    if dt not in DTYPES:
        raise TypeError(f"{name}.dtype is {dt}; the kernels are built for {tuple(DTYPES)}")
    return dt


def _check_int(name: str, a: Any, allowed: tuple[str, ...]) -> None:
    dt = _dtype_name(a)
    if dt not in allowed:
        raise TypeError(f"{name}.dtype is {dt}; expected {' or '.join(allowed)}")


def _to_host(a: Any) -> np.ndarray:
    if isinstance(a, np.ndarray):
        return a
    import cupy  # only reached with backend="cupy"

    return cupy.asnumpy(a)


def _check_writeable(name: str, a: Any) -> None:
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        raise ValueError(f"{name} is read-only; the kernel writes into it in place")


# ----------------------------------------------------------------------------------------------
# paged_attention


@dataclass(frozen=True)
class AttentionLaunch:
    """Everything both backends need to launch one paged attention call."""

    dtype: str
    num_seqs: int        # S
    num_heads: int       # H
    num_kv_heads: int    # Hkv
    head_size: int       # D
    block_size: int      # BS
    max_blocks: int      # MB
    version: int
    max_partitions: int  # P (v2), 1 for v1
    smem: int            # dynamic shared memory of the main kernel, bytes
    reduce_smem: int     # v2 reduce kernel, bytes
    scale: float

    @property
    def grid(self) -> tuple[int, int, int]:
        """The main kernel's grid (v0: one thread per row of S*H; else (H, S, P))."""
        if self.version == 0:
            return (-(-self.num_seqs * self.num_heads // NUM_THREADS), 1, 1)
        return (self.num_heads, self.num_seqs, self.max_partitions)


def check_paged_attention(query, key_cache, value_cache, block_tables, seq_lens, *, scale,
                          version, backend) -> AttentionLaunch:
    """Validate everything the kernel will trust; return the launch geometry.

    Raises ValueError / TypeError naming the argument, its value and what was expected."""
    _check_backend(backend)
    if version not in VERSIONS:
        raise ValueError(f"version={version!r}; expected one of {list(VERSIONS)}")
    _check_array("query", query, 3, backend)
    _check_array("key_cache", key_cache, 4, backend)
    _check_array("value_cache", value_cache, 4, backend)
    _check_array("block_tables", block_tables, 2, backend)
    _check_array("seq_lens", seq_lens, 1, backend)
    dt = _check_float("query", query)
    for name, a in (("key_cache", key_cache), ("value_cache", value_cache)):
        if _dtype_name(a) != dt:
            raise TypeError(f"{name}.dtype is {_dtype_name(a)} but query.dtype is {dt}; "
                            "they must match")
    if tuple(key_cache.shape) != tuple(value_cache.shape):
        raise ValueError(f"key_cache has shape {tuple(key_cache.shape)} but value_cache has "
                         f"{tuple(value_cache.shape)}; both must be [NB, Hkv, BS, D]")
    for name, a in (("key_cache", key_cache), ("value_cache", value_cache)):
        _check_aligned(name, a)
    s, h, d = (int(x) for x in query.shape)
    nb, hkv, bs, dk = (int(x) for x in key_cache.shape)
    if dk != d:
        raise ValueError(f"key_cache head size (last dim) is {dk} but query's is {d}")
    if d not in HEAD_SIZES:
        raise ValueError(f"head size D={d} has no compiled kernel; built for {HEAD_SIZES}")
    if bs not in BLOCK_SIZES:
        raise ValueError(f"block size BS={bs} (key_cache.shape[2]) has no compiled kernel; "
                         f"built for {BLOCK_SIZES}")
    if hkv < 1 or h % hkv != 0:
        raise ValueError(f"query has H={h} heads, not a multiple of the caches' Hkv={hkv} KV "
                         "heads (GQA needs H = Hkv * group size)")
    _check_int("block_tables", block_tables, ("int32",))
    _check_int("seq_lens", seq_lens, ("int32",))
    if block_tables.shape[0] != s:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows; expected S={s} "
                         "(one per sequence of query)")
    if seq_lens.shape[0] != s:
        raise ValueError(f"seq_lens has {seq_lens.shape[0]} entries; expected S={s}")
    mb = int(block_tables.shape[1])
    lens = _to_host(seq_lens).astype(np.int64)
    tables = _to_host(block_tables)
    for i, n in enumerate(lens):
        if n < 1:
            raise ValueError(f"seq_lens[{i}] = {n}; every sequence needs at least one token")
        if n > mb * bs:
            raise ValueError(f"seq_lens[{i}] = {n} does not fit in its block table: MB={mb} "
                             f"blocks of BS={bs} hold {mb * bs} tokens")
        used = tables[i, : -(-int(n) // bs)]
        bad = np.flatnonzero((used < 0) | (used >= nb))
        if bad.size:
            j = int(bad[0])
            raise ValueError(f"block_tables[{i}, {j}] = {int(used[j])} is out of range "
                             f"[0, NB={nb}) inside seq_lens[{i}]={n}")
    if scale is None:
        scale = 1.0 / math.sqrt(d)
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale={scale}; expected a finite number (default 1/sqrt(D))")
    max_len = int(lens.max()) if s else 0
    if version == 0:
        max_partitions, smem, reduce_smem = 1, 0, 0
    elif version == 1:
        # v1 keeps every logit of the longest sequence in shared memory
        max_partitions, smem, reduce_smem = 1, -(-max_len // bs) * bs * 4, 0
    else:
        max_partitions = max(1, -(-max_len // PARTITION_SIZE))
        smem, reduce_smem = PARTITION_SIZE * 4, max_partitions * 4
    return AttentionLaunch(dt, s, h, hkv, d, bs, mb, version, max_partitions, smem, reduce_smem,
                           scale)


# ----------------------------------------------------------------------------------------------
# reshape_and_cache and copy_blocks


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


