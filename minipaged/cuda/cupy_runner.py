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
    attention_names,
    cache_names,
    source,
)


@functools.cache
def attention_kernels(dtype: str, head_size: int, block_size: int) -> dict[str, Any]:
    """{"v0", "v1", ..., "reduce"} -> cupy.RawKernel, compiled once per (dtype, D, BS)."""
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


def smem_limit() -> int:
    """The most shared memory (static + dynamic) one block may opt in to on this GPU: 227 KiB
    on an H100/H200, 163 KiB on an A100 (cudaDevAttrMaxSharedMemoryPerBlockOptin)."""
    import cupy

    return int(cupy.cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"])


def _allow_smem(kernel: Any, dynamic: int) -> None:
    """Let `kernel` take `dynamic` bytes of dynamic shared memory, as vLLM does before every
    launch (csrc/attention/paged_attention_v1.cu sets cudaFuncAttributeMaxDynamicSharedMemory-
    Size each time). Without it a kernel gets 48 KiB for static + dynamic together, so a launch
    whose dynamic part alone is under 48 KiB can still fail (v1, D=128, BS=16 from about 11.6K
    tokens). checks.py has already compared static + dynamic with smem_limit()."""
    kernel.max_dynamic_shared_size_bytes = dynamic


class Prepared:
    """A checked launch (checks.AttentionLaunch) on CuPy arrays, ready to run: kernels
    compiled, buffers allocated, scalars converted, one argument list per chunk of at most
    65,535 sequences. Calling it only launches; it returns out [S, H, D]."""

    def __init__(self, launch, query, key_cache, value_cache, block_tables, seq_lens) -> None:
        import cupy

        self.launch = launch
        self.out = cupy.empty(query.shape, dtype=query.dtype)
        self.calls: list[tuple] = []  # (kernel, grid, args, dynamic shared memory)
        if launch.num_seqs == 0:
            return
        kernels = attention_kernels(launch.dtype, launch.head_size, launch.block_size)
        i32, f32 = np.int32, np.float32
        if launch.partitioned:
            shape = (launch.num_seqs, launch.num_heads, launch.max_partitions)
            partial = [cupy.empty(shape, cupy.float32), cupy.empty(shape, cupy.float32),
                       cupy.empty((*shape, launch.head_size), cupy.float32)]
        else:
            partial = [cupy.empty(1, cupy.float32)] * 3  # stand-ins for the unused pointers
        main = kernels[f"v{launch.version}"]
        for a, b in launch.chunks:
            rows = b - a
            e, m, t = (x[a:b] for x in partial) if launch.partitioned else partial
            data = (query[a:b], key_cache, value_cache, block_tables[a:b], seq_lens[a:b])
            if launch.version == 0:
                args = (self.out[a:b], *data, i32(rows), i32(launch.num_heads),
                        i32(launch.num_kv_heads), i32(launch.max_blocks), f32(launch.scale))
            else:
                args = (self.out[a:b], e, m, t, *data, i32(launch.num_heads),
                        i32(launch.num_kv_heads), i32(launch.max_blocks),
                        i32(launch.max_partitions), f32(launch.scale))
            self.calls.append((main, launch.grid(rows), args, launch.smem))
            if launch.partitioned:
                self.calls.append((kernels["reduce"], launch.reduce_grid(rows),
                                   (self.out[a:b], e, m, t, seq_lens[a:b],
                                    i32(launch.max_partitions)), launch.reduce_smem))

    def __call__(self) -> Any:
        for kernel, grid, args, smem in self.calls:
            _allow_smem(kernel, smem)
            kernel(grid, (NUM_THREADS,), args, shared_mem=smem)
        return self.out


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

