"""What a kernel launch trusts, checked on the host before the launch; and which version runs.

What it teaches: a GPU kernel trusts its arguments completely. CuPy passes raw pointers and does
not check scalar types; the kernel reads wherever a block table points and assumes every array
is C-contiguous and 16-byte aligned. So every check happens here, before the launch: dtypes,
shapes, contiguity, alignment, and every block-table entry a kernel will follow (entries past
a sequence's length are never read, so they may hold anything). What the NumPy paged attention
checks, its own functions check (on a device array's shape and dtype): one mistake, one message,
whichever implementation runs. What only a kernel needs (compiled sizes, int32 tables,
alignment, shared memory, grid limits) comes after.

Then the launch geometry, once for both runners: which version (choose_version, vLLM's rule),
the grid, the shared memory, and the chunks of at most 65,535 sequences that CUDA's gridDim.y
allows per launch (a prefill step makes one row per token, so S can exceed it).
Read next: cache_checks.py (the same discipline for the kernels that write the cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from minipaged._checks import cdiv, check_block_tables, check_choice, check_int, check_query
from minipaged.attention import check_scale
from minipaged.cuda import kernels
from minipaged.cuda.kernels import GROUPS, NUM_THREADS, PARTITION_SIZE
from minipaged.paged.cache_ops import check_caches

BACKENDS = ("cpu", "cupy")
MAX_GRID_YZ = 65535             # gridDim.y and gridDim.z limit of every CUDA GPU since sm_30
SMEM_LIMIT_SM90 = 227 * 1024    # the most shared memory one block may opt in to on sm_90
#                                 (CUDA C++ Programming Guide, compute capabilities table);
#                                 this file applies it on backend="cpu" too, so what runs
#                                 here launches on an H100/H200
# vLLM's rule for v1 or v2 (v0 releases, vllm/attention/ops/paged_attn.py, forward_decode):
# v1 when max_seq_len <= 8192 and (one partition, or num_seqs * num_heads > 512)
SINGLE_PASS_MAX_LEN = 8192
SINGLE_PASS_MIN_BLOCKS = 512


# ----------------------------------------------------------------------------------------------
# Checks that hold for NumPy and CuPy arrays alike (both have .shape, .dtype, .flags).


def check_types(backend: str, **arrays: Any) -> None:
    """NumPy arrays for backend="cpu" (NumPy's message), CuPy arrays for backend="cupy"."""
    check_choice("backend", backend, BACKENDS)
    for name, a in arrays.items():
        if backend == "cpu" and not isinstance(a, np.ndarray):
            hint = (" (backend='cpu' takes NumPy arrays; GPU arrays need backend='cupy')"
                    if hasattr(a, "__cuda_array_interface__") else "")
            raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}{hint}")
        if backend == "cupy" and isinstance(a, np.ndarray):
            raise TypeError(f"{name} is a NumPy array; backend='cupy' takes CuPy arrays or "
                            "torch CUDA tensors (use backend='cpu' for NumPy)")
        if backend == "cupy" and not all(hasattr(a, x) for x in ("shape", "dtype", "flags")):
            raise TypeError(f"{name} must be a CuPy array or a torch CUDA tensor, got "
                            f"{type(a).__name__}")


def host_view(a: Any) -> np.ndarray:
    """A NumPy array with a device array's shape and dtype, for the NumPy checks to look at:
    one zero broadcast to the shape (no copy, no data). A NumPy array is itself."""
    return a if isinstance(a, np.ndarray) else np.broadcast_to(np.zeros((), a.dtype), a.shape)


def to_host(a: Any) -> np.ndarray:
    """The values of `a` as NumPy: a CuPy array is copied from the device."""
    if isinstance(a, np.ndarray) or not hasattr(a, "dtype"):
        return np.asarray(a)
    import cupy  # only reached with backend="cupy"

    return cupy.asnumpy(a)


def check_float_dtype(name: str, a: Any) -> str:
    dt = np.dtype(a.dtype).name
    if dt not in kernels.DTYPES:
        raise TypeError(f"{name}.dtype is {dt}; the kernels are built for "
                        f"{tuple(kernels.DTYPES)}")
    return dt


def check_int_dtype(name: str, a: Any, allowed: tuple[str, ...]) -> None:
    dt = np.dtype(a.dtype).name
    if dt not in allowed:
        raise TypeError(f"{name}.dtype is {dt}; expected {' or '.join(allowed)}")


