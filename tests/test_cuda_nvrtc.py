"""The GPU build proved without a GPU: CuPy's own compiler (NVRTC) compiles every instantiation.

backend="cupy" never sees nvcc: CuPy compiles the kernel text with NVRTC, with its own options
and the name expressions of cupy_runner.py. test_cuda_nvcc.py proves nvcc accepts the source;
this proves the compiler the GPU path really uses does, for an sm_90 device (H100/H200): every
name expression compiles, is lowered to a mangled symbol, and lands in a cubin (ptxas ran).

Why CuPy's private ``cupy.cuda.compiler._NVRTCProgram``: on a machine without a CUDA driver,
``cupy.RawModule`` and ``compile_using_nvrtc`` ask the driver for the current device before
they compile, and fail; ``_NVRTCProgram`` is the class both end up in, and needs only the NVRTC
library. Private API can change in any release, so the CuPy version is pinned in pyproject.toml
and checked in minipaged/cuda/report.py (CUPY_VERSION); the options are derived from CuPy's own
rules there (nvrtc_options).
"""

from __future__ import annotations

import pytest

from minipaged.cuda import checks, kernels, report

pytestmark = pytest.mark.requires("nvrtc")


@pytest.fixture(scope="module")
def stats():
    """ptxas' report for every kernel, compiled module by module as cupy_runner does."""
    return {k.name: k for k in report.kernel_stats("90")}


def test_options_are_cupys_for_sm90():
    options, method = report.nvrtc_options("90")
    assert options[:4] == ("-std=c++17", "-ftz=true", "-arch=sm_90",
                           "--device-as-default-execution-space")
    assert method == "cubin"  # sm_90 is within NVRTC 12's range: real machine code


@pytest.mark.parametrize("names", report.modules(), ids=lambda n: next(iter(n.values())))
def test_every_instantiation_compiles_and_lowers(names):
    binary, mapping, _ = report.compile_program(kernels.source(), list(names.values()))
    assert set(mapping) == set(names.values())
    for name, lowered in mapping.items():
        assert lowered.startswith("_ZN2mp"), (name, lowered)
        assert lowered.encode() in binary, f"{name} is not in the cubin"


def test_no_kernel_spills_under_nvrtc(stats):
    assert len(stats) == len(kernels.kernel_names())
    spilled = {n: (k.spill_stores, k.spill_loads, k.stack) for n, k in stats.items()
               if k.spill_stores or k.spill_loads or k.stack}
    assert not spilled, f"spills (stores, loads, stack bytes): {spilled}"


def test_static_shared_memory_is_what_the_launcher_assumes(stats):
    # checks.static_smem decides whether a launch fits (and the automatic choice); it must be
    # what the compiler really allocates, for every instantiation
    for dtype, d, bs in kernels.ALL_INSTANTIATIONS:
        for key, name in kernels.attention_names(dtype, d, bs).items():
            if key == "reduce":
                assert stats[name].smem == 0
            else:
                assert stats[name].smem == checks.static_smem(int(key[1:]), d), name


def test_a_host_header_is_refused():
    # the negative control: NVRTC has no system headers (which is why common.cuh defines its
    # own __half), so a kernel that includes one must fail to compile, not pass by accident
    from cupy.cuda.compiler import CompileException

    bad = "#include <vector>\n" + kernels.source()
    names = list(kernels.attention_names("float16", 128, 16).values())
    with pytest.raises(CompileException, match=r"vector"):
        report.compile_program(bad, names)
