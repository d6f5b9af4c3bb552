"""minipaged.cuda: the PagedAttention kernels in CUDA, runnable on a GPU (CuPy) or on the CPU.

The last stage of the course: the NumPy walk over a block table (minipaged/paged_attention.py,
method="online") written as a CUDA kernel. One .cu text, two runners:

    backend="cupy"  NVRTC compiles the kernels; CuPy arrays or torch CUDA tensors in and out
    backend="cpu"   g++ compiles the same text against cuda_emu.h, which emulates threads,
                    warps, shuffles, barriers and shared memory with fibers (what CI runs)

Files, in reading order: paged_attention.cu, cache_kernels.cu, common.cuh, cuda_emu.h (with
emu_fibers.h and emu_half.h), checks.py (what a launch trusts), launch.py, cpu_build.py,
cupy_runner.py, broken_kernels.cu (bugs the harness catches). The lesson is
lessons/08_gpu_kernel.py; the benchmark `minipaged bench kernel`.

Not imported by ``import minipaged``: this package may build a C++ library on first use.
"""

from __future__ import annotations

from minipaged.cuda.cpu_build import BuildError, CompilerNotFoundError, KernelError
from minipaged.cuda.launch import copy_blocks, paged_attention, reshape_and_cache

__all__ = [
    "BuildError",
    "CompilerNotFoundError",
    "KernelError",
    "copy_blocks",
    "paged_attention",
    "reshape_and_cache",
]
