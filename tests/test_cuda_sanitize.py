"""The kernel test matrix under AddressSanitizer + UndefinedBehaviorSanitizer: zero reports.

The CPU harness is rebuilt with -fsanitize=address,undefined (emu/cpu_build.py, sanitize=True;
the fiber switches are announced to ASan with __sanitizer_start/finish_switch_fiber) and the
tests of test_cuda_cpu.py, test_cuda_cpu_errors.py and test_cuda_emu.py run again in a child
process that preloads the ASan runtime (a sanitized library loaded into an ordinary Python needs
it first in the process).

A sanitizer run that reports nothing proves nothing unless the sanitizer is watching: the first
test builds one more kernel into the sanitizer library, tests/cuda/planted_oob.cu (test-only
source, never in the package), whose out-of-bounds read ASan must catch.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from capabilities import require

from minipaged.cuda.emu import cpu_build

pytestmark = pytest.mark.requires("cuda-cpu")

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def env():
    try:
        env = cpu_build.sanitize_env()
    except cpu_build.CompilerNotFoundError as e:
        require("cuda-cpu", why=str(e))
    if not Path(env["LD_PRELOAD"]).is_file():
        require("cuda-cpu", why=f"the compiler has no ASan runtime ({env['LD_PRELOAD']!r})")
    # build once here (the children then find it in the cache)
    cpu_build.library_path(sanitize=True)
    cpu_build.library_path(sanitize=True, extra_sources=(PLANTED_SOURCE,))
    return env


PLANTED_SOURCE = TESTS / "cuda" / "planted_oob.cu"

PLANTED = textwrap.dedent(f"""
    import ctypes
    import numpy as np
    from minipaged.cuda import launch
    from minipaged.cuda.emu import cpu_build
    lib = cpu_build.load(extra_sources=({str(PLANTED_SOURCE)!r},))
    assert lib.mp_sanitized() == 1, "not the sanitizer build"
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    kc = rng.standard_normal((6, 2, 16, 64)).astype(np.float32)
    tables = np.array([[0, 1, 2], [3, 4, 5]], np.int32)
    lens = np.array([40, 33], np.int32)
    launch.paged_attention(q, kc, kc, tables, lens)  # the real kernels: clean
    print("real kernels clean", flush=True)
    out = np.zeros(2, np.int32)
    lib.mp_planted_oob(ctypes.c_void_p(tables.ctypes.data), 2, 3, ctypes.c_void_p(out.ctypes.data))
    print("planted bug NOT caught", flush=True)
""")


def test_planted_out_of_bounds_read_is_caught(env):
    proc = subprocess.run([sys.executable, "-c", PLANTED], env=env, capture_output=True,
                          text=True, timeout=300)
    assert "real kernels clean" in proc.stdout, proc.stderr[-3000:]
    assert "NOT caught" not in proc.stdout
    assert proc.returncode != 0
    assert "ERROR: AddressSanitizer: heap-buffer-overflow" in proc.stderr
    assert "READ of size 4" in proc.stderr
    assert "planted_oob_kernel" in proc.stderr  # the report names the guilty kernel
    assert "planted_oob.cu" in proc.stderr      # and its source line


def test_kernel_test_matrix_is_clean(env):
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
           str(TESTS / "test_cuda_cpu.py"), str(TESTS / "test_cuda_cpu_errors.py"),
           str(TESTS / "test_cuda_emu.py"),
           "-k", "not ucontext"]  # the ucontext variant would need a second sanitizer build
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900,
                          cwd=TESTS.parent)
    report = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr, report
    assert proc.returncode == 0, report
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, report
