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
from test_cuda_cpu_errors import SAME_ON_DEVICE

from minipaged.cuda import checks, cupy_runner, kernels
from minipaged.cuda import launch as cuda
from minipaged.paged import cache_ops


class FakeArray:
    """Just enough of cupy.ndarray: a NumPy array that is not an np.ndarray."""

    def __init__(self, a):
        self.a = a if a.flags.c_contiguous else np.ascontiguousarray(a)
        self.shape, self.dtype, self.ndim, self.size = (self.a.shape, self.a.dtype, self.a.ndim,
                                                        self.a.size)
        self.flags = self.a.flags
        self.data = types.SimpleNamespace(ptr=self.a.ctypes.data)

    def __getitem__(self, index):  # a view, like CuPy's: same memory, shifted pointer
        return FakeArray(self.a[index])


OPTIN = 232448  # an H100's MaxSharedMemoryPerBlockOptin


def static_smem_of(name: str) -> int:
    """What the driver would report as the kernel's static shared memory."""
    if "reduce" in name or "cache" in name or "copy" in name:
        return 0
    partitioned = name.endswith(f", {kernels.PARTITION_SIZE}>")
    grouped = ", 8, " in name
    version = 0 if "_v0_" in name else 1 + partitioned + 2 * grouped
    head_size = int(name.split("<")[1].split(",")[1])
    return checks.static_smem(version, head_size)


class FakeKernel:
    """A RawKernel that enforces CUDA's launch rules: the dynamic shared memory must not exceed
    the kernel's max_dynamic_shared_size_bytes attribute (48 KiB minus its static shared memory
    until someone raises it), static + dynamic must fit the opt-in limit, and gridDim.y and .z
    stay within 65,535."""

    def __init__(self, name, log):
        self.name, self.log = name, log
        self.shared_size_bytes = static_smem_of(name)
        self.max_dynamic_shared_size_bytes = 48 * 1024 - self.shared_size_bytes

    def __call__(self, grid, block, args, shared_mem=0):
        if shared_mem > self.max_dynamic_shared_size_bytes:
            raise RuntimeError(f"{self.name}: {shared_mem} B of dynamic shared memory above the "
                               f"attribute {self.max_dynamic_shared_size_bytes} B: launch fails")
        if self.shared_size_bytes + shared_mem > OPTIN:
            raise RuntimeError(f"{self.name}: static + dynamic above the opt-in limit")
        if max((*grid, 1, 1)[1:3]) > 65535:
            raise RuntimeError(f"{self.name}: grid {grid} beyond CUDA's limits")
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
        Device=lambda: types.SimpleNamespace(attributes={"MaxSharedMemoryPerBlockOptin": OPTIN}))
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


KERNEL_OF = {0: "paged_attention_v0_kernel", 1: "paged_attention_kernel",
             2: "paged_attention_kernel", 3: "paged_attention_kernel", 4: "paged_attention_kernel"}


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("version", list(kernels.VERSIONS))
def test_attention_launch_arguments_match_the_kernel(launches, dtype, version):
    case = make_case(0, dtype=dtype, num_heads=8, num_kv_heads=2, head_size=128, block_size=16,
                     lens=[1100, 7])
    args = [FakeArray(a) for a in (case.q, *place(case, seed=1), case.seq_lens)]
    out = cuda.paged_attention(*args, backend="cupy", version=version)
    assert out.shape == case.q.shape and out.dtype == case.q.dtype
    expected = cuda.check_paged_attention(case.q, *place(case, seed=1), case.seq_lens,
                                          scale=None, version=version, backend="cpu")
    name, grid, block, a, smem = launches[0]
    assert name == kernels.attention_names(dtype, 128, 16)[f"v{version}"]
    assert grid == expected.grid(2) and block == (kernels.NUM_THREADS,)
    assert smem == expected.smem
    check_args(signature(KERNEL_OF[version]), a, np.dtype(dtype))
    if expected.partitioned:
        assert expected.max_partitions == 3
        name, grid, block, a, smem = launches[1]
        assert "reduce" in name and grid == (8, 2, 1) and smem == expected.reduce_smem
        check_args(signature("paged_attention_v2_reduce_kernel"), a, np.dtype(dtype))
    assert len(launches) == (2 if expected.partitioned else 1)


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



@pytest.mark.parametrize("op,make", [c[1:] for c in SAME_ON_DEVICE],
                         ids=[c[0] for c in SAME_ON_DEVICE])
