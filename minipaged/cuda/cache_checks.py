"""What the cache kernels trust (reshape_and_cache, copy_blocks), checked before the launch.

What it teaches: the same discipline as checks.py for the two kernels that write the cache:
every slot and block index a kernel will follow is checked on the host, and so is everything
that would make their blocks race (two tokens for one slot, a block both copied from and to),
because the blocks of a launch run in no particular order. Those are the checks of the oracle,
minipaged.paged.cache_ops (check_caches, check_scatter, check_block_mapping), run here on host
views of the arrays: one mistake, one message, whichever implementation runs. What only a
kernel needs (the backend's kind of array, C-contiguous memory, a compiled dtype) comes after.
Read next: launch.py.
"""

from __future__ import annotations

import numpy as np

from minipaged.cuda import checks
from minipaged.paged.cache_ops import check_block_mapping, check_caches, check_scatter


def _check_caches(backend: str, key_cache, value_cache, **others) -> None:
    """Every array of the backend's kind; the caches pass NumPy's cache check (and, NumPy
    arrays, its writable check: a host view of a device array is read-only)."""
    checks.check_types(backend, key_cache=key_cache, value_cache=value_cache, **others)
    check_caches(checks.host_view(key_cache), checks.host_view(value_cache),
                 writable=isinstance(key_cache, np.ndarray))


def _kernel_dtype(**arrays) -> str:
    """What only the kernels need: the arrays they index C-contiguous, the caches in a compiled
    dtype (NumPy also takes float64). Returns that dtype."""
    for name, a in arrays.items():
        checks.check_contiguous(name, a)
    return checks.check_float_dtype("key_cache", arrays["key_cache"])


def check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, *,
                            backend) -> tuple[str, np.ndarray]:
    """Validate; return (dtype, the slots as int64 [T] on the host: the kernel reads that copy,
    so slot_mapping may be any integer array, as NumPy's)."""
    _check_caches(backend, key_cache, value_cache, key=key, value=value,
                  slot_mapping=slot_mapping)
    slots = check_scatter(checks.host_view(key), checks.host_view(value),
                          checks.host_view(key_cache), checks.to_host(slot_mapping))
    dtype = _kernel_dtype(key_cache=key_cache, value_cache=value_cache, key=key, value=value)
    return dtype, slots


def check_copy_blocks(key_cache, value_cache, block_mapping, *, backend) -> tuple[str, np.ndarray]:
    """Validate; return (dtype, mapping as int64 [N, 2] on the host)."""
    _check_caches(backend, key_cache, value_cache)
    nb = int(key_cache.shape[0])
    mapping = check_block_mapping(checks.to_host(block_mapping), nb, nb, "block_mapping",
                                  same_pool=True)
    dtype = _kernel_dtype(key_cache=key_cache, value_cache=value_cache)
    return dtype, np.ascontiguousarray(mapping)  # int64 already; C order, as the kernel reads it
