"""Python launchers for the CUDA kernels: same signatures as the NumPy functions, two backends.

What it teaches: what a kernel launch needs from its host code. A GPU kernel trusts its
arguments completely: CuPy passes raw pointers and does not check scalar types, and the kernel
reads wherever a block table points. So every check happens here, on the host, BEFORE the
launch: dtypes, shapes, contiguity, and every block-table entry a kernel will follow. Then the
launch geometry (grid, threads, shared memory) is computed once, for both backends.

    backend="cpu"   NumPy arrays; the kernels run under the CPU emulation (cpu_build.py)
    backend="cupy"  CuPy arrays or torch CUDA tensors (shared through DLPack, no copy); NVRTC
                    compiles the same .cu text (cupy_runner.py)

Oracles: minipaged.paged_attention.paged_attention and minipaged.cache_ops (NumPy). Outputs
agree with them within a stated tolerance (different summation order, expf vs np.exp), and
bit for bit between any two physical placements of the same logical K/V on one backend.
Read next: lessons/08_gpu_kernel.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from minipaged.cuda.cpu_build import (
    BLOCK_SIZES,
    CACHE_THREADS,
    DTYPES,
    HEAD_SIZES,
    NUM_THREADS,
    PARTITION_SIZE,
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


def check_paged_attention(query, key_cache, value_cache, block_tables, seq_lens, *, scale,
                          version, backend) -> AttentionLaunch:
    """Validate everything the kernel will trust; return the launch geometry.

    Raises ValueError / TypeError naming the argument, its value and what was expected."""
    _check_backend(backend)
    if version not in (1, 2):
        raise ValueError(f"version={version!r}; expected 1 (one thread block per head and "
                         "sequence) or 2 (partitions of 512 tokens plus a reduce kernel)")
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
    if version == 1:
        # v1 keeps every logit of the longest sequence in shared memory
        max_partitions, smem, reduce_smem = 1, -(-max_len // bs) * bs * 4, 0
    else:
        max_partitions = max(1, -(-max_len // PARTITION_SIZE))
        smem, reduce_smem = PARTITION_SIZE * 4, max_partitions * 4
    return AttentionLaunch(dt, s, h, hkv, d, bs, mb, version, max_partitions, smem, reduce_smem,
                           scale)


def paged_attention(query, key_cache, value_cache, block_tables, seq_lens, *, scale=None,
                    backend: str = "cpu", version: int = 1):
    """Decode attention through block tables, on a CUDA kernel. out [S, H, D], query's dtype.

    query [S, H, D]; key_cache, value_cache [NB, Hkv, BS, D]; block_tables int32 [S, MB] (entries
    past a sequence's length are never read); seq_lens int32 [S]. Same contract as
    minipaged.paged_attention.paged_attention; ``version`` 1 or 2 (see paged_attention.cu)."""
    launch = check_paged_attention(query, key_cache, value_cache, block_tables, seq_lens,
                                   scale=scale, version=version, backend=backend)
    if backend == "cupy":
        from minipaged.cuda import cupy_runner

        return cupy_runner.paged_attention(launch, query, key_cache, value_cache, block_tables,
                                           seq_lens)
    out = np.empty(query.shape, dtype=query.dtype)
    if launch.num_seqs == 0:
        return out
    from minipaged.cuda import cpu_build

    lib = cpu_build.load()
    fn = getattr(lib, cpu_build.symbol("paged_attention", launch.dtype, launch.head_size,
                                       launch.block_size))
    if version == 2:
        shape = (launch.num_seqs, launch.num_heads, launch.max_partitions)
        exp_sums = np.empty(shape, np.float32)
        max_logits = np.empty(shape, np.float32)
        tmp_out = np.empty((*shape, launch.head_size), np.float32)
        ptrs = (exp_sums.ctypes.data, max_logits.ctypes.data, tmp_out.ctypes.data)
    else:
        ptrs = (None, None, None)
    rc = fn(version, out.ctypes.data, *ptrs, query.ctypes.data, key_cache.ctypes.data,
            value_cache.ctypes.data, block_tables.ctypes.data, seq_lens.ctypes.data,
            launch.num_seqs, launch.num_heads, launch.num_kv_heads, launch.max_blocks,
            launch.max_partitions, launch.smem, launch.reduce_smem, launch.scale)
    cpu_build.check(lib, rc)
    return out


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


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, *,
                      backend: str = "cpu") -> None:
    """Scatter new tokens' K/V [T, Hkv, D] into the caches at slot_mapping [T]; in place.

    slot = physical_block * BS + offset; a negative slot is padding and is skipped. Same contract
    as minipaged.cache_ops.reshape_and_cache; the result is exact (bits are copied)."""
    dt, t = check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping,
                                    backend=backend)
    if t == 0:
        return
    _, hkv, bs, d = (int(x) for x in key_cache.shape)
    threads = min(CACHE_THREADS, hkv * d)
    if backend == "cupy":
        from minipaged.cuda import cupy_runner

        cupy_runner.reshape_and_cache(dt, key, value, key_cache, value_cache, slot_mapping,
                                      threads)
        return
    from minipaged.cuda import cpu_build

    lib = cpu_build.load()
    slots = np.ascontiguousarray(slot_mapping, dtype=np.int64)
    rc = getattr(lib, cpu_build.symbol("reshape_and_cache", dt))(
        key.ctypes.data, value.ctypes.data, key_cache.ctypes.data, value_cache.ctypes.data,
        slots.ctypes.data, t, hkv, d, bs, threads)
    cpu_build.check(lib, rc)


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


def copy_blocks(key_cache, value_cache, block_mapping, *, backend: str = "cpu") -> None:
    """Copy whole physical blocks src -> dst in both caches, in one launch (copy-on-write).

    block_mapping: (src, dst) pairs, a list or an int array [N, 2]. Same contract as
    minipaged.cache_ops.copy_blocks; exact."""
    dt, m = check_copy_blocks(key_cache, value_cache, block_mapping, backend=backend)
    if m.shape[0] == 0:
        return
    _, hkv, bs, d = (int(x) for x in key_cache.shape)
    numel = hkv * bs * d
    threads = min(CACHE_THREADS, numel)
    if backend == "cupy":
        from minipaged.cuda import cupy_runner

        cupy_runner.copy_blocks(dt, key_cache, value_cache, m, threads)
        return
    from minipaged.cuda import cpu_build

    lib = cpu_build.load()
    rc = getattr(lib, cpu_build.symbol("copy_blocks", dt))(
        key_cache.ctypes.data, value_cache.ctypes.data, m.ctypes.data, m.shape[0], numel, threads)
    cpu_build.check(lib, rc)
