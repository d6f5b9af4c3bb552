"""The CUDA kernels on the CPU harness (backend="cpu"): the runner CI executes.

Proofs:
- placement: any physical placement of the blocks (permuted pool, NaN in free blocks and unused
  slots, garbage in table padding) gives the same bits as the contiguous placement, every version;
- oracle: every dtype x head size x block size x GQA ratio x ragged lengths up to several
  thousand agrees with a float64 reference within the bound in test_cuda_cases.tolerance, with
  the naive version 0 (within twice that bound), and with the package's NumPy paged_attention;
- reshape_and_cache and copy_blocks equal minipaged.paged.cache_ops exactly;
- the software __half equals NumPy's float16 conversions exactly.
Bad inputs, rejected before any launch, are tested in tests/test_cuda_cpu_errors.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_cpu_helpers import _numpy_oracle
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from test_cuda_cases import examples, make_case, place, reference, tolerance

from minipaged.cuda import launch as cuda
from minipaged.cuda.emu import cpu_build
from minipaged.cuda.kernels import BLOCK_SIZES, DTYPES, HEAD_SIZES, VERSIONS
from minipaged.paged import cache_ops

# the harness is built (or loaded from the cache) once for this module: tests/conftest.py
pytestmark = [pytest.mark.requires("cuda-cpu"), pytest.mark.usefixtures("library")]


# ----------------------------------------------------------------------------------------------
# Oracle matrix

lens_strategy = st.lists(
    st.one_of(st.integers(1, 64), st.integers(65, 700), st.integers(701, 4200)),
    min_size=1, max_size=3)


@settings(max_examples=examples(4, 14), suppress_health_check=[HealthCheck.too_slow])
@given(dtype=st.sampled_from(list(DTYPES)), head_size=st.sampled_from(HEAD_SIZES),
       block_size=st.sampled_from(BLOCK_SIZES), num_kv_heads=st.sampled_from([1, 2, 4]),
       group=st.sampled_from([1, 2, 4]), lens=lens_strategy, seed=st.integers(0, 2**16))
@example(dtype="float16", head_size=128, block_size=16, num_kv_heads=2, group=4,
         lens=[1, 4097, 513], seed=1)
@example(dtype="float32", head_size=64, block_size=8, num_kv_heads=1, group=4,
         lens=[2500, 17], seed=2)
# D=16 (the shipped model's head size): fp16 with BS=8 is the one instantiation whose lanes
# load 8 bytes, not 16 (paged_attention.cu, VEC); fp32 with BS=32 has one lane per token
@example(dtype="float16", head_size=16, block_size=8, num_kv_heads=2, group=2,
         lens=[600, 9, 1], seed=3)
@example(dtype="float32", head_size=16, block_size=32, num_kv_heads=1, group=4,
         lens=[33, 530], seed=4)
def test_matches_reference(dtype, head_size, block_size, num_kv_heads, group, lens, seed):
    case = make_case(seed, dtype=dtype, num_heads=num_kv_heads * group,
                     num_kv_heads=num_kv_heads, head_size=head_size, block_size=block_size,
                     lens=lens)
    kc, vc, tables = place(case, seed=seed)
    ref = reference(case)
    tol = tolerance(dtype, ref)
    outs = {}
    for version in VERSIONS:
        out = cuda.paged_attention(case.q, kc, vc, tables, case.seq_lens, version=version)
        assert out.dtype == case.q.dtype and out.shape == case.q.shape
        err = np.abs(out.astype(np.float64) - ref)
        assert (err <= tol).all(), f"v{version}: max error {err.max():.3g} beyond tolerance"
        outs[version] = out
    # the versions differ only in summation order: each within the bound of the reference, so
    # each within twice the bound of the naive version 0
    for version in VERSIONS:
        assert (np.abs(outs[version].astype(np.float64) - outs[0]) <= 2 * tol).all(), version
    oracle = _numpy_oracle()
    if oracle is not None:  # the package's NumPy paged attention, same placement
        expected = oracle(case.q, kc, vc, tables, case.seq_lens).astype(np.float64)
        # both are within `tol` of the float64 reference
        for version in VERSIONS:
            assert (np.abs(outs[version] - expected) <= 2 * tolerance(dtype, expected)).all()


@pytest.mark.parametrize("version", list(VERSIONS))
def test_one_dominant_early_logit(version):
    # Token 0's key is the query scaled up: its logit (~400) dominates every later one (~N(0,1)).
    # A kernel that subtracted the *last* logit instead of the running max would compute
    # exp(400 - small) = inf and return NaN; a correct one returns (almost exactly) V of token 0.
    case = make_case(6, dtype="float32", num_heads=2, num_kv_heads=1, head_size=64,
                     block_size=16, lens=[700, 40])
    for s in range(2):
        case.keys[s][0, 0] = case.q[s, 0] * (400.0 / float(case.q[s, 0] @ case.q[s, 0]) * 8.0)
    kc, vc, tables = place(case, seed=3)
    out = cuda.paged_attention(case.q, kc, vc, tables, case.seq_lens, version=version)
    ref = reference(case)
    assert np.isfinite(out).all()
    assert (np.abs(out - ref) <= tolerance("float32", ref)).all()
    for s in range(2):
        assert np.allclose(out[s, 0], case.values[s][0, 0], atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Placement invariance: bit for bit


@settings(max_examples=examples(4, 10))
@given(dtype=st.sampled_from(list(DTYPES)), head_size=st.sampled_from(HEAD_SIZES),
       block_size=st.sampled_from(BLOCK_SIZES), num_kv_heads=st.sampled_from([1, 2]),
       group=st.sampled_from([1, 4]),
       lens=st.lists(st.integers(1, 1300), min_size=1, max_size=4),
       seed=st.integers(0, 2**16), version=st.sampled_from(list(VERSIONS)))
@example(dtype="float16", head_size=16, block_size=8, num_kv_heads=2, group=1,
         lens=[77, 8, 600], seed=5, version=2)
def test_placement_does_not_change_a_bit(dtype, head_size, block_size, num_kv_heads, group,
                                         lens, seed, version):
    case = make_case(seed, dtype=dtype, num_heads=num_kv_heads * group,
                     num_kv_heads=num_kv_heads, head_size=head_size, block_size=block_size,
                     lens=lens)
    contiguous = cuda.paged_attention(case.q, *place(case), case.seq_lens, version=version)
    for placement_seed in (seed + 1, seed + 2):
        scattered = cuda.paged_attention(case.q, *place(case, seed=placement_seed),
                                         case.seq_lens, version=version)
        assert np.array_equal(contiguous, scattered)
    assert np.isfinite(contiguous).all()  # the NaN garbage was never read


def test_permuting_the_pool_and_rewriting_tables_changes_nothing():
    case = make_case(7, dtype="float16", num_heads=4, num_kv_heads=2, head_size=64,
                     block_size=8, lens=[100, 33, 1])
    kc, vc, tables = place(case, seed=11)
    before = cuda.paged_attention(case.q, kc, vc, tables, case.seq_lens, version=2)
    perm = np.random.default_rng(0).permutation(kc.shape[0])  # new home of block b: perm[b]
    kc2, vc2 = np.empty_like(kc), np.empty_like(vc)
    kc2[perm], vc2[perm] = kc, vc
    valid = (tables >= 0) & (tables < kc.shape[0])
    tables2 = np.where(valid, perm[np.clip(tables, 0, kc.shape[0] - 1)], tables).astype(np.int32)
    after = cuda.paged_attention(case.q, kc2, vc2, tables2, case.seq_lens, version=2)
    assert np.array_equal(before, after)


def test_chunked_launch_gives_the_same_bits(monkeypatch):
    # CUDA allows 65,535 rows in gridDim.y; pretend it allows 2 so that 5 sequences need 3
    # launches, and compare with the single launch
    from minipaged.cuda import checks

    case = make_case(4, dtype="float32", num_heads=4, num_kv_heads=2, head_size=64,
                     block_size=16, lens=[30, 1, 600, 17, 64])
    kc, vc, tables = place(case, seed=2)
    whole = {v: cuda.paged_attention(case.q, kc, vc, tables, case.seq_lens, version=v)
             for v in VERSIONS}
    monkeypatch.setattr(checks, "MAX_GRID_YZ", 2)
    launch = cuda.check_paged_attention(case.q, kc, vc, tables, case.seq_lens, scale=None,
                                        version=2, backend="cpu")
    assert launch.chunks == [(0, 2), (2, 4), (4, 5)]
    for v in VERSIONS:
        assert np.array_equal(cuda.paged_attention(case.q, kc, vc, tables, case.seq_lens,
                                                   version=v), whole[v]), v


def test_scale_is_applied():
    case = make_case(3, dtype="float32", num_heads=2, num_kv_heads=1, head_size=64,
                     block_size=16, lens=[50])
    out = cuda.paged_attention(case.q, *place(case), case.seq_lens, scale=0.3)
    ref = reference(case, scale=0.3)
    assert (np.abs(out - ref) <= tolerance("float32", ref)).all()


# ----------------------------------------------------------------------------------------------
# The cache kernels: exact against minipaged.paged.cache_ops


@settings(max_examples=examples(6, 15))
@given(dtype=st.sampled_from(list(DTYPES)), block_size=st.sampled_from([1, 8, 16]),
       num_kv_heads=st.integers(1, 3), head_size=st.sampled_from([8, 64]),
       num_blocks=st.integers(1, 6), data=st.data())
def test_reshape_and_cache_equals_numpy(dtype, block_size, num_kv_heads, head_size, num_blocks,
                                        data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    n_slots = num_blocks * block_size
    t = data.draw(st.integers(0, n_slots + 3))
    live = rng.permutation(n_slots)[: min(t, n_slots)]
    slots = np.concatenate([live, -rng.integers(1, 5, t - live.size)])
    slots = rng.permutation(slots).astype(data.draw(st.sampled_from([np.int32, np.int64])))
    key = rng.standard_normal((t, num_kv_heads, head_size)).astype(dtype)
    value = rng.standard_normal((t, num_kv_heads, head_size)).astype(dtype)
    shape = (num_blocks, num_kv_heads, block_size, head_size)
    kc = rng.standard_normal(shape).astype(dtype)
    vc = rng.standard_normal(shape).astype(dtype)
    kc2, vc2 = kc.copy(), vc.copy()
    cuda.reshape_and_cache(key, value, kc, vc, slots)
    cache_ops.reshape_and_cache(key, value, kc2, vc2, slots)
    assert np.array_equal(kc, kc2) and np.array_equal(vc, vc2)


@settings(max_examples=examples(6, 15))
@given(dtype=st.sampled_from(list(DTYPES)), num_blocks=st.integers(2, 12), data=st.data())
def test_copy_blocks_equals_numpy(dtype, num_blocks, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    ids = rng.permutation(num_blocks)
    n = data.draw(st.integers(0, num_blocks // 2))
    pairs = [(int(ids[i]), int(ids[n + i])) for i in range(n)]  # disjoint sources and targets
    shape = (num_blocks, 2, 16, 64)
    kc = rng.standard_normal(shape).astype(dtype)
    vc = rng.standard_normal(shape).astype(dtype)
    kc2, vc2 = kc.copy(), vc.copy()
    mapping = pairs if data.draw(st.booleans()) else np.array(pairs, np.int64).reshape(-1, 2)
    cuda.copy_blocks(kc, vc, mapping)
    cache_ops.copy_blocks(kc2, vc2, np.array(pairs, np.int64).reshape(-1, 2))
    assert np.array_equal(kc, kc2) and np.array_equal(vc, vc2)


# ----------------------------------------------------------------------------------------------
# The emulated __half


def test_half_to_float_is_exact_for_every_half(library):
    bits = np.arange(2**16, dtype=np.uint16)
    out = np.empty(bits.size, np.float32)
    library.mp_half_to_float(bits.ctypes.data, out.ctypes.data, bits.size)
    expected = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(out), nan)
    assert np.array_equal(out[~nan].view(np.uint32), expected[~nan].view(np.uint32))


def test_float_to_half_rounds_like_numpy(library):
    rng = np.random.default_rng(0)
    halves = np.arange(2**16, dtype=np.uint16).view(np.float16).astype(np.float32)
    halves = halves[np.isfinite(halves)]
    # every half, the midpoints between neighbours (ties to even), values just either side,
    # random floats over the whole range, overflow and underflow edges
    mids = ((halves[:-1].astype(np.float64) + halves[1:]) / 2).astype(np.float32)
    near = np.concatenate([np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(-np.inf))])
    wide = (rng.standard_normal(200_000) * 10.0 ** rng.uniform(-9, 6, 200_000)).astype(np.float32)
    edges = np.array([65504, 65519.99, 65520, 1e6, -1e6, 2**-24, 2**-25, 2**-26, 3e-8, 0.0, -0.0,
                      np.inf, -np.inf], np.float32)
    x = np.concatenate([halves, mids, near, wide, edges]).astype(np.float32)
    out = np.empty(x.size, np.uint16)
    library.mp_float_to_half(x.ctypes.data, out.ctypes.data, x.size)
    with np.errstate(over="ignore"):
        expected = x.astype(np.float16).view(np.uint16)
    assert np.array_equal(out, expected)
    nan_in = np.array([np.nan], np.float32)
    library.mp_float_to_half(nan_in.ctypes.data, out.ctypes.data, 1)
    assert np.isnan(out[:1].view(np.float16)[0])


# ----------------------------------------------------------------------------------------------
# The portable fiber switch (ucontext) computes the same bits as the x86-64 one


def test_ucontext_fibers_give_the_same_bits(library):
    import ctypes

    lib_u = cpu_build.load(ucontext=True, instantiations=(("float32", 64, 16),))
    assert lib_u.mp_fast_switch() == 0
    case = make_case(5, dtype="float32", num_heads=4, num_kv_heads=2, head_size=64,
                     block_size=16, lens=[300, 7])
    kc, vc, tables = place(case, seed=1)
    launch = cuda.check_paged_attention(case.q, kc, vc, tables, case.seq_lens, scale=None,
                                        version=1, backend="cpu")
    outs = []
    for lib in (library, lib_u):
        out = np.empty_like(case.q)
        fn = getattr(lib, cpu_build.symbol("paged_attention", "float32", 64, 16))
        rc = fn(1, out.ctypes.data, None, None, None, case.q.ctypes.data, kc.ctypes.data,
                vc.ctypes.data, tables.ctypes.data, case.seq_lens.ctypes.data, 2, 4, 2,
                tables.shape[1], 1, *launch.grid(2), launch.smem, 0, ctypes.c_float(launch.scale))
        cpu_build.check(lib, rc)
        outs.append(out)
    assert np.array_equal(outs[0], outs[1])


def test_build_variant_follows_the_environment(library):
    # MINIPAGED_SANITIZE=1 (set by test_cuda_sanitize.py for its child run) selects the ASan +
    # UBSan build; otherwise the optimised one
    assert library.mp_sanitized() == int(cpu_build.sanitizing())
