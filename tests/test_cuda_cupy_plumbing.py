"""The CuPy runner's host code, checked without a GPU against the kernels' C++ signatures.

CuPy does not check kernel arguments: a Python int where the kernel reads an int, or arguments
in the wrong order, would silently corrupt memory. So a stand-in for CuPy records every launch,
and each recorded argument list is compared with the parameter list parsed from the .cu file:
same count, every pointer an array of the matching dtype, every `int` an np.int32 and every
`float` an np.float32, and the launch geometry (grid, threads, shared memory) as the CPU runner
computes it. (test_cuda_gpu.py runs the real thing where a GPU exists.)
"""

from __future__ import annotations

import re
import sys
import types

import numpy as np
import pytest
from test_cuda_cases import make_case, place

from minipaged.cuda import cupy_runner, kernels
from minipaged.cuda import launch as cuda


class FakeArray:
    """Just enough of cupy.ndarray: a NumPy array that is not an np.ndarray."""

    def __init__(self, a):
        self.a = np.ascontiguousarray(a)
        self.shape, self.dtype, self.ndim, self.size = (self.a.shape, self.a.dtype, self.a.ndim,
                                                        self.a.size)
        self.flags = self.a.flags
        self.data = types.SimpleNamespace(ptr=self.a.ctypes.data)


class FakeKernel:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def __call__(self, grid, block, args, shared_mem=0):
        self.log.append((self.name, grid, block, args, shared_mem))


@pytest.fixture
def launches(monkeypatch):
    log = []
    fake = types.ModuleType("cupy")
    fake.float32, fake.int64 = np.float32, np.int64
    fake.empty = lambda shape, dtype: FakeArray(np.empty(shape, dtype))
    fake.asarray = lambda a, dtype=None: FakeArray(np.asarray(getattr(a, "a", a), dtype))
    fake.ascontiguousarray = lambda a, dtype=None: FakeArray(np.asarray(getattr(a, "a", a),
                                                                        dtype))
    fake.asnumpy = lambda a: np.asarray(getattr(a, "a", a))

    class RawModule:
        def __init__(self, code, options, name_expressions):
            assert "__CUDACC__" in code and '#include "common.cuh"' not in code  # pasted in
            self.names = name_expressions

        def get_function(self, name):
            assert name in self.names
            return FakeKernel(name, log)

    fake.RawModule = RawModule
    fake.cuda = types.SimpleNamespace(
        Device=lambda: types.SimpleNamespace(attributes={"MaxSharedMemoryPerBlockOptin": 232448}))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    cupy_runner.attention_kernels.cache_clear()
    cupy_runner.cache_kernels.cache_clear()
    yield log
    cupy_runner.attention_kernels.cache_clear()
    cupy_runner.cache_kernels.cache_clear()


def signature(kernel: str) -> list[str]:
    """Parameter types of a __global__ kernel, read from the .cu source."""
    text = cupy_runner.source()
    m = re.search(kernel + r"\((.*?)\)\s*{", text, flags=re.S)
    params = re.sub(r"//[^\n]*", "", m.group(1)).split(",")
    return [re.sub(r"\b(const|__restrict__)\b|\w+$", "", p.strip()).replace(" ", "")
            for p in params]


def check_args(types_: list[str], args, scalar_dtype):
    assert len(args) == len(types_)
    for t, a in zip(types_, args):
        if t.endswith("*"):
            assert isinstance(a, FakeArray), t
            want = {"scalar_t*": scalar_dtype, "float*": np.float32, "int*": np.int32,
                    "longlong*": np.int64}[t]
            assert a.dtype == want, (t, a.dtype)
        else:
            assert type(a) is {"int": np.int32, "float": np.float32}[t], (t, type(a))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("version", [1, 2])
def test_attention_launch_arguments_match_the_kernel(launches, dtype, version):
    case = make_case(0, dtype=dtype, num_heads=8, num_kv_heads=2, head_size=128, block_size=16,
                     lens=[1100, 7])
    args = [FakeArray(a) for a in (case.q, *place(case, seed=1), case.seq_lens)]
    out = cuda.paged_attention(*args, backend="cupy", version=version)
    assert out.shape == case.q.shape and out.dtype == case.q.dtype
    expected = cuda.check_paged_attention(case.q, *place(case, seed=1), case.seq_lens,
                                          scale=None, version=version, backend="cpu")
    name, grid, block, a, smem = launches[0]
    assert name.startswith("mp::paged_attention_kernel<")
    assert name.endswith(f"{kernels.PARTITION_SIZE if version == 2 else 0}>")
    assert grid == (8, 2, expected.max_partitions) and block == (kernels.NUM_THREADS,)
    assert smem == expected.smem
    check_args(signature("paged_attention_kernel"), a, np.dtype(dtype))
    if version == 2:
        assert expected.max_partitions == 3
        name, grid, block, a, smem = launches[1]
        assert "reduce" in name and grid == (8, 2, 1) and smem == expected.reduce_smem
        check_args(signature("paged_attention_v2_reduce_kernel"), a, np.dtype(dtype))
    assert len(launches) == version


def test_cache_launch_arguments_match_the_kernels(launches):
    kc = FakeArray(np.zeros((4, 2, 16, 64), np.float16))
    vc = FakeArray(np.zeros((4, 2, 16, 64), np.float16))
    key = FakeArray(np.ones((3, 2, 64), np.float16))
    cuda.reshape_and_cache(key, key, kc, vc, FakeArray(np.array([0, 5, -1], np.int32)),
                           backend="cupy")
    cuda.copy_blocks(kc, vc, [(0, 1), (2, 3)], backend="cupy")
    (n1, g1, b1, a1, _), (n2, g2, b2, a2, _) = launches
    assert n1 == "mp::reshape_and_cache_kernel<__half>" and g1 == (3,) and b1 == (128,)
    check_args(signature("reshape_and_cache_kernel"), a1, np.dtype(np.float16))
    assert n2 == "mp::copy_blocks_kernel<__half>" and g2 == (2,)
    check_args(signature("copy_blocks_kernel"), a2, np.dtype(np.float16))


def test_bad_tables_are_caught_before_any_gpu_launch(launches):
    case = make_case(0, dtype="float16", num_heads=4, num_kv_heads=2, head_size=64,
                     block_size=16, lens=[20, 5])
    kc, vc, tables = place(case)
    tables[0, 1] = 77
    with pytest.raises(ValueError, match=r"block_tables\[0, 1\] = 77 is out of range"):
        cuda.paged_attention(*(FakeArray(a) for a in (case.q, kc, vc, tables, case.seq_lens)),
                             backend="cupy")
    assert launches == []


def test_v1_beyond_shared_memory_asks_for_v2(launches):
    case = make_case(0, dtype="float16", num_heads=2, num_kv_heads=2, head_size=64,
                     block_size=32, lens=[60_000])
    args = [FakeArray(a) for a in (case.q, *place(case), case.seq_lens)]
    with pytest.raises(ValueError, match=r"use version=2"):
        cuda.paged_attention(*args, backend="cupy", version=1)
    assert launches == []
