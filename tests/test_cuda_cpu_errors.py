"""The CUDA kernels' launchers refuse bad inputs before any launch, naming the argument.

Proofs:
- a mistake the package's NumPy paged_attention also rejects raises the same exception with the
  same message from the kernel launcher (one set of words for one mistake);
- what only a kernel needs (compiled sizes and dtypes, int32 metadata, alignment, the shared
  memory of version 1) is refused with its own message;
- a mistake minipaged.paged.cache_ops also rejects gets its exception and message from
  reshape_and_cache and copy_blocks, and what only the cache kernels need gets its own; they
  write nothing when they refuse; empty calls are no-ops.
The kernels' results are tested in tests/test_cuda_cpu.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_cpu_helpers import _numpy_oracle
from test_cuda_cases import make_case, place

from minipaged.cuda import launch as cuda
from minipaged.paged import cache_ops

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


def _scatter(**changes):
    """A factory of reshape_and_cache's arguments (NB=3, Hkv=1, BS=4, D=8, T=3), with `changes`
    (factories too) applied: every call gets fresh arrays."""
    def make():
        kc, key = _zeros(3, 1, 4, 8), np.ones((3, 1, 8), np.float32)
        args = dict(key=key, value=key.copy(), key_cache=kc, value_cache=kc.copy(),
                    slot_mapping=np.array([0, 5, -1]))
        return dict(args, **{k: fn() for k, fn in changes.items()})
    return make


def _copy(mapping, key_cache=lambda: _zeros(3, 1, 4, 8)):
    """A factory of copy_blocks' arguments, NB=3."""
    return lambda: dict(key_cache=key_cache(), value_cache=_zeros(3, 1, 4, 8),
                        block_mapping=mapping)


def _read_only(a):
    a.flags.writeable = False
    return a


def _one_cache():
    kc = _zeros(3, 1, 4, 8)
    return dict(_scatter()(), key_cache=kc, value_cache=kc)


# Mistakes minipaged.paged.cache_ops also rejects: the launchers run its checks, so they raise
# the same exception with the same message (and write nothing).
RESHAPE, COPY = "reshape_and_cache", "copy_blocks"
SAME_AS_CACHE_OPS = [
    ("slot out of range", RESHAPE, _scatter(slot_mapping=lambda: np.array([0, 12, -1]))),
    ("slot twice", RESHAPE, _scatter(slot_mapping=lambda: np.array([3, 3, -1]))),
    ("float slots", RESHAPE, _scatter(slot_mapping=lambda: np.array([0.0, 1.0, 2.0]))),
    ("a slot short", RESHAPE, _scatter(slot_mapping=lambda: np.array([0, 1]))),
    ("key dtype", RESHAPE, _scatter(key=lambda: np.ones((3, 1, 8), np.float16))),
    ("Hkv mismatch", RESHAPE, _scatter(key=lambda: np.ones((3, 2, 8), np.float32),
                                       value=lambda: np.ones((3, 2, 8), np.float32))),
    ("2-D value", RESHAPE, _scatter(value=lambda: np.ones((3, 8), np.float32))),
    ("list key", RESHAPE, _scatter(key=lambda: np.ones((3, 1, 8)).tolist())),
    ("key and value differ", RESHAPE, _scatter(value=lambda: np.ones((2, 1, 8), np.float32))),
    ("read-only cache", RESHAPE, _scatter(key_cache=lambda: _read_only(_zeros(3, 1, 4, 8)))),
    ("one cache for K and V", RESHAPE, _one_cache),
    ("cache dtypes differ", RESHAPE,
     _scatter(value_cache=lambda: np.zeros((3, 1, 4, 8), np.float16))),
    ("3-D cache", RESHAPE, _scatter(key_cache=lambda: _zeros(3, 4, 8))),
    ("block out of range", COPY, _copy([(0, 3)])),
    ("negative block", COPY, _copy([(-1, 2)])),
    ("source and destination", COPY, _copy([(0, 1), (1, 0)])),
    ("destination twice", COPY, _copy([(0, 2), (1, 2)])),
    ("float pair", COPY, _copy([(0.5, 1)])),
    ("triple", COPY, _copy([(0, 1, 2)])),
    ("float array", COPY, _copy(np.array([[0, 1]], np.float32))),
    ("read-only cache, copy", COPY, _copy([(0, 1)], lambda: _read_only(_zeros(3, 1, 4, 8)))),
]