def test_bad_cache_inputs_on_the_device_get_cache_ops_message(launches, op, make):
    # the checks read host views of the device arrays and a host copy of the slots, so a
    # mistake gets minipaged.paged.cache_ops' words on the GPU backend too, before any launch
    with pytest.raises((TypeError, ValueError)) as numpy_error:
        getattr(cache_ops, op)(**make())
    args = {k: FakeArray(a) if isinstance(a, np.ndarray) else a for k, a in make().items()}
    with pytest.raises(type(numpy_error.value)) as cuda_error:
        getattr(cuda, op)(**args, backend="cupy")
    assert str(cuda_error.value) == str(numpy_error.value)
    assert launches == []

def _gpu_args(case, seed=None):
    return [FakeArray(a) for a in (case.q, *place(case, seed=seed), case.seq_lens)]


def test_v1_beyond_shared_memory_asks_for_v2(launches):
    case = make_case(0, dtype="float16", num_heads=2, num_kv_heads=2, head_size=64,
                     block_size=32, lens=[60_000])
    with pytest.raises(ValueError, match=r"above the 232448 a thread block may use; use "
                                         r"version=2"):
        cuda.paged_attention(*_gpu_args(case), backend="cupy", version=1)
    assert launches == []
    cuda.paged_attention(*_gpu_args(case), backend="cupy")  # the automatic choice: v2
    assert launches[0][0].endswith(f", {kernels.PARTITION_SIZE}>")


@pytest.mark.parametrize("tokens", [11_600, 12_200, 40_000])
def test_v1_opts_in_to_the_shared_memory_it_needs(launches, tokens):
    # D=128, BS=16: 544 B of static shared memory, so a dynamic part of 12,200 tokens' logits
    # (48,832 B, under 48 KiB by itself) needs the opt-in; 11,600 tokens (46,400 B) does not
    case = make_case(0, dtype="float16", num_heads=1, num_kv_heads=1, head_size=128,
                     block_size=16, lens=[tokens])
    cuda.paged_attention(*_gpu_args(case), backend="cupy", version=1)
    (name, _, _, _, smem), = launches
    assert smem == -(-tokens // 16) * 16 * 4


def test_more_sequences_than_grid_y_allows_are_launched_in_chunks(launches):
    s = 70_000  # a prefill step of 70,000 tokens makes one row per token
    case = make_case(0, dtype="float32", num_heads=2, num_kv_heads=1, head_size=16,
                     block_size=8, lens=[1] * s)
    q, kc, vc, tables, lens = _gpu_args(case)
    cuda.paged_attention(q, kc, vc, tables, lens, backend="cupy", version=1)
    assert [g[1] for _, g, _, _, _ in launches] == [65_535, s - 65_535]
    out0, out1 = launches[0][3][0], launches[1][3][0]
    assert out1.data.ptr - out0.data.ptr == 65_535 * 2 * 16 * 4  # row 65,535 of out
    assert launches[1][3][4].data.ptr - q.data.ptr == 65_535 * 2 * 16 * 4
    assert launches[1][3][7].data.ptr - tables.data.ptr == 65_535 * tables.shape[1] * 4


def test_the_automatic_choice_is_vllms_rule(launches):
    def chosen(s, h, length, hkv=None):
        return checks.choose_version(s, h, hkv or h, length, 16, 128)

    assert chosen(1, 32, 512) == 1      # one partition: no reduce needed
    assert chosen(1, 32, 4096) == 2     # 32 blocks, 8 partitions: v2 fills the GPU
    assert chosen(17, 32, 4096) == 1    # 544 blocks > 512: enough work for the single pass
    assert chosen(16, 32, 4096) == 2    # 512 blocks: not more than 512
    assert chosen(64, 32, 8193) == 2    # above 8192 tokens: v2 whatever the batch
    # H > Hkv: the grouped pair, by the same rule counting their blocks (S * Hkv here)
    assert chosen(1, 32, 512, hkv=8) == 3
    assert chosen(32, 32, 4096, hkv=8) == 4   # 256 blocks: partitioned (v1 would get 1024)
    assert chosen(65, 32, 4096, hkv=8) == 3   # 520 blocks
    assert chosen(65, 64, 8192, hkv=1) == 4   # G=64: 8 blocks per sequence, but 8 heads' logits
    #                                           of 8192 tokens (256 KiB) do not fit
    case = make_case(0, dtype="float16", num_heads=4, num_kv_heads=4, head_size=64,
                     block_size=16, lens=[3000])
    cuda.paged_attention(*_gpu_args(case), backend="cupy")
    assert launches[0][0] == kernels.attention_names("float16", 64, 16)["v2"]
