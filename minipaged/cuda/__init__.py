"""minipaged.cuda: the PagedAttention kernels in CUDA, runnable on a GPU (CuPy) or on the CPU.

The last stage of the course: the NumPy walk over a block table (minipaged/paged/
paged_attention.py) written as CUDA kernels: version 0 is its method="online", versions 1-4 keep
the logits in shared memory as vLLM's kernel does. One .cu text, two runners:

    backend="cupy"  NVRTC compiles the kernels; CuPy arrays or torch CUDA tensors in and out
    backend="cpu"   g++ compiles the same text against emu/cuda_emu.h, which emulates threads,
                    warps, shuffles, barriers and shared memory with fibers (what CI runs)

Files, in reading order: paged_attention_v0.cu (version 0), paged_attention.cu (versions 1 to
4), paged_attention_reduce.cu (the partitioned versions' merge), cache_kernels.cu, common.cuh,
kernels.py (what is compiled), checks.py (what a launch trusts, which version runs),
cache_checks.py, launch.py, cpu_runner.py and cupy_runner.py (the two runners), report.py
(registers and spills from NVRTC), gpu_check.py (`minipaged gpu-check`). The CPU harness is a
tool, in emu/. The lesson is lessons/08_gpu_kernel.py; the benchmark `minipaged bench kernel`.

Not imported by ``import minipaged``: this package may build a C++ library on first use.
"""

from __future__ import annotations

from minipaged.cuda.emu.cpu_build import BuildError, CompilerNotFoundError, KernelError
from minipaged.cuda.launch import copy_blocks, paged_attention, reshape_and_cache

__all__ = [
    "BuildError",
    "CompilerNotFoundError",
    "KernelError",
    "copy_blocks",
    "paged_attention",
    "reshape_and_cache",
]
