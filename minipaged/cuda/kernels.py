"""What is compiled: every kernel instantiation, named once for all three compilers.

What it teaches: a CUDA template is not code until someone instantiates it. The kernels are
templates over (dtype, head size D, block size BS); this module lists the instantiations and
spells their C++ names, which are

    NVRTC's name expressions   (cupy_runner.py; tests/test_cuda_nvrtc.py; report.py)
    what the nvcc -ptx check instantiates       (nvcc_source(); tests/test_cuda_nvcc.py)
    what the CPU harness exports, one C function per (dtype, D, BS)    (emu/wrappers.py)

so adding a head size here adds it everywhere at once.
Read next: checks.py (what a launch trusts, and which version runs).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

CUDA_DIR = Path(__file__).resolve().parent

DTYPES = {"float32": "float", "float16": "__half"}
HEAD_SIZES = (16, 64, 128)  # 16: the shipped tiny model (minipaged/model); 64, 128: real LLMs
BLOCK_SIZES = (8, 16, 32)
NUM_THREADS = 128           # threads per block of every attention kernel (4 warps)
PARTITION_SIZE = 512        # tokens per partition of the partitioned versions (2, 4)
CACHE_THREADS = 256         # threads per block of the cache kernels (at most)
GQA_GROUP = 8               # query heads one block of versions 3 and 4 computes (at most)
GROUPS = {1: 1, 2: 1, 3: GQA_GROUP, 4: GQA_GROUP}  # the kernel's GROUP, per version

# The versions of the attention kernel (paged_attention_v0.cu, paged_attention.cu), climbing
# from the naive one.
VERSIONS = {
    0: "naive: one thread per (sequence, head)",
    1: "one thread block per (head, sequence), the whole context in one pass",
    2: "one thread block per (head, sequence, partition of 512 tokens), then a reduce",
    3: "one thread block per (KV head, sequence) computing all its query heads, one pass",
    4: "one thread block per (KV head, sequence, partition) for all its query heads, + reduce",
}

KERNEL_FILES = ("paged_attention_v0.cu", "paged_attention.cu", "paged_attention_reduce.cu",
                "cache_kernels.cu")
Instantiation = tuple[str, int, int]  # (dtype, head size, block size)
ALL_INSTANTIATIONS: tuple[Instantiation, ...] = tuple(
    (dt, d, bs) for dt in DTYPES for d in HEAD_SIZES for bs in BLOCK_SIZES)


def attention_names(dtype: str, head_size: int, block_size: int) -> dict[str, str]:
    """{"v0", ..., "v4", "reduce"} -> C++ name of that kernel for one instantiation."""
    t, d, bs, nt, p, g = DTYPES[dtype], head_size, block_size, NUM_THREADS, PARTITION_SIZE, \
        GQA_GROUP
    return {
        "v0": f"mp::paged_attention_v0_kernel<{t}, {d}, {bs}>",
        "v1": f"mp::paged_attention_kernel<{t}, {d}, {bs}, {nt}, 1, 0>",
        "v2": f"mp::paged_attention_kernel<{t}, {d}, {bs}, {nt}, 1, {p}>",
        "v3": f"mp::paged_attention_kernel<{t}, {d}, {bs}, {nt}, {g}, 0>",
        "v4": f"mp::paged_attention_kernel<{t}, {d}, {bs}, {nt}, {g}, {p}>",
        "reduce": f"mp::paged_attention_v2_reduce_kernel<{t}, {d}, {nt}, {p}>",
    }


def cache_names(dtype: str) -> dict[str, str]:
    t = DTYPES[dtype]
    return {"reshape_and_cache": f"mp::reshape_and_cache_kernel<{t}>",
            "copy_blocks": f"mp::copy_blocks_kernel<{t}>"}


def kernel_names(instantiations: tuple[Instantiation, ...] | None = None) -> list[str]:
    """C++ names of every __global__ instantiation, each once (the reduce kernel does not
    depend on BS, so several instantiations share it)."""
    names: dict[str, None] = {}
    for inst in instantiations or ALL_INSTANTIATIONS:
        names.update(dict.fromkeys(attention_names(*inst).values()))
    for dtype in DTYPES:
        names.update(dict.fromkeys(cache_names(dtype).values()))
    return list(names)


def nvcc_source() -> str:
    """One CUDA file that instantiates every kernel (taking a kernel's address instantiates it),
    for ``nvcc -ptx -I minipaged/cuda``."""
    lines = [*(f'#include "{name}"' for name in KERNEL_FILES),
             "void* mp_every_kernel[] = {"]
    lines += [f"    (void*)&{name}," for name in kernel_names()]
    return "\n".join(lines + ["};", ""])


def _expand(name: str, seen: set[str]) -> str:
    """The source with its local #includes pasted in (once each, as #pragma once would)."""
    if name in seen:
        return ""
    seen.add(name)
    out = []
    for line in (CUDA_DIR / name).read_text().splitlines():
        m = re.match(r'\s*#include "([^"]+)"', line)
        if m and m.group(1) != "cuda_emu.h":  # the emulation header is never reached by NVRTC
            out.append(_expand(m.group(1), seen))
        elif line.strip() != "#pragma once":
            out.append(line)
    return "\n".join(out)


@functools.cache
def source() -> str:
    """Every kernel as one text with no #include left: what NVRTC compiles. (NVRTC would need
    include paths for the quoted headers; and CuPy's on-disk kernel cache is keyed by the text
    only, so pasting the headers in makes an edit to common.cuh change the key.)"""
    seen: set[str] = set()
    return "\n".join(_expand(name, seen) for name in KERNEL_FILES)