# the ones device arrays can make too (a device array is neither read-only nor a list, and
# whether two of them share memory is not checked)
SAME_ON_DEVICE = [c for c in SAME_AS_CACHE_OPS if c[0] in (
    "slot out of range", "slot twice", "float slots", "key dtype", "Hkv mismatch",
    "key and value differ", "cache dtypes differ", "block out of range", "source and destination",
    "destination twice")]

def _written(args) -> bool:
    return any(np.any(a) for k, a in args.items() if k.endswith("cache"))


@pytest.mark.parametrize("op,make", [c[1:] for c in SAME_AS_CACHE_OPS],
                         ids=[c[0] for c in SAME_AS_CACHE_OPS])
def test_bad_cache_inputs_get_cache_ops_message(op, make):
    with pytest.raises((TypeError, ValueError)) as numpy_error:
        getattr(cache_ops, op)(**make())
    args = make()
    with pytest.raises(type(numpy_error.value)) as cuda_error:
        getattr(cuda, op)(**args)
    assert str(cuda_error.value) == str(numpy_error.value)
    assert not _written(args)


# What only a kernel needs: a compiled dtype, C-contiguous K/V and caches, the backend's arrays.
CACHE_KERNEL_ONLY = [
    ("float64 caches", RESHAPE,
     _scatter(key=lambda: np.ones((3, 1, 8)), value=lambda: np.ones((3, 1, 8)),
              key_cache=lambda: np.zeros((3, 1, 4, 8)), value_cache=lambda: np.zeros((3, 1, 4, 8))),
     TypeError, r"key_cache.dtype is float64; the kernels are built for"),
    ("strided key", RESHAPE, _scatter(key=lambda: np.ones((3, 1, 16), np.float32)[..., ::2]),
     ValueError, r"key is not C-contiguous"),
    ("strided cache", COPY, _copy([(0, 1)], lambda: _zeros(3, 1, 4, 16)[..., ::2]),
     ValueError, r"key_cache is not C-contiguous"),
    ("list slots", RESHAPE, _scatter(slot_mapping=lambda: [0, 5, -1]), TypeError,
     r"slot_mapping must be a numpy array, got list"),
]


@pytest.mark.parametrize("op,make,exc,msg", [c[1:] for c in CACHE_KERNEL_ONLY],
                         ids=[c[0] for c in CACHE_KERNEL_ONLY])
def test_bad_cache_inputs_only_a_kernel_refuses(op, make, exc, msg):
    getattr(cache_ops, op)(**make())  # NumPy takes them
    args = make()
    with pytest.raises(exc, match=msg):
        getattr(cuda, op)(**args)
    assert not _written(args)


def test_slot_mapping_is_read_on_the_host_so_any_integer_array_will_do():
    # the kernel reads a host copy in int64, so int16 or a strided view is fine, as in NumPy
    make = _scatter(slot_mapping=lambda: np.array([0, 9, 5, 1, -1, 7], np.int16)[::2])
    args, want = make(), make()
    cache_ops.reshape_and_cache(**want)
    cuda.reshape_and_cache(**args)
    assert np.array_equal(args["key_cache"], want["key_cache"]) and args["key_cache"].any()
    assert np.array_equal(args["value_cache"], want["value_cache"])


def test_empty_calls_are_no_ops():
    kc = np.zeros((2, 1, 4, 8), np.float32)
    vc = np.zeros_like(kc)
    cuda.reshape_and_cache(np.zeros((0, 1, 8), np.float32), np.zeros((0, 1, 8), np.float32),
                           kc, vc, np.zeros(0, np.int64))
    cuda.copy_blocks(kc, vc, [])
    assert not kc.any()
