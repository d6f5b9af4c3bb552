"""Python launchers for the CUDA kernels: same signatures as the NumPy functions, two backends.

What it teaches: the host side of a launch. checks.py and cache_checks.py validate everything
the kernel will trust and compute the geometry; then one of two runners, with one interface
(Prepared, reshape_and_cache, copy_blocks), launches the same kernel text:

    backend="cpu"   NumPy arrays; the kernels run under the CPU emulation (cpu_runner.py)
    backend="cupy"  CuPy arrays or torch CUDA tensors (shared through DLPack, no copy); NVRTC
                    compiles the kernels (cupy_runner.py)

Oracles: minipaged.paged.paged_attention and minipaged.paged.cache_ops (NumPy). Outputs
agree with them within a stated tolerance (different summation order, expf vs np.exp), and
bit for bit between any two physical placements of the same logical K/V on one backend.
Read next: cpu_runner.py.
"""

from __future__ import annotations

from typing import Any

from minipaged.cuda import cpu_runner, cupy_runner
from minipaged.cuda.cache_checks import check_copy_blocks, check_reshape_and_cache
from minipaged.cuda.checks import AttentionLaunch, check_paged_attention
from minipaged.cuda.kernels import CACHE_THREADS

__all__ = ["AttentionLaunch", "check_copy_blocks", "check_paged_attention",
           "check_reshape_and_cache", "copy_blocks", "paged_attention",
           "prepare_paged_attention", "reshape_and_cache"]


def _runner(backend: str):
    return cupy_runner if backend == "cupy" else cpu_runner


def _on_device(backend: str, run, **arrays: Any) -> Any:
    """run(**arrays). With backend="cupy", torch CUDA tensors among the arrays are wrapped as
    CuPy arrays through DLPack (no copy), run goes on torch's current stream (ordered after what
    torch queued before), and its result comes back as a torch tensor."""
    tensors = [n for n, a in arrays.items() if type(a).__module__.split(".")[0] == "torch"]
    if backend != "cupy" or not tensors:
        return run(**arrays)
    for name in tensors:
        if not arrays[name].is_cuda:
            raise TypeError(f"{name} is a torch tensor on {arrays[name].device}; backend='cupy' "
                            "needs CUDA tensors (or use backend='cpu' with NumPy)")
    cupy = cupy_runner.import_cupy()
    import torch

    for name in tensors:
        arrays[name] = cupy.from_dlpack(arrays[name])
    with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        out = run(**arrays)
    return None if out is None else torch.from_dlpack(out)


def paged_attention(query: Any, key_cache: Any, value_cache: Any, block_tables: Any,
                    seq_lens: Any, *, scale: float | None = None, backend: str = "cpu",
                    version: int | None = None) -> Any:
    """Decode attention through block tables, on a CUDA kernel. out [S, H, D], query's dtype.

    query [S, H, D]; key_cache, value_cache [NB, Hkv, BS, D]; block_tables int32 [S, MB] (entries
    past a sequence's length are never read); seq_lens int32 [S]. Same contract as
    minipaged.paged.paged_attention.paged_attention. ``version``: None lets
    checks.choose_version pick (vLLM's rule), or force one of kernels.VERSIONS."""
    def run(**arrays: Any) -> Any:
        return prepare_paged_attention(**arrays, scale=scale, backend=backend, version=version)()

    return _on_device(backend, run, query=query, key_cache=key_cache, value_cache=value_cache,
                      block_tables=block_tables, seq_lens=seq_lens)


def prepare_paged_attention(query: Any, key_cache: Any, value_cache: Any, block_tables: Any,
                            seq_lens: Any, *, scale: float | None = None, backend: str = "cpu",
                            version: int | None = None):
    """Check once and allocate once; return a callable that only launches and returns out.

    What a serving loop would keep between steps of one shape, and what `minipaged bench
    kernel` times: calling it does no checking, no host copy and no allocation. (CuPy arrays
    only for backend="cupy"; paged_attention() also takes torch CUDA tensors.)"""
    launch = check_paged_attention(query, key_cache, value_cache, block_tables, seq_lens,
                                   scale=scale, version=version, backend=backend)
    return _runner(backend).Prepared(launch, query, key_cache, value_cache, block_tables,
                                     seq_lens)


def reshape_and_cache(key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any,
                      *, backend: str = "cpu") -> None:
    """Scatter new tokens' K/V [T, Hkv, D] into the caches at slot_mapping [T]; in place.

    slot = physical_block * BS + offset; a negative slot is padding and is skipped. Same contract
    as minipaged.paged.cache_ops.reshape_and_cache; the result is exact (bits are copied)."""
    def run(key, value, key_cache, value_cache, slot_mapping) -> None:
        dtype, slots = check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping,
                                               backend=backend)
        if slots.size:  # one thread block per token, a thread per element of its [Hkv, D]
            _, hkv, _, d = key_cache.shape
            _runner(backend).reshape_and_cache(dtype, key, value, key_cache, value_cache, slots,
                                               min(CACHE_THREADS, hkv * d))

    _on_device(backend, run, key=key, value=value, key_cache=key_cache, value_cache=value_cache,
               slot_mapping=slot_mapping)


def copy_blocks(key_cache: Any, value_cache: Any, block_mapping: Any, *,
                backend: str = "cpu") -> None:
    """Copy whole physical blocks src -> dst in both caches, in one launch (copy-on-write).

    block_mapping: (src, dst) pairs, a list or an int array [N, 2]. Same contract as
    minipaged.paged.cache_ops.copy_blocks; exact."""
    def run(key_cache, value_cache) -> None:
        dtype, mapping = check_copy_blocks(key_cache, value_cache, block_mapping,
                                           backend=backend)
        if mapping.size:  # one thread block per pair, a thread per element of its block
            _, hkv, bs, d = key_cache.shape
            _runner(backend).copy_blocks(dtype, key_cache, value_cache, mapping,
                                         min(CACHE_THREADS, hkv * bs * d))

    _on_device(backend, run, key_cache=key_cache, value_cache=value_cache)
