"""The CUDA kernels on a real GPU through CuPy (backend="cupy"). Skipped where CuPy sees no GPU.

The same proofs as test_cuda_cpu.py, on the GPU runner: placement never changes a bit; the
float64 reference within test_cuda_cases.tolerance; every version against v0; the cache kernels
exact; bad inputs (CuPy arrays this time) rejected before the launch, the cache kernels' in
minipaged.paged.cache_ops' words. Across runners (GPU against the CPU harness) only the stated
tolerance holds: nvcc fuses multiply-adds and CUDA's expf is not glibc's.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_cuda_cases import make_case, place, reference, tolerance
from test_cuda_cpu_errors import SAME_ON_DEVICE

from minipaged.cuda import launch as cuda
from minipaged.cuda.kernels import BLOCK_SIZES, DTYPES, HEAD_SIZES, VERSIONS
from minipaged.paged import cache_ops

pytestmark = pytest.mark.requires("gpu")


def gpu(*arrays):
    import cupy

    return [cupy.asarray(a) for a in arrays]


@settings(max_examples=20, deadline=None)
@given(dtype=st.sampled_from(list(DTYPES)), head_size=st.sampled_from(HEAD_SIZES),
       block_size=st.sampled_from(BLOCK_SIZES), num_kv_heads=st.sampled_from([1, 2, 8]),
       group=st.sampled_from([1, 4]),
       lens=st.lists(st.one_of(st.integers(1, 600), st.integers(600, 9000)), min_size=1,
                     max_size=4),
       seed=st.integers(0, 2**16))
def test_gpu_matches_reference_and_placement(dtype, head_size, block_size, num_kv_heads, group,
                                             lens, seed):
    import cupy

    case = make_case(seed, dtype=dtype, num_heads=num_kv_heads * group,
                     num_kv_heads=num_kv_heads, head_size=head_size, block_size=block_size,
                     lens=lens)
    ref = reference(case)
    tol = tolerance(dtype, ref)
    q, lens_d = gpu(case.q, case.seq_lens)
    outs = {}
    for version in VERSIONS:
        contiguous = cupy.asnumpy(cuda.paged_attention(q, *gpu(*place(case)), lens_d,
                                                       backend="cupy", version=version))
        scattered = cupy.asnumpy(cuda.paged_attention(q, *gpu(*place(case, seed=seed)), lens_d,
                                                      backend="cupy", version=version))
        assert np.array_equal(contiguous, scattered)
        assert (np.abs(contiguous.astype(np.float64) - ref) <= tol).all()
        outs[version] = contiguous
    for version in VERSIONS:
        assert (np.abs(outs[version].astype(np.float64) - outs[0]) <= 2 * tol).all(), version
    # across runners: each within the bound of the reference
    cpu = cuda.paged_attention(case.q, *place(case), case.seq_lens, backend="cpu")
    assert (np.abs(cpu.astype(np.float64) - outs[1]) <= 2 * tol).all()


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_gpu_cache_kernels_exact(dtype):
    import cupy

    rng = np.random.default_rng(0)
    kc = rng.standard_normal((8, 2, 16, 64)).astype(dtype)
    vc = rng.standard_normal((8, 2, 16, 64)).astype(dtype)
    key = rng.standard_normal((20, 2, 64)).astype(dtype)
    value = rng.standard_normal((20, 2, 64)).astype(dtype)
    slots = rng.permutation(128)[:20]
    slots[[3, 7]] = -1
    kd, vd = gpu(kc, vc)
    cuda.reshape_and_cache(*gpu(key, value), kd, vd, cupy.asarray(slots), backend="cupy")
    cache_ops.reshape_and_cache(key, value, kc, vc, slots)
    pairs = [(0, 5), (1, 6), (2, 7)]
    cuda.copy_blocks(kd, vd, pairs, backend="cupy")
    cache_ops.copy_blocks(kc, vc, np.array(pairs))
    assert np.array_equal(cupy.asnumpy(kd), kc) and np.array_equal(cupy.asnumpy(vd), vc)


def test_gpu_rejects_bad_tables_before_launch():
    case = make_case(0, dtype="float16", num_heads=4, num_kv_heads=2, head_size=64,
                     block_size=16, lens=[20, 5])
    kc, vc, tables = place(case)
    tables[1, 0] = 99
    with pytest.raises(ValueError, match=r"block_tables\[1, 0\] = 99 is out of range"):
        cuda.paged_attention(*gpu(case.q, kc, vc, tables, case.seq_lens), backend="cupy")
    with pytest.raises(TypeError, match=r"block_tables.dtype is int64"):
        cuda.paged_attention(*gpu(case.q, kc, vc, tables.astype(np.int64), case.seq_lens),
                             backend="cupy")



@pytest.mark.parametrize("op,make", [c[1:] for c in SAME_ON_DEVICE],
                         ids=[c[0] for c in SAME_ON_DEVICE])
def test_gpu_bad_cache_inputs_get_cache_ops_message(op, make):
    import cupy

    with pytest.raises((TypeError, ValueError)) as numpy_error:
        getattr(cache_ops, op)(**make())
    args = {k: cupy.asarray(a) if isinstance(a, np.ndarray) else a for k, a in make().items()}
    with pytest.raises(type(numpy_error.value)) as cuda_error:
        getattr(cuda, op)(**args, backend="cupy")
    assert str(cuda_error.value) == str(numpy_error.value)
    assert not any(bool(a.any()) for k, a in args.items() if k.endswith("cache"))

def test_torch_cuda_tensors_zero_copy():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here (the CuPy tests above still ran)")
    case = make_case(1, dtype="float16", num_heads=8, num_kv_heads=2, head_size=128,
                     block_size=16, lens=[300, 17])
    kc, vc, tables = place(case, seed=2)
    t = [torch.from_numpy(a).cuda() for a in (case.q, kc, vc, tables, case.seq_lens)]
    out = cuda.paged_attention(*t, backend="cupy", version=2)
    assert isinstance(out, torch.Tensor) and out.is_cuda
    expected = cuda.paged_attention(*gpu(case.q, kc, vc, tables, case.seq_lens), backend="cupy",
                                    version=2)
    assert np.array_equal(out.cpu().numpy(), expected.get())
    # in place through DLPack: the torch cache itself changes
    key = torch.ones((1, 2, 128), dtype=torch.float16, device="cuda")
    cuda.reshape_and_cache(key, key, t[1], t[2], torch.tensor([5], device="cuda"),
                           backend="cupy")
    assert bool((t[1][0, :, 5] == 1).all())
