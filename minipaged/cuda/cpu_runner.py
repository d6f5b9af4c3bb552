"""Runner 2: the .cu kernels on the CPU harness (backend="cpu"), called through ctypes.

What it teaches: on the harness a launch is a C call with pointers and sizes. g++ compiled the
kernel text against emu/cuda_emu.h (emu/cpu_build.py), with one exported C function per
(dtype, D, BS) that launches any version (emu/wrappers.py). Pointers go in as integers
(``ndarray.ctypes.data``), the grid and shared memory as checks.AttentionLaunch computed them; a
nonzero return code becomes a KernelError with the harness's diagnosis (deadlock, divergent
shuffle, a launch beyond CUDA's limits). The checks already ran; the interface is cupy_runner's.
Read next: cupy_runner.py.
"""

from __future__ import annotations

import numpy as np

from minipaged.cuda.checks import AttentionLaunch
from minipaged.cuda.emu import cpu_build


class Prepared:
    """A checked launch on the CPU harness: the entry point and every pointer, per chunk of at
    most 65,535 sequences (AttentionLaunch.chunks), worked out once. Calling it only launches;
    it returns out [S, H, D]."""

    def __init__(self, launch: AttentionLaunch, query, key_cache, value_cache, block_tables,
                 seq_lens) -> None:
        self.out = np.empty(query.shape, dtype=query.dtype)
        self.calls: list[tuple] = []
        if launch.num_seqs == 0:
            return
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
        for args in self.calls:
            cpu_build.check(self.lib, self.fn(*args))
        return self.out


def _call(name: str, *args) -> None:
    """Call the harness's entry point `name`, arrays passed as pointers."""
    lib = cpu_build.load()
    rc = getattr(lib, name)(*(a.ctypes.data if isinstance(a, np.ndarray) else a for a in args))
    cpu_build.check(lib, rc)


def reshape_and_cache(dtype: str, key, value, key_cache, value_cache, slots: np.ndarray,
                      threads: int) -> None:
    _, hkv, bs, d = key_cache.shape
    _call(cpu_build.symbol("reshape_and_cache", dtype), key, value, key_cache, value_cache,
          slots, len(slots), hkv, d, bs, threads)


def copy_blocks(dtype: str, key_cache, value_cache, mapping: np.ndarray, threads: int) -> None:
    _, hkv, bs, d = key_cache.shape
    _call(cpu_build.symbol("copy_blocks", dtype), key_cache, value_cache, mapping, len(mapping),
          hkv * bs * d, threads)
