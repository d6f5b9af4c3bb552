"""Python launchers for the CUDA kernels: same signatures as the NumPy functions, two backends.

What it teaches: the host side of a launch. checks.py validates everything the kernel will
trust and computes the geometry; then one of two runners launches the same kernel text:

    backend="cpu"   NumPy arrays; the kernels run under the CPU emulation (emu/cpu_build.py)
    backend="cupy"  CuPy arrays or torch CUDA tensors (shared through DLPack, no copy); NVRTC
                    compiles the kernels (cupy_runner.py)

Oracles: minipaged.paged.paged_attention and minipaged.paged.cache_ops (NumPy). Outputs
agree with them within a stated tolerance (different summation order, expf vs np.exp), and
bit for bit between any two physical placements of the same logical K/V on one backend.
Read next: lessons/08_gpu_kernel.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minipaged._install import GPU_HINT
from minipaged.cuda.cache_checks import check_copy_blocks, check_reshape_and_cache
from minipaged.cuda.checks import AttentionLaunch, check_paged_attention
from minipaged.cuda.kernels import CACHE_THREADS

__all__ = ["AttentionLaunch", "check_copy_blocks", "check_paged_attention",
           "check_reshape_and_cache", "copy_blocks", "paged_attention",
           "prepare_paged_attention", "reshape_and_cache"]


class _OnGPU:
    """backend="cupy" inputs as CuPy arrays. Torch CUDA tensors are wrapped through DLPack (no
    copy), the launch goes on torch's current stream, and results go back as torch tensors."""

    def __init__(self, **arrays: Any) -> None:
        try:
            import cupy
        except ImportError as e:
            raise RuntimeError(f"backend='cupy' needs CuPy ({GPU_HINT}) and a CUDA GPU; use "
                               "backend='cpu' to run the kernels on the CPU harness") from e

        self.torch = False
        self.arrays = {}
        for name, a in arrays.items():
            if type(a).__module__.split(".")[0] == "torch":
                if not a.is_cuda:
                    raise TypeError(f"{name} is a torch tensor on {a.device}; backend='cupy' "
                                    "needs CUDA tensors (or use backend='cpu' with NumPy)")
                self.torch = True
                a = cupy.from_dlpack(a)
            self.arrays[name] = a
        self.stream = None
        if self.torch:
            import torch

            self.stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    def __enter__(self) -> dict[str, Any]:
        if self.stream is not None:
            self.stream.__enter__()
        return self.arrays

    def __exit__(self, *exc: object) -> None:
        if self.stream is not None:
            self.stream.__exit__(*exc)

    def result(self, out: Any) -> Any:
        if not self.torch:
            return out
        import torch

        return torch.from_dlpack(out)


def paged_attention(query: Any, key_cache: Any, value_cache: Any, block_tables: Any,
                    seq_lens: Any, *, scale: float | None = None, backend: str = "cpu",
                    version: int | None = None) -> Any:
    """Decode attention through block tables, on a CUDA kernel. out [S, H, D], query's dtype.

    query [S, H, D]; key_cache, value_cache [NB, Hkv, BS, D]; block_tables int32 [S, MB] (entries
    past a sequence's length are never read); seq_lens int32 [S]. Same contract as
    minipaged.paged.paged_attention.paged_attention. ``version``: None lets
    checks.choose_version pick (vLLM's rule), or force one of kernels.VERSIONS."""
    if backend == "cupy" and not isinstance(query, np.ndarray):
        gpu = _OnGPU(query=query, key_cache=key_cache, value_cache=value_cache,
                     block_tables=block_tables, seq_lens=seq_lens)
        with gpu as a:
            run = prepare_paged_attention(**a, scale=scale, backend=backend, version=version)
            return gpu.result(run())
    return prepare_paged_attention(query, key_cache, value_cache, block_tables, seq_lens,
                                   scale=scale, backend=backend, version=version)()


def prepare_paged_attention(query: Any, key_cache: Any, value_cache: Any, block_tables: Any,
                            seq_lens: Any, *, scale: float | None = None, backend: str = "cpu",
                            version: int | None = None):
    """Check once and allocate once; return a callable that only launches and returns out.

    What a serving loop would keep between steps of one shape, and what `minipaged bench
    kernel` times: calling it does no checking, no host copy and no allocation. (CuPy arrays
    only for backend="cupy"; paged_attention() also takes torch CUDA tensors.)"""
    if backend == "cupy" and not isinstance(query, np.ndarray):
        from minipaged.cuda import cupy_runner

        launch = check_paged_attention(query, key_cache, value_cache, block_tables, seq_lens,
                                       scale=scale, version=version, backend=backend,
                                       smem_limit=cupy_runner.smem_limit())
        return cupy_runner.Prepared(launch, query, key_cache, value_cache, block_tables,
                                    seq_lens)
    launch = check_paged_attention(query, key_cache, value_cache, block_tables, seq_lens,
                                   scale=scale, version=version, backend=backend)
    return _CpuPrepared(launch, query, key_cache, value_cache, block_tables, seq_lens)


