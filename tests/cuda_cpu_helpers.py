"""What the CPU-harness kernel tests share: the package's NumPy paged attention as their oracle.

tests/test_cuda_cpu.py compares the kernels' outputs with it, and tests/test_cuda_cpu_errors.py
the kernels' error messages with its own (the ``library`` fixture both use, the harness, is in
tests/conftest.py).
"""

from __future__ import annotations

import importlib.util


def _numpy_oracle():
    """The package's NumPy paged_attention, once that module provides it."""
    if importlib.util.find_spec("minipaged.paged.paged_attention") is None:
        return None
    try:
        from minipaged.paged.paged_attention import paged_attention
    except ImportError:
        return None
    return paged_attention
