"""Runner 1: the .cu kernels on a GPU, compiled by NVRTC through CuPy (backend="cupy").

What it teaches: the host side of a real launch. The kernel text is the same one the CPU
harness runs (common.cuh picks the CUDA branch because NVRTC defines __CUDACC__); templates are
instantiated by name (NVRTC "name expressions"), one compiled module per (dtype, head size,
block size) and one per dtype for the cache kernels, kept for the life of the process (and on
disk by CuPy). Scalars go in as explicit np.int32 / np.float32: CuPy passes them by their NumPy
type without looking at the kernel's signature, so a Python int would arrive as 64 bits where
the kernel reads 32. All checks already happened in checks.py, before we get here.

Torch CUDA tensors are accepted through DLPack (zero copy): launch.py converts them with
``cupy.from_dlpack``, and the kernels then run on torch's current stream so that they are
ordered after whatever torch queued before.
Read next: lessons/08_gpu_kernel.py; the benchmark is minipaged/bench/kernel.py.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from minipaged.cuda.kernels import (
    NUM_THREADS,
    PARTITION_SIZE,
    attention_names,
    cache_names,
    source,
)


@functools.cache
def attention_kernels(dtype: str, head_size: int, block_size: int) -> dict[str, Any]:
    """{"v1", "v2", "reduce"} -> cupy.RawKernel, compiled once per (dtype, D, BS)."""
    import cupy

    names = attention_names(dtype, head_size, block_size)
    module = cupy.RawModule(code=source(), options=("-std=c++17",),
                            name_expressions=list(names.values()))
    return {key: module.get_function(name) for key, name in names.items()}


@functools.cache
def cache_kernels(dtype: str) -> dict[str, Any]:
    import cupy

    names = cache_names(dtype)
    module = cupy.RawModule(code=source(), options=("-std=c++17",),
                            name_expressions=list(names.values()))
    return {key: module.get_function(name) for key, name in names.items()}


def device_info() -> str:
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    gib = props["totalGlobalMem"] / 2**30
    return f"{name} (sm_{props['major']}{props['minor']}, {gib:.0f} GiB)"


def _max_dynamic_smem() -> int:
    import cupy

    # the most a kernel may opt in to (227 KiB on H100); 48 KiB without opting in
    return int(cupy.cuda.Device().attributes.get("MaxSharedMemoryPerBlockOptin", 48 * 1024))


def _static_smem(head_size: int) -> int:
    # q_s, red_s and out_s of paged_attention_kernel
    return 4 * (head_size + 2 * (NUM_THREADS // 32) + (NUM_THREADS // 32) * head_size)


def paged_attention(launch, query, key_cache, value_cache, block_tables, seq_lens):
    """Run the checked launch (launch.AttentionLaunch) on CuPy arrays; returns out [S, H, D]."""
    import cupy

    kernels = attention_kernels(launch.dtype, launch.head_size, launch.block_size)
    out = cupy.empty(query.shape, dtype=query.dtype)
    if launch.num_seqs == 0:
        return out
    limit = _max_dynamic_smem() - _static_smem(launch.head_size)
    if launch.smem > limit:
        raise ValueError(
            f"version=1 keeps every logit of the longest sequence in shared memory: "
            f"{launch.smem} bytes, above this GPU's {limit}; use version=2 (partitions of "
            f"{PARTITION_SIZE} tokens)")
    i32, f32 = np.int32, np.float32
    if launch.version == 0:
        kernels["v0"](launch.grid, (NUM_THREADS,),
                      (out, query, key_cache, value_cache, block_tables, seq_lens,
                       i32(launch.num_seqs), i32(launch.num_heads), i32(launch.num_kv_heads),
                       i32(launch.max_blocks), f32(launch.scale)))
        return out
    nothing = cupy.empty(1, dtype=cupy.float32)  # stands for the unused v2 buffers in v1
    if launch.version == 1:
        exp_sums = max_logits = tmp_out = nothing
    else:
        shape = (launch.num_seqs, launch.num_heads, launch.max_partitions)
        exp_sums = cupy.empty(shape, cupy.float32)
        max_logits = cupy.empty(shape, cupy.float32)
        tmp_out = cupy.empty((*shape, launch.head_size), cupy.float32)
    main = kernels["v1" if launch.version == 1 else "v2"]
    if launch.smem > 48 * 1024:  # above 48 KiB a kernel must opt in to more shared memory
        main.max_dynamic_shared_size_bytes = launch.smem
    main(launch.grid, (NUM_THREADS,),
         (out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, block_tables,
          seq_lens, i32(launch.num_kv_heads), i32(launch.max_blocks),
          i32(launch.max_partitions), f32(launch.scale)),
         shared_mem=launch.smem)
    if launch.version == 2:
        kernels["reduce"]((launch.num_heads, launch.num_seqs, 1), (NUM_THREADS,),
                          (out, exp_sums, max_logits, tmp_out, seq_lens,
                           i32(launch.max_partitions)),
                          shared_mem=launch.reduce_smem)
    return out


def reshape_and_cache(dtype, key, value, key_cache, value_cache, slot_mapping, threads):
    import cupy

    _, hkv, bs, d = (int(x) for x in key_cache.shape)
    slots = cupy.ascontiguousarray(slot_mapping, dtype=cupy.int64)
    cache_kernels(dtype)["reshape_and_cache"](
        (int(key.shape[0]),), (threads,),
        (key, value, key_cache, value_cache, slots, np.int32(hkv), np.int32(d), np.int32(bs)))


def copy_blocks(dtype, key_cache, value_cache, mapping: np.ndarray, threads):
    import cupy

    _, hkv, bs, d = (int(x) for x in key_cache.shape)
    m = cupy.asarray(mapping, dtype=cupy.int64)
    cache_kernels(dtype)["copy_blocks"](
        (int(m.shape[0]),), (threads,), (key_cache, value_cache, m, np.int32(hkv * bs * d)))

