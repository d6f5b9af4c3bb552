"""Runner 1: the .cu kernels on a GPU, compiled by NVRTC through CuPy (backend="cupy").

What it teaches: the host side of a real launch. The kernel text is the same one the CPU
harness runs (common.cuh picks the CUDA branch because NVRTC defines __CUDACC__); templates are
instantiated by name (NVRTC "name expressions"), one compiled module per (dtype, head size,
block size) and one per dtype for the cache kernels, kept for the life of the process (and on
disk by CuPy). Scalars go in as explicit np.int32 / np.float32: CuPy passes them by their NumPy
type without looking at the kernel's signature, so a Python int would arrive as 64 bits where
the kernel reads 32. All checks already happened in checks.py, before we get here; torch CUDA
tensors arrive as CuPy arrays (launch.py wraps them through DLPack, zero copy).
Read next: report.py (what NVRTC makes of the kernels); the benchmark is `minipaged bench kernel`.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from minipaged._install import GPU_HINT
from minipaged.cuda.checks import AttentionLaunch
from minipaged.cuda.kernels import NUM_THREADS, attention_names, cache_names, source


def import_cupy():
    """The cupy module, or a RuntimeError that says how to install it."""
    try:
        import cupy
    except ImportError as e:
        raise RuntimeError(f"backend='cupy' needs CuPy ({GPU_HINT}) and a CUDA GPU; use "
                           "backend='cpu' to run the kernels on the CPU harness") from e
    return cupy


def _compile(names: dict[str, str]) -> dict[str, Any]:
    """{key: cupy.RawKernel} for {key: C++ name}, all from one NVRTC module."""
    module = import_cupy().RawModule(code=source(), options=("-std=c++17",),
                                     name_expressions=list(names.values()))
    return {key: module.get_function(name) for key, name in names.items()}


@functools.cache
def attention_kernels(dtype: str, head_size: int, block_size: int) -> dict[str, Any]:
    """{"v0", "v1", ..., "reduce"} -> cupy.RawKernel, compiled once per (dtype, D, BS)."""
    return _compile(attention_names(dtype, head_size, block_size))


@functools.cache
def cache_kernels(dtype: str) -> dict[str, Any]:
    return _compile(cache_names(dtype))


def device_info() -> str:
    cupy = import_cupy()
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    gib = props["totalGlobalMem"] / 2**30
    return f"{name} (sm_{props['major']}{props['minor']}, {gib:.0f} GiB)"


def smem_limit() -> int:
    """The most shared memory (static + dynamic) one block may opt in to on this GPU: 227 KiB
    on an H100/H200, 163 KiB on an A100 (cudaDevAttrMaxSharedMemoryPerBlockOptin)."""
    return int(import_cupy().cuda.Device().attributes["MaxSharedMemoryPerBlockOptin"])


class Prepared:
    """A checked launch (checks.AttentionLaunch) on CuPy arrays, ready to run: kernels
    compiled, buffers allocated, scalars converted, one argument list per chunk of at most
    65,535 sequences. Calling it only launches; it returns out [S, H, D]."""

    def __init__(self, launch: AttentionLaunch, query, key_cache, value_cache, block_tables,
                 seq_lens) -> None:
        cupy = import_cupy()
        self.out = cupy.empty(query.shape, dtype=query.dtype)
        self.calls: list[tuple] = []  # (kernel, grid, args, dynamic shared memory)
        if launch.num_seqs == 0:
            return
        kernels = attention_kernels(launch.dtype, launch.head_size, launch.block_size)
        i32, f32 = np.int32, np.float32
        if launch.partitioned:  # exp_sums, max_logits, tmp_out
            shape = (launch.num_seqs, launch.num_heads, launch.max_partitions)
            partial = [cupy.empty(shape, cupy.float32), cupy.empty(shape, cupy.float32),
                       cupy.empty((*shape, launch.head_size), cupy.float32)]
        else:
            partial = [cupy.empty(1, cupy.float32)] * 3  # stand-ins for the unused pointers
        for a, b in launch.chunks:
            rows = b - a
            e, m, t = (x[a:b] for x in partial) if launch.partitioned else partial
            data = (query[a:b], key_cache, value_cache, block_tables[a:b], seq_lens[a:b])
            sizes = (i32(launch.num_heads), i32(launch.num_kv_heads), i32(launch.max_blocks))
            if launch.version == 0:
                args = (self.out[a:b], *data, i32(rows), *sizes, f32(launch.scale))
            else:
                args = (self.out[a:b], e, m, t, *data, *sizes, i32(launch.max_partitions),
                        f32(launch.scale))
            self.calls.append((kernels[f"v{launch.version}"], launch.grid(rows), args,
                               launch.smem))
            if launch.partitioned:
                self.calls.append((kernels["reduce"], (launch.num_heads, rows, 1),
                                   (self.out[a:b], e, m, t, seq_lens[a:b],
                                    i32(launch.max_partitions)), launch.reduce_smem))

    def __call__(self) -> Any:
        for kernel, grid, args, smem in self.calls:
            # Allow this launch's dynamic shared memory, as vLLM does before every launch
            # (csrc/attention/paged_attention_v1.cu sets cudaFuncAttributeMaxDynamicShared-
            # MemorySize each time). Without it a kernel gets 48 KiB for static + dynamic
            # together, so a launch whose dynamic part alone is under 48 KiB can still fail
            # (v1, D=128, BS=16 from 12,145 tokens: 544 B static + 4 B per token). checks.py
            # has already compared static + dynamic with smem_limit().
            kernel.max_dynamic_shared_size_bytes = smem
            kernel(grid, (NUM_THREADS,), args, shared_mem=smem)
        return self.out


def reshape_and_cache(dtype: str, key, value, key_cache, value_cache, slots: np.ndarray,
                      threads: int) -> None:
    _, hkv, bs, d = (int(x) for x in key_cache.shape)
    cache_kernels(dtype)["reshape_and_cache"](
        (len(slots),), (threads,), (key, value, key_cache, value_cache,
                                    import_cupy().asarray(slots), np.int32(hkv), np.int32(d),
                                    np.int32(bs)))


def copy_blocks(dtype: str, key_cache, value_cache, mapping: np.ndarray, threads: int) -> None:
    _, hkv, bs, d = (int(x) for x in key_cache.shape)
    cache_kernels(dtype)["copy_blocks"](
        (len(mapping),), (threads,), (key_cache, value_cache, import_cupy().asarray(mapping),
                                      np.int32(hkv * bs * d)))
