"""Build the .cu kernels with g++ against cuda_emu.h, cache the library, load it with ctypes.

What it teaches: that a CUDA kernel is just C++ with a particular execution model. The same
text that NVRTC compiles for the GPU (minipaged/cuda/cupy_runner.py) is compiled here by an
ordinary C++20 compiler; cuda_emu.h supplies threadIdx, __syncthreads(), shuffles, __half and a
launcher that runs every CUDA thread as a fiber. Read cuda_emu.h for the model and its limits.
This folder (minipaged/cuda/emu/) is the harness: a tool that runs the lesson, not the lesson.

The library is built once per source text: its file name is the SHA-256 of the sources, the
generated wrapper, the compiler's version and the flags, under a per-user cache directory
(``$MINIPAGED_CACHE_DIR``, else ``$XDG_CACHE_HOME/minipaged``, else ``~/.cache/minipaged``).
Editing a kernel changes the hash, so a stale build is never loaded. Builds are written to a
temporary name and renamed into place, so concurrent test processes cannot load half a file.

Build variants:
    sanitize=True   AddressSanitizer + UndefinedBehaviorSanitizer (-O0 -g). Needs the ASan
                    runtime loaded first in the process: run Python under
                    ``LD_PRELOAD=$(g++ -print-file-name=libasan.so)`` (see sanitize_env()).
                    MINIPAGED_SANITIZE=1 makes load() return this build.
    ucontext=True   use the portable ucontext fiber switch instead of the x86-64 one.
    extra_sources   more .cu files compiled into the library (the sanitizer test adds one with
                    a deliberate bug, tests/cuda/planted_oob.cu, to prove ASan is watching).
Read next: minipaged/cuda/cpu_runner.py (the runner that calls into this library).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from minipaged.cuda.emu.wrappers import symbol, wrapper_sources
from minipaged.cuda.kernels import (
    ALL_INSTANTIATIONS,
    CUDA_DIR,
    DTYPES,
    KERNEL_FILES,
    Instantiation,
)

EMU_DIR = Path(__file__).resolve().parent
SOURCES = (EMU_DIR / "emu_fibers.h", EMU_DIR / "emu_half.h", EMU_DIR / "cuda_emu.h",
           EMU_DIR / "broken_kernels.cu", CUDA_DIR / "common.cuh",
           *(CUDA_DIR / name for name in KERNEL_FILES))


class CompilerNotFoundError(RuntimeError):
    """No C++20 compiler: the CPU harness cannot be built (set CXX to one)."""


class BuildError(RuntimeError):
    """The compiler rejected the sources; the message holds its diagnostics."""


def cache_dir() -> Path:
    """The per-user directory where built libraries are kept."""
    if os.environ.get("MINIPAGED_CACHE_DIR"):
        base = Path(os.environ["MINIPAGED_CACHE_DIR"])
    elif os.environ.get("XDG_CACHE_HOME"):
        base = Path(os.environ["XDG_CACHE_HOME"]) / "minipaged"
    else:
        base = Path.home() / ".cache" / "minipaged"
    return base / "cuda-cpu"


@functools.cache
def compiler() -> tuple[str, str]:
    """(path, version line) of a C++ compiler that accepts -std=c++20, or raise."""
    candidates = [os.environ["CXX"]] if os.environ.get("CXX") else ["g++", "clang++", "c++"]
    tried = []
    for name in candidates:
        path = shutil.which(name)
        if path is None:
            tried.append(f"{name} (not on PATH)")
            continue
        probe = subprocess.run([path, "-std=c++20", "-x", "c++", "-fsyntax-only", "-"],
                               input="#include <version>\nint main() { return 0; }\n",
                               capture_output=True, text=True)
        if probe.returncode != 0:
            tried.append(f"{path} (rejects -std=c++20)")
            continue
        version = subprocess.run([path, "--version"], capture_output=True, text=True)
        return path, version.stdout.splitlines()[0] if version.stdout else name
    raise CompilerNotFoundError(
        "the CPU CUDA harness needs a C++20 compiler (g++ >= 10 or clang++ >= 10); tried "
        + ", ".join(tried) + ". Install one or set CXX to its path.")


def have_compiler() -> bool:
    try:
        compiler()
    except CompilerNotFoundError:
        return False
    return True


def _flags(sanitize: bool, ucontext: bool) -> list[str]:
    flags = ["-std=c++20", "-shared", "-fPIC", "-fno-exceptions", "-ffp-contract=off",
             "-fvisibility=hidden", "-w"]
    # -fvisibility=hidden: only the extern "C" entry points (marked default) are exported
    if sanitize:
        # -O0: the sanitizers' instrumentation makes -O1 builds take 5x longer to compile
        flags += ["-O0", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                  "-fno-omit-frame-pointer"]
    else:
        flags += ["-O2"]
    if ucontext:
        flags.append("-DEMU_FORCE_UCONTEXT")
    return flags


def library_path(*, sanitize: bool = False, ucontext: bool = False,
                 instantiations: tuple[Instantiation, ...] = ALL_INSTANTIATIONS,
                 extra_sources: tuple[Path, ...] = ()) -> Path:
    """Build (if not cached) and return the path of the shared library for this variant."""
    cxx, version = compiler()
    flags = _flags(sanitize, ucontext)
    h = hashlib.sha256()
    for path in (*SOURCES, *extra_sources):
        h.update(Path(path).name.encode() + b"\0" + Path(path).read_bytes() + b"\0")
    parts = max(1, min(4, os.cpu_count() or 1))
    units = wrapper_sources(instantiations, parts=parts, extra_sources=extra_sources)
    for text in units:
        h.update(text.encode() + b"\0")
    h.update(version.encode() + b"\0" + " ".join(flags).encode())
    target = cache_dir() / f"mp_kernels_{h.hexdigest()[:20]}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        objs, procs = [], []
        for i, text in enumerate(units):  # compile the parts in parallel, then link
            src, obj = Path(tmp) / f"part{i}.cpp", Path(tmp) / f"part{i}.o"
            src.write_text(text)
            cmd = [cxx, *flags, "-c", "-I", str(CUDA_DIR), "-I", str(EMU_DIR), str(src), "-o",
                   str(obj)]
            procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, text=True)))
            objs.append(str(obj))
        for cmd, proc in procs:
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise BuildError(f"building the CPU harness failed ({' '.join(cmd)}):\n"
                                 + err[-4000:])
        tmp_lib = Path(tmp) / target.name
        cmd = [cxx, *flags, *objs, "-o", str(tmp_lib)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise BuildError(f"linking the CPU harness failed ({' '.join(cmd)}):\n"
                             + proc.stderr[-4000:])
        os.replace(tmp_lib, target)  # atomic: another process sees the old state or the new
    return target


_VP, _I, _LL, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_float


def sanitizing() -> bool:
    """True when MINIPAGED_SANITIZE=1: load() then returns the ASan + UBSan build."""
    return os.environ.get("MINIPAGED_SANITIZE", "") == "1"


def load(*, ucontext: bool = False,
         instantiations: tuple[Instantiation, ...] = ALL_INSTANTIATIONS,
         extra_sources: tuple[Path, ...] = ()) -> ctypes.CDLL:
    """The loaded library (built on first use), with argument types declared. The sanitizer
    build when MINIPAGED_SANITIZE=1 (run the process under sanitize_env())."""
    return _load(sanitizing(), ucontext, instantiations, tuple(extra_sources))


@functools.cache
def _load(sanitize: bool, ucontext: bool, instantiations: tuple[Instantiation, ...],
          extra_sources: tuple[Path, ...]) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(library_path(sanitize=sanitize, ucontext=ucontext,
                                       instantiations=instantiations,
                                       extra_sources=extra_sources)))
    lib.mp_last_error.restype = ctypes.c_char_p
    lib.mp_trace_start.argtypes = [_LL]
    lib.mp_trace_count.restype = _LL
    lib.mp_trace_get.argtypes = [_LL, ctypes.POINTER(_I), ctypes.POINTER(_LL),
                                 ctypes.POINTER(ctypes.c_char_p)]
    lib.mp_float_to_half.argtypes = [_VP, _VP, _LL]
    lib.mp_half_to_float.argtypes = [_VP, _VP, _LL]
    lib.mp_broken.argtypes = [_I, _I, _VP]
    for dtype, d, bs in instantiations:
        fn = getattr(lib, symbol("paged_attention", dtype, d, bs))
        fn.argtypes = [_I, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP,
                       _I, _I, _I, _I, _I, _I, _I, _I, _LL, _LL, _F]
    for dtype in DTYPES:
        getattr(lib, symbol("reshape_and_cache", dtype)).argtypes = [
            _VP, _VP, _VP, _VP, _VP, _I, _I, _I, _I, _I]
        getattr(lib, symbol("copy_blocks", dtype)).argtypes = [_VP, _VP, _VP, _I, _I, _I]
    return lib


class TraceEvent(NamedTuple):
    """One thing a thread did, in the order the harness ran it (see tracing())."""

    block: tuple[int, int, int]  # blockIdx (x, y, z)
    thread: int                  # threadIdx.x (warp = thread // 32)
    line: int                    # source line
    what: str                    # "__syncthreads()", "__shfl_xor_sync", or an MP_TRACE label
    value: int                   # the MP_TRACE value (a shuffle's lane argument)


@contextlib.contextmanager
def tracing(capacity: int = 100_000) -> Iterator[list[TraceEvent]]:
    """Record what the threads do during the launches inside the ``with`` block: MP_TRACE
    points in the kernels (by every thread that reaches them) and, from lane 0 of each warp,
    every barrier and shuffle. The list is filled when the block ends."""
    lib = load()
    events: list[TraceEvent] = []
    lib.mp_trace_start(capacity)
    try:
        yield events
    finally:
        ints = (ctypes.c_int * 5)()
        value, what = ctypes.c_longlong(), ctypes.c_char_p()
        for i in range(lib.mp_trace_count()):
            lib.mp_trace_get(i, ints, ctypes.byref(value), ctypes.byref(what))
            events.append(TraceEvent((ints[0], ints[1], ints[2]), ints[3], ints[4],
                                     what.value.decode(), value.value))
        lib.mp_trace_start(0)


class KernelError(RuntimeError):
    """The emulation caught a bug in a kernel (deadlock, divergent shuffle, early exit)."""


def check(lib: ctypes.CDLL, rc: int) -> None:
    """Turn a launch's return code into an exception carrying the harness's diagnosis."""
    if rc != 0:
        raise KernelError(lib.mp_last_error().decode())


def sanitize_env() -> dict[str, str]:
    """Environment for a Python process that loads the sanitizer build: the ASan runtime must be
    the first library in the process, so it is preloaded; leak checking is off (the Python
    interpreter itself never frees some objects)."""
    cxx, _ = compiler()
    # (MINIPAGED_SANITIZE=1 is set too, so that load() picks the sanitizer build)
    libasan = subprocess.run([cxx, "-print-file-name=libasan.so"], capture_output=True,
                             text=True).stdout.strip()
    env = dict(os.environ)
    env["LD_PRELOAD"] = libasan
    env["MINIPAGED_SANITIZE"] = "1"
    env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=0:halt_on_error=1"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
    return env
