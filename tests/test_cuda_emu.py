"""The CPU emulation of CUDA's execution model (minipaged/cuda/emu/) catches kernel bugs.

Each kernel in minipaged/cuda/emu/broken_kernels.cu has one bug that would hang or corrupt a real
GPU. The harness must report it as a KernelError naming the kind of bug and the call site,
never hang and never crash; and the correct kernel (which = 0) must compute the right sum.
"""

from __future__ import annotations

import numpy as np
import pytest
from capabilities import require

from minipaged.cuda.emu import cpu_build
from minipaged.cuda.emu.cpu_build import KernelError

pytestmark = pytest.mark.requires("cuda-cpu")


@pytest.fixture(scope="module")
def lib():
    try:
        return cpu_build.load()
    except cpu_build.CompilerNotFoundError as e:
        require("cuda-cpu", why=str(e))


def run(lib, which: int, threads: int = 128) -> np.ndarray:
    out = np.zeros(2, np.float32)
    cpu_build.check(lib, lib.mp_broken(which, threads, out.ctypes.data))
    return out


@pytest.mark.parametrize("threads", [32, 64, 128, 1024])
def test_correct_kernel_sums_every_thread(lib, threads):
    # each thread contributes tid + 1: warp shuffles, shared memory and a barrier all in play;
    # the grid has two blocks, each writes its own total
    assert np.array_equal(run(lib, 0, threads), [threads * (threads + 1) / 2] * 2)


BUGS = [
    (1, r"deadlock: thread \d+ waits at __syncthreads\(\) at broken_kernels.cu:\d+ while thread "
        r"\d+ waits at broken_kernels.cu:\d+ \(threads waiting at different barriers\)"),
    (2, r"divergent shuffle in warp 0: lane 16 is at broken_kernels.cu:\d+ while lane 15 waits "
        r"at broken_kernels.cu:\d+"),
    (3, r"thread 127 exited while thread \d+ waits at __syncthreads\(\)"),
    (4, r"deadlock: no thread can proceed; 112 thread\(s\) wait at __syncthreads\(\) .*"
        r"16 thread\(s\) wait at a shuffle at broken_kernels.cu:\d+ \(threads 48..63\)"),
    (5, r"thread 0: shuffle at broken_kernels.cu:\d+ with mask 0xffff; the emulation supports "
        r"only full-warp shuffles"),
    (6, r"thread 0 (exited while thread \d+ waits at|.*has already exited)"),
    (7, r"lane 31 of warp 0 exited while lane \d+ waits at the shuffle"),
]


@pytest.mark.parametrize("which,message", BUGS, ids=[f"bug{b[0]}" for b in BUGS])
def test_bug_is_reported_not_hung(lib, which, message):
    with pytest.raises(KernelError, match=r"^block \(0,0,0\): " + message):
        run(lib, which)
    # the harness is usable again after a failed launch
    assert run(lib, 0)[0] == 128 * 129 / 2


def test_too_many_threads_is_an_error(lib):
    with pytest.raises(KernelError, match=r"blockDim has 1025 threads; CUDA allows 1 to 1024"):
        run(lib, 0, 1025)


def test_trace_records_which_warp_reads_which_block(lib):
    # lesson 08 prints this trace: warps take logical KV blocks in turn (warp w: w, w+4, ...)
    from minipaged.cuda import launch

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, 64)).astype(np.float32)
    kc = rng.standard_normal((10, 1, 16, 64)).astype(np.float32)
    tables = rng.permutation(10)[None, :].astype(np.int32)
    lens = np.array([150], np.int32)  # 10 logical blocks
    with cpu_build.tracing() as events:
        launch.paged_attention(q, kc, kc, tables, lens)
    reads = {}
    for e in events:
        if e.what == "warp reads K of logical block":
            reads.setdefault(e.thread // 32, set()).add(e.value)
    assert reads == {w: set(range(w, 10, 4)) for w in range(4)}
    # lane 0 of each of the 4 warps reports each of the kernel's 5 barriers (query loaded, max,
    # sums, logits done, partial outputs posted)
    barriers = [e for e in events if e.what == "__syncthreads()"]
    assert len(barriers) == 4 * 5 and {e.thread for e in barriers} == {0, 32, 64, 96}
    # BS=16: two lanes per token, so one shuffle step (xor 1) per KV block for the dot product
    dot_shuffles = [e for e in events if e.what == "__shfl_xor_sync" and e.thread == 0
                    and e.value == 1]
    assert len(dot_shuffles) == len(range(0, 10, 4)) + 2  # + the max and sum reductions' last step
    # and nothing is recorded once the block ends
    launch.paged_attention(q, kc, kc, tables, lens)
    assert lib.mp_trace_count() == 0