class _CpuPrepared:
    """A checked launch on the CPU harness: the entry point and every pointer, per chunk of at
    most 65,535 sequences (checks.AttentionLaunch.chunks), worked out once."""

    def __init__(self, launch: AttentionLaunch, query, key_cache, value_cache, block_tables,
                 seq_lens) -> None:
        self.out = np.empty(query.shape, dtype=query.dtype)
        self.calls: list[tuple] = []
        if launch.num_seqs == 0:
            return
        from minipaged.cuda.emu import cpu_build

        self.lib = cpu_build.load()
        self.fn = getattr(self.lib, cpu_build.symbol("paged_attention", launch.dtype,
                                                     launch.head_size, launch.block_size))
        shape = (launch.num_seqs, launch.num_heads, launch.max_partitions)
        partial = [np.empty(shape, np.float32), np.empty(shape, np.float32),
                   np.empty((*shape, launch.head_size), np.float32)] if launch.partitioned \
            else None  # exp_sums, max_logits, tmp_out
        self.keep = (query, key_cache, value_cache, block_tables, seq_lens, partial)
        for a, b in launch.chunks:  # rows a..b-1: views into every per-sequence array
            ptrs = [x[a:b].ctypes.data for x in partial] if partial else [None] * 3
            self.calls.append((
                launch.version, self.out[a:b].ctypes.data, *ptrs, query[a:b].ctypes.data,
                key_cache.ctypes.data, value_cache.ctypes.data, block_tables[a:b].ctypes.data,
                seq_lens[a:b].ctypes.data, b - a, launch.num_heads, launch.num_kv_heads,
                launch.max_blocks, launch.max_partitions, *launch.grid(b - a), launch.smem,
                launch.reduce_smem, launch.scale))

    def __call__(self) -> np.ndarray:
        from minipaged.cuda.emu import cpu_build

        for args in self.calls:
            cpu_build.check(self.lib, self.fn(*args))
        return self.out


# ----------------------------------------------------------------------------------------------
# reshape_and_cache and copy_blocks


def reshape_and_cache(key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any,
                      *, backend: str = "cpu") -> None:
    """Scatter new tokens' K/V [T, Hkv, D] into the caches at slot_mapping [T]; in place.

    slot = physical_block * BS + offset; a negative slot is padding and is skipped. Same contract
    as minipaged.paged.cache_ops.reshape_and_cache; the result is exact (bits are copied)."""
    if backend == "cupy" and not isinstance(key_cache, np.ndarray):
        from minipaged.cuda import cupy_runner

        with _OnGPU(key=key, value=value, key_cache=key_cache, value_cache=value_cache,
                    slot_mapping=slot_mapping) as a:
            dt, t = check_reshape_and_cache(**a, backend=backend)
            if t:
                _, hkv, _, d = (int(x) for x in key_cache.shape)
                cupy_runner.reshape_and_cache(dt, *a.values(), min(CACHE_THREADS, hkv * d))
        return
    dt, t = check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping,
                                    backend=backend)
    if t == 0:
        return
    _, hkv, bs, d = (int(x) for x in key_cache.shape)
    threads = min(CACHE_THREADS, hkv * d)
    from minipaged.cuda.emu import cpu_build

    lib = cpu_build.load()
    slots = np.ascontiguousarray(slot_mapping, dtype=np.int64)
    rc = getattr(lib, cpu_build.symbol("reshape_and_cache", dt))(
        key.ctypes.data, value.ctypes.data, key_cache.ctypes.data, value_cache.ctypes.data,
        slots.ctypes.data, t, hkv, d, bs, threads)
    cpu_build.check(lib, rc)


def copy_blocks(key_cache: Any, value_cache: Any, block_mapping: Any, *,
                backend: str = "cpu") -> None:
    """Copy whole physical blocks src -> dst in both caches, in one launch (copy-on-write).

    block_mapping: (src, dst) pairs, a list or an int array [N, 2]. Same contract as
    minipaged.paged.cache_ops.copy_blocks; exact."""
    _, hkv, bs, d = (int(x) for x in key_cache.shape)
    numel = hkv * bs * d
    threads = min(CACHE_THREADS, numel)
    if backend == "cupy" and not isinstance(key_cache, np.ndarray):
        from minipaged.cuda import cupy_runner

        with _OnGPU(key_cache=key_cache, value_cache=value_cache) as a:
            dt, m = check_copy_blocks(**a, block_mapping=block_mapping, backend=backend)
            if m.shape[0]:
                cupy_runner.copy_blocks(dt, a["key_cache"], a["value_cache"], m, threads)
        return
    dt, m = check_copy_blocks(key_cache, value_cache, block_mapping, backend=backend)
    if m.shape[0] == 0:
        return
    from minipaged.cuda.emu import cpu_build

    lib = cpu_build.load()
    rc = getattr(lib, cpu_build.symbol("copy_blocks", dt))(
        key_cache.ctypes.data, value_cache.ctypes.data, m.ctypes.data, m.shape[0], numel, threads)
    cpu_build.check(lib, rc)
