"""Every kernel instantiation compiles to PTX with nvcc for sm_80 (A100) and sm_90 (H100/H200).

Compile only (no GPU needed). One nvcc run per target instantiates every kernel at once
(kernels.nvcc_source()); the runs go in parallel. A third run compiles the branch of
common.cuh that NVRTC (CuPy) takes, with its own two-instruction __half, so that the GPU
runner's source is checked here too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import pytest

from minipaged.cuda import kernels

pytestmark = pytest.mark.requires("nvcc")

TARGETS = [("sm_80", []), ("sm_90", []), ("sm_90", ["-DMP_OWN_HALF"])]


@pytest.fixture(scope="module")
def ptx(tmp_path_factory):
    """{(arch, extra flags): (returncode, stderr, ptx text)}, compiled in parallel."""
    tmp = tmp_path_factory.mktemp("ptx")
    src = tmp / "every_kernel.cu"
    src.write_text(kernels.nvcc_source())
    nvcc = shutil.which("nvcc")
    procs = {}
    t0 = time.perf_counter()
    for arch, extra in TARGETS:
        out = tmp / f"{arch}{''.join(extra)}.ptx"
        cmd = [nvcc, "-ptx", f"-arch={arch}", "-std=c++17", *extra, "-I",
               str(kernels.CUDA_DIR), str(src), "-o", str(out)]
        procs[(arch, tuple(extra))] = (out, subprocess.Popen(cmd, stderr=subprocess.PIPE,
                                                             text=True))
    results = {}
    for key, (out, proc) in procs.items():
        _, err = proc.communicate()
        results[key] = (proc.returncode, err, out.read_text() if out.exists() else "")
    print(f"nvcc -ptx, {len(TARGETS)} targets in parallel: {time.perf_counter() - t0:.1f} s")
    return results


@pytest.mark.parametrize("arch,extra", TARGETS,
                         ids=[a + ("-own-half" if e else "") for a, e in TARGETS])
def test_every_instantiation_compiles(ptx, arch, extra):
    rc, err, text = ptx[(arch, tuple(extra))]
    assert rc == 0, f"nvcc -arch={arch} {' '.join(extra)} failed:\n{err[-4000:]}"
    assert f".target {arch}" in text
    entries = re.findall(r"\.entry\s+(\w+)\(", text)
    names = kernels.kernel_names()
    assert len(entries) == len(names)
    # every template instantiation is there: kernel name and its numeric template arguments
    for name in names:
        base = name.split("<")[0].split("::")[1]
        numbers = re.findall(r"\b\d+\b", name.split("<", 1)[1])
        mangled = "".join(f"Li{n}E" for n in numbers)
        assert any(base in e and mangled in e for e in entries), f"{name} missing from PTX"


def test_no_kernel_uses_local_memory_arrays(ptx):
    # per-thread arrays (acc[] of the value pass) must be indexed with compile-time indices so
    # they live in registers; a .local array would be slow off-chip memory
    _, _, text = ptx[("sm_90", ())]
    assert ".local" not in text


def _expected_key_load_bytes(dtype: str, d: int, bs: int) -> int:
    """paged_attention.cu's VEC in bytes: 16, or a thread group's share of one key row when
    that is smaller (only D=16 fp16 with BS=8: 4 lanes x 8 bytes per 32-byte row)."""
    itemsize = 2 if dtype == "float16" else 4
    group = max(1, 32 // bs)
    return min(16, d // group * itemsize)


def test_keys_are_read_with_vector_loads(ptx):
    # the Vec<scalar_t, VEC> loads of paged_attention.cu must reach the PTX as vector loads
    # (ld.global[.nc].v4.f32 / .v4.u32 for 16 bytes, .v4.u16 for 8), or each lane would fetch
    # 2-4 bytes at a time; the widest load of each kernel is its key load
    _, _, text = ptx[("sm_90", ())]
    bodies = dict(re.findall(r"\.entry\s+(\w+)\((.*?)\n}\n", text, flags=re.S))
    block_kernels = ("paged_attention_kernel",)  # versions 1-4
    attention = {n: b for n, b in bodies.items() if any(k in n for k in block_kernels)}
    assert len(attention) == 4 * len(kernels.ALL_INSTANTIATIONS)
    checked = 0
    for dtype, d, bs in kernels.ALL_INSTANTIATIONS:
        t = "6__half" if dtype == "float16" else "f"
        for name, body in attention.items():
            if not any(f"{k}I{t}Li{d}ELi{bs}ELi" in name for k in block_kernels):
                continue
            loads = re.findall(r"ld\.global(?:\.nc)?\.v(\d)\.[a-z]+(\d+)", body)
            widest = max((int(n) * int(bits) // 8 for n, bits in loads), default=0)
            assert widest == _expected_key_load_bytes(dtype, d, bs), \
                f"{name}: widest vector load {widest} bytes"
            checked += 1
    assert checked == len(attention)
