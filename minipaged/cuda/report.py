"""Registers, spills and shared memory of every kernel, from the compiler the GPU path uses.

What it teaches: how many registers a kernel needs decides how many of its blocks an SM can
hold (occupancy), and a spill (a value the compiler could not keep in a register, sent to slow
local memory) costs bandwidth a decode kernel cannot spare. backend="cupy" compiles with NVRTC,
CuPy's runtime compiler, not nvcc, so this asks NVRTC: the same source text (kernels.source()),
the same name expressions as cupy_runner.py, one program per module as cupy_runner compiles
them, and the options CuPy passes for an sm_90 device (nvrtc_options), plus ``-Xptxas=-v`` for
ptxas' per-kernel report. No GPU is needed: NVRTC is a library.

    python -m minipaged.cuda.report [--arch 90]

Needs ``cupy-cuda12x`` and ``nvidia-cuda-nvrtc-cu12`` (the test extra pins both). Uses CuPy's
private ``cupy.cuda.compiler._NVRTCProgram``: on a machine without a CUDA driver it is the only
entry point that gets as far as NVRTC (RawModule and compile_using_nvrtc ask the driver for the
device first), so CuPy's version is pinned (CUPY_VERSION) and checked before use.
Read next: gpu_check.py.
"""

from __future__ import annotations

import io
import re
import sys
from dataclasses import dataclass

from minipaged._checks import cdiv
from minipaged._install import TEST_STEPS
from minipaged.cuda import kernels

CUPY_VERSION = "14.2.0"  # the version whose private compiler API this module was written for


@dataclass(frozen=True)
class KernelStats:
    name: str           # C++ name expression
    registers: int      # per thread
    spill_stores: int   # bytes
    spill_loads: int    # bytes
    stack: int          # bytes of stack frame (local memory)
    smem: int           # bytes of static shared memory

    def blocks_per_sm(self) -> int:
        """Theoretical resident blocks of NUM_THREADS threads per SM on sm_90, before any
        dynamic shared memory: 64K registers (allocated per warp in units of 256), 228 KiB of
        shared memory (1 KiB of it reserved per block), 2048 threads, 32 blocks (CUDA C++
        Programming Guide, compute capability 9.0)."""
        threads = kernels.NUM_THREADS
        regs_per_warp = cdiv(self.registers * 32, 256) * 256
        by_regs = 65536 // max(1, regs_per_warp * cdiv(threads, 32))
        by_smem = (228 * 1024) // (self.smem + 1024)
        return min(by_regs, by_smem, 2048 // threads, 32)


def modules() -> list[dict[str, str]]:
    """The name-expression groups cupy_runner.py compiles: one per (dtype, D, BS), one per
    dtype for the cache kernels."""
    out = [kernels.attention_names(*inst) for inst in kernels.ALL_INSTANTIATIONS]
    return out + [kernels.cache_names(dt) for dt in kernels.DTYPES]


def nvrtc_options(arch: str = "90") -> tuple[tuple[str, ...], str]:
    """(options, method) exactly as CuPy builds them for a RawModule with options=("-std=c++17",)
    on a device of compute capability `arch` (cupy/cuda/compiler.py: _compile_with_cache_cuda
    adds -ftz=true; _compile_using_nvrtc_no_warning adds the arch option, which also decides
    cubin or PTX, --device-as-default-execution-space, and --pch for NVRTC >= 12.8 when CuPy's
    precompiled headers are switched on, which they are not by default)."""
    import cupy
    from cupy.cuda import compiler

    if cupy.__version__ != CUPY_VERSION:
        raise RuntimeError(f"CuPy {cupy.__version__} is installed; this report drives CuPy "
                           f"{CUPY_VERSION}'s private compiler API ({TEST_STEPS})")
    # _get_arch_for_options_for_nvrtc's rule, written out: that function is memoized per
    # device and so asks for one. sm_XX (a cubin, ptxas run now) when NVRTC knows the arch.
    if not compiler._use_ptx and int(arch) <= int(compiler._get_max_compute_capability()):
        arch_option, method = f"-arch=sm_{arch}", "cubin"
    else:
        arch_option, method = f"-arch=compute_{arch}", "ptx"
    options = ("-std=c++17", "-ftz=true", arch_option, "--device-as-default-execution-space")
    major, minor = compiler._get_nvrtc_version()
    if (major, minor) >= (12, 8) and compiler._use_pch:
        options += ("--pch",)
    return options, method


def compile_program(source: str, names: list[str], arch: str = "90",
                    extra: tuple[str, ...] = ()) -> tuple[bytes, dict[str, str], str]:
    """(binary, {name expression: lowered name}, compiler log) from CuPy's NVRTC program.
    Raises cupy.cuda.compiler.CompileException when NVRTC rejects the source."""
    from cupy.cuda import compiler

    options, method = nvrtc_options(arch)
    program = compiler._NVRTCProgram(source, "minipaged.cu", name_expressions=names,
                                     method=method)
    log = io.StringIO()
    binary, mapping = program.compile(options + extra, log)
    return binary, mapping, log.getvalue()


_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?, (\d+) bytes smem)?")


def parse_ptxas(log: str, mapping: dict[str, str]) -> list[KernelStats]:
    """ptxas' -v report (one block of lines per entry function) as KernelStats."""
    by_lowered = {low: name for name, low in mapping.items()}
    stats, current, frame = [], None, (0, 0, 0)
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            current = m.group(1)
        elif (m := _FRAME.search(line)) and current:
            frame = tuple(int(x) for x in m.groups())
        elif (m := _USED.search(line)) and current:
            stats.append(KernelStats(by_lowered.get(current, current), int(m.group(1)),
                                     frame[1], frame[2], frame[0], int(m.group(2) or 0)))
            current, frame = None, (0, 0, 0)
    return stats


def kernel_stats(arch: str = "90", groups: list[dict[str, str]] | None = None
                 ) -> list[KernelStats]:
    """Every kernel instantiation (or those of `groups`), compiled as the GPU runner does."""
    out: dict[str, KernelStats] = {}
    for names in modules() if groups is None else groups:
        _, mapping, log = compile_program(kernels.source(), list(names.values()), arch,
                                          extra=("-Xptxas=-v",))
        for k in parse_ptxas(log, mapping):
            out.setdefault(k.name, k)  # the reduce kernel is in every BS's module: once
    return list(out.values())


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    arch = args[1] if args[:1] == ["--arch"] and len(args) == 2 else "90"
    try:
        import cupy  # noqa: F401
        from cupy_backends.cuda.libs import nvrtc

        version = nvrtc.getVersion()
    except Exception as e:  # noqa: BLE001 - no CuPy, no NVRTC library: say which, exit 3
        print(f"report: needs CuPy {CUPY_VERSION} and NVRTC ({TEST_STEPS}): "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        return 3
    options, _ = nvrtc_options(arch)
    print(f"NVRTC {version[0]}.{version[1]} via CuPy {CUPY_VERSION}, options {' '.join(options)}")
    print("blocks/SM: theoretical, with no dynamic shared memory (the logits come on top)")
    print(f"{'kernel':72} {'regs':>4} {'spill B':>7} {'smem B':>6} {'blocks/SM':>9}")
    for k in kernel_stats(arch):
        print(f"{k.name:72} {k.registers:4d} {k.spill_stores + k.spill_loads:7d} {k.smem:6d} "
              f"{k.blocks_per_sm():9d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