def check_contiguous(name: str, a: Any) -> None:
    if not a.flags.c_contiguous:
        raise ValueError(f"{name} is not C-contiguous; the kernels index raw memory with the "
                         "row-major strides of its shape (pass np.ascontiguousarray(...))")


def _check_aligned(name: str, a: Any) -> None:
    """The kernels load 16 bytes at a time; a view that starts mid-vector would fault on a GPU."""
    pointer = int(a.ctypes.data) if isinstance(a, np.ndarray) else int(a.data.ptr)
    if a.size and pointer % 16:
        raise ValueError(f"{name} starts at an address that is not a multiple of 16 bytes (a "
                         "view into a larger array?); the kernel's 16-byte loads need it "
                         "aligned: pass a copy")


# ----------------------------------------------------------------------------------------------
# paged_attention: which version, and how much shared memory


def static_smem(version: int, head_size: int) -> int:
    """Bytes of the __shared__ arrays a version's main kernel declares (tests/test_cuda_nvrtc.py
    compares this with what NVRTC's ptxas reports for every instantiation)."""
    if version == 0:
        return 0  # no shared memory at all
    # q_s[GROUP][D], max_s[GROUP][warps], sum_s[GROUP][warps]
    return 4 * GROUPS[version] * (head_size + 2 * (NUM_THREADS // 32))


def dynamic_smem(version: int, max_len: int, block_size: int, head_size: int,
                 group: int = 1) -> int:
    """Bytes of dynamic shared memory of a version's main kernel: the logits of the tokens
    one block covers (all of the longest sequence's in v1/v3, one partition's in v2/v4), for
    each of its heads (1, or up to GQA_GROUP of the `group` = H / Hkv heads in v3/v4); at
    least NUM_WARPS * D floats per head, as the buffer then holds the warps' partial outputs."""
    if version == 0:
        return 0
    tokens = cdiv(max_len, block_size) * block_size if version in (1, 3) else PARTITION_SIZE
    return min(group, GROUPS[version]) * max(tokens, NUM_THREADS // 32 * head_size) * 4


def fits_smem(version: int, max_len: int, block_size: int, head_size: int, group: int,
              smem_limit: int) -> bool:
    """A version's static and dynamic shared memory together fit within ``smem_limit``."""
    return (static_smem(version, head_size)
            + dynamic_smem(version, max_len, block_size, head_size, group)) <= smem_limit


def choose_version(num_seqs: int, num_heads: int, num_kv_heads: int, max_len: int,
                   block_size: int, head_size: int, smem_limit: int = SMEM_LIMIT_SM90) -> int:
    """The grouped versions (3, 4) whenever H > Hkv, else 1 or 2; then vLLM's rule (above),
    whose comment gives the reasons: one partition needs no reduce, many sequences or heads
    give the GPU enough work, above 8192 tokens the logits would crowd shared memory. vLLM counts
    S * H blocks, as v1 has; v3 has S * Hkv * ceil(G / GQA_GROUP). Here the single pass is
    also refused whenever its shared memory would not fit."""
    group = num_heads // num_kv_heads
    grouped = group > 1
    single, partitioned = (3, 4) if grouped else (1, 2)
    blocks = num_seqs * (num_kv_heads * cdiv(group, kernels.GQA_GROUP) if grouped else num_heads)
    use_single = max_len <= SINGLE_PASS_MAX_LEN and (
        cdiv(max_len, PARTITION_SIZE) == 1 or blocks > SINGLE_PASS_MIN_BLOCKS)
    if use_single and not fits_smem(single, max_len, block_size, head_size, group, smem_limit):
        use_single = False
    return single if use_single else partitioned


@dataclass(frozen=True)
class AttentionLaunch:
    """Everything both runners need to launch one paged attention call."""

    dtype: str
    num_seqs: int        # S
    num_heads: int       # H
    num_kv_heads: int    # Hkv
    head_size: int       # D
    block_size: int      # BS
    max_blocks: int      # MB
    version: int
    max_partitions: int  # P (partitioned versions), 1 otherwise
    smem: int            # dynamic shared memory of the main kernel, bytes
    reduce_smem: int     # the reduce kernel's (partitioned versions), bytes
    scale: float

    @property
    def partitioned(self) -> bool:
        return self.version in (2, 4)

    @property
    def chunks(self) -> list[tuple[int, int]]:
        """Sequence ranges [start, stop) of at most MAX_GRID_YZ rows: one launch each."""
        return [(a, min(a + MAX_GRID_YZ, self.num_seqs))
                for a in range(0, self.num_seqs, MAX_GRID_YZ)]

    def grid(self, rows: int) -> tuple[int, int, int]:
        """The main kernel's grid for a chunk of `rows` sequences: v0 one thread per row of
        rows * H (x only); the others (Hkv * ceil(G / GROUP), rows, P): (H, rows, P) for
        v1, v2 (GROUP = 1), one block per KV head and 8 query heads for v3, v4."""
        if self.version == 0:
            return (cdiv(rows * self.num_heads, NUM_THREADS), 1, 1)
        group = self.num_heads // self.num_kv_heads
        return (self.num_kv_heads * cdiv(group, GROUPS[self.version]), rows,
                self.max_partitions)


def check_paged_attention(query, key_cache, value_cache, block_tables, seq_lens, *, scale,
                          version, backend) -> AttentionLaunch:
    """Validate everything the kernel will trust; choose the version; return the geometry.

    ``version``: None chooses (choose_version), or an int in kernels.VERSIONS forces one. Raises
    ValueError / TypeError naming the argument, its value and what was expected."""
    if version is not None:
        version = check_choice("version", check_int("version", version), kernels.VERSIONS)
    check_types(backend, key_cache=key_cache, value_cache=value_cache, query=query,
                block_tables=block_tables, seq_lens=seq_lens)
    # the NumPy paged attention's checks, in its order and with its messages
    kc, vc, q = host_view(key_cache), host_view(value_cache), host_view(query)
    check_caches(kc, vc)
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        check_float_dtype(name, c)  # the compiled dtypes (NumPy also takes float64)
        if not c.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous (the one cache layout "
                             "[NB, Hkv, BS, D]); got a strided view")
        _check_aligned(name, c)
    nb, hkv, bs, d = kc.shape
    if min(nb, hkv, bs, d) < 1:
        raise ValueError(f"key_cache.shape={kc.shape} has an empty dimension")
    if d not in kernels.HEAD_SIZES:
        raise ValueError(f"head size D={d} has no compiled kernel; built for "
                         f"{kernels.HEAD_SIZES}")
    if bs not in kernels.BLOCK_SIZES:
        raise ValueError(f"block size BS={bs} (key_cache.shape[2]) has no compiled kernel; "
                         f"built for {kernels.BLOCK_SIZES}")
    check_query(q, kc, None, "S")
    check_contiguous("query", query)
    s, h, _ = q.shape
    _, lens = check_block_tables(to_host(block_tables), to_host(seq_lens), s, nb, bs)
    check_scale(scale)
    # what only the kernels need: int32, contiguous metadata (NumPy accepts any integers)
    for name, a in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        check_int_dtype(name, a, ("int32",))
        check_contiguous(name, a)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    max_len = int(lens.max()) if s else 0
    smem_limit = SMEM_LIMIT_SM90
    if backend == "cupy":
        from minipaged.cuda import cupy_runner

        smem_limit = cupy_runner.smem_limit()
    if version is None:
        version = choose_version(s, h, hkv, max_len, bs, d, smem_limit) if s else 1
    partitioned = version in (2, 4)
    partitions = cdiv(max_len, PARTITION_SIZE) if partitioned else 1
    if partitions > MAX_GRID_YZ:
        raise ValueError(f"seq_lens up to {max_len} make {partitions} partitions of "
                         f"{PARTITION_SIZE} tokens; gridDim.z allows at most {MAX_GRID_YZ}")
    smem = dynamic_smem(version, max_len, bs, d, h // hkv)
    needed = static_smem(version, d) + smem
    if needed > smem_limit:
        raise ValueError(
            f"version={version} keeps every logit of the longest sequence (seq_lens up to "
            f"{max_len}) in shared memory: {needed} bytes with its static arrays, above the "
            f"{smem_limit} a thread block may use; use version={version + 1} (partitions of "
            f"{PARTITION_SIZE} tokens) or version=None")
    return AttentionLaunch(check_float_dtype("query", query), s, h, hkv, d, bs,
                           int(block_tables.shape[1]), version, partitions, smem,
                           partitions * 4 if partitioned else 0, scale)
