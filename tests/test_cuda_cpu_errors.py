"""The CUDA kernels' launchers refuse bad inputs before any launch, naming the argument.

Proofs:
- a mistake the package's NumPy paged_attention also rejects raises the same exception with the
  same message from the kernel launcher (one set of words for one mistake);
- what only a kernel needs (compiled sizes and dtypes, int32 metadata, alignment, the shared
  memory of version 1) is refused with its own message;
- reshape_and_cache and copy_blocks refuse bad slots, block pairs and dtypes, and write nothing
  when they do; empty calls are no-ops.
The kernels' results are tested in tests/test_cuda_cpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_cpu_helpers import _numpy_oracle
from test_cuda_cases import make_case, place

from minipaged.cuda import launch as cuda

# the harness is built (or loaded from the cache) once for this module: tests/conftest.py
pytestmark = [pytest.mark.requires("cuda-cpu"), pytest.mark.usefixtures("library")]


# ----------------------------------------------------------------------------------------------
# Bad inputs: rejected before the launch, with the argument named


def _good():
    case = make_case(0, dtype="float32", num_heads=4, num_kv_heads=2, head_size=64,
                     block_size=16, lens=[20, 5])
    kc, vc, tables = place(case)
    return dict(query=case.q, key_cache=kc, value_cache=vc, block_tables=tables,
                seq_lens=case.seq_lens)


def _with(**changes):
    args = _good()
    for k, fn in changes.items():
        args[k] = fn(args[k])
    return args


def _set(a, index, value):
    a = a.copy()
    a[index] = value
    return a


def _zeros(*shape):
    return np.zeros(shape, np.float32)


# Mistakes the NumPy paged attention also rejects: the launcher must raise the same exception
# with the same message (one set of words for one mistake, whichever implementation runs).
SAME_AS_NUMPY = [
    ("table entry out of range", _with(block_tables=lambda t: _set(t, (1, 0), 99))),
    ("padding inside the length", _with(block_tables=lambda t: _set(t, (0, 1), -1))),
    ("seq_len beyond the table", _with(seq_lens=lambda s: _set(s, 1, 33))),
    ("seq_len zero", _with(seq_lens=lambda s: _set(s, 0, 0))),
    ("float tables", _with(block_tables=lambda t: t.astype(np.float32))),
    ("dtype mismatch", _with(key_cache=lambda k: k.astype(np.float16))),
    ("query dtype mismatch", _with(query=lambda q: q.astype(np.float16))),
    ("heads not a multiple", _with(query=lambda q: _zeros(2, 3, 64))),
    ("head size mismatch", _with(query=lambda q: _zeros(2, 4, 128))),
    ("D=0", _with(key_cache=lambda k: _zeros(3, 2, 16, 0),
                  value_cache=lambda v: _zeros(3, 2, 16, 0))),
    ("Hkv=0", _with(key_cache=lambda k: _zeros(3, 0, 16, 64),
                    value_cache=lambda v: _zeros(3, 0, 16, 64))),
    ("3-D cache", _with(key_cache=lambda k: k[:, 0])),
    ("cache shapes differ", _with(value_cache=lambda v: v[:2].copy())),
    ("list cache", _with(key_cache=lambda k: k.tolist())),
    ("list query", _with(query=lambda q: q.tolist())),
    ("2-D query", _with(query=lambda q: q[0])),
    ("strided cache", _with(key_cache=lambda k: np.zeros((3, 2, 16, 128), np.float32)[..., ::2])),
    ("seq_lens 2-D", _with(seq_lens=lambda s: s.reshape(2, 1))),
    ("rows of tables", _with(block_tables=lambda t: t[:1])),
    ("string scale", dict(_good(), scale="0.1")),
    ("nan scale", dict(_good(), scale=float("nan"))),
]


@pytest.mark.parametrize("args", [c[1] for c in SAME_AS_NUMPY], ids=[c[0] for c in SAME_AS_NUMPY])
def test_bad_attention_inputs_get_numpys_message(args):
    with pytest.raises((TypeError, ValueError)) as numpy_error:
        _numpy_oracle()(**args)
    with pytest.raises(type(numpy_error.value)) as cuda_error:
        cuda.paged_attention(**args)
    assert str(cuda_error.value) == str(numpy_error.value)


# What only a kernel needs: compiled sizes and dtypes, int32 metadata, alignment.
KERNEL_ONLY = [
    ("int64 tables", _with(block_tables=lambda t: t.astype(np.int64)), TypeError,
     r"block_tables.dtype is int64; expected int32"),
    ("float64 query", _with(query=lambda q: q.astype(np.float64),
                            key_cache=lambda k: k.astype(np.float64),
                            value_cache=lambda v: v.astype(np.float64)),
     TypeError, r"key_cache.dtype is float64; the kernels are built for"),
    ("unsupported block size", _with(key_cache=lambda k: _zeros(3, 2, 4, 64),
                                     value_cache=lambda v: _zeros(3, 2, 4, 64)),
     ValueError, r"block size BS=4"),
    ("non-contiguous query", _with(query=lambda q: _zeros(2, 4, 128)[:, :, ::2]),
     ValueError, r"query is not C-contiguous"),
    ("list tables", _with(block_tables=lambda t: t.tolist()), TypeError,
     r"block_tables must be a numpy array, got list"),
    ("misaligned cache", _with(key_cache=lambda k: np.frombuffer(
        np.zeros(k.nbytes + 4, np.uint8), np.float32, offset=4).reshape(k.shape)),
     ValueError, r"key_cache starts at an address that is not a multiple of 16 bytes"),
    ("float version", dict(_good(), version=1.0), TypeError,
     r"version=1.0 must be an integer, got float"),
    ("bool version", dict(_good(), version=True), TypeError, r"version=True must be an integer"),
    ("unknown version", dict(_good(), version=7), ValueError,
     r"version=7 is not one of \[0, 1, 2"),
    ("unknown backend", dict(_good(), backend="tpu"), ValueError, r"backend='tpu'"),
    # NumPy arrays on the GPU backend are refused before CuPy is even imported
    ("numpy on cupy", dict(_good(), backend="cupy"), TypeError,
     r"key_cache is a NumPy array; backend='cupy'"),
]


@pytest.mark.parametrize("args,exc,msg", [c[1:] for c in KERNEL_ONLY],
                         ids=[c[0] for c in KERNEL_ONLY])
def test_bad_attention_inputs(args, exc, msg):
    with pytest.raises(exc, match=msg):
        cuda.paged_attention(**args)


def test_v1_beyond_shared_memory_is_refused_on_the_harness_too():
    # the harness enforces an H100's 227 KiB, so what runs here also launches there
    case = make_case(0, dtype="float16", num_heads=1, num_kv_heads=1, head_size=16,
                     block_size=32, lens=[60_000])
    kc, vc, tables = place(case)
    with pytest.raises(ValueError, match=r"use version=2"):
        cuda.paged_attention(case.q, kc, vc, tables, case.seq_lens, version=1)
    launch = cuda.check_paged_attention(case.q, kc, vc, tables, case.seq_lens, scale=None,
                                        version=None, backend="cpu")
    assert launch.version == 2 and launch.max_partitions == -(-60_000 // 512)


def test_bad_cache_inputs():
    kc = np.zeros((2, 1, 4, 8), np.float32)
    vc = np.zeros_like(kc)
    key = np.ones((3, 1, 8), np.float32)
    with pytest.raises(ValueError, match=r"slot_mapping\[1\] = 8 is out of range"):
        cuda.reshape_and_cache(key, key, kc, vc, np.array([0, 8, -1]))
    with pytest.raises(ValueError, match=r"names one slot twice"):
        cuda.reshape_and_cache(key, key, kc, vc, np.array([3, 3, -1]))
    with pytest.raises(TypeError, match=r"slot_mapping.dtype is float64"):
        cuda.reshape_and_cache(key, key, kc, vc, np.array([0.0, 1.0, 2.0]))
    with pytest.raises(TypeError, match=r"key.dtype is float16"):
        cuda.reshape_and_cache(key.astype(np.float16), key, kc, vc, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=r"expected \[T, Hkv=1, D=8\]"):
        cuda.reshape_and_cache(np.ones((3, 2, 8), np.float32), np.ones((3, 2, 8), np.float32),
                               kc, vc, np.array([0, 1, 2]))
    kc_ro = kc.copy()
    kc_ro.flags.writeable = False
    with pytest.raises(ValueError, match=r"key_cache is read-only"):
        cuda.reshape_and_cache(key, key, kc_ro, vc, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=r"block_mapping\[0, 1\] = 2 is out of range"):
        cuda.copy_blocks(kc, vc, [(0, 2)])
    with pytest.raises(ValueError, match=r"block 0 both as a source and as a destination"):
        cuda.copy_blocks(kc, vc, [(0, 1), (1, 0)])
    with pytest.raises(TypeError, match=r"block_mapping\[0\] = \(0.5, 1\)"):
        cuda.copy_blocks(kc, vc, [(0.5, 1)])
    with pytest.raises(ValueError, match=r"writes one destination block twice"):
        cuda.copy_blocks(np.zeros((3, 1, 4, 8), np.float32), np.zeros((3, 1, 4, 8), np.float32),
                         [(0, 2), (1, 2)])
    # nothing was written by any rejected call
    assert not kc.any() and not vc.any()


def test_empty_calls_are_no_ops():
    kc = np.zeros((2, 1, 4, 8), np.float32)
    vc = np.zeros_like(kc)
    cuda.reshape_and_cache(np.zeros((0, 1, 8), np.float32), np.zeros((0, 1, 8), np.float32),
                           kc, vc, np.zeros(0, np.int64))
    cuda.copy_blocks(kc, vc, [])
    assert not kc.any()
