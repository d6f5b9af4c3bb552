"""``minipaged bench kernel``: it checks before it times, and it says so when there is no GPU."""

from __future__ import annotations

import pytest
from capabilities import have

from minipaged.kit.cli import main


@pytest.mark.requires("cuda-cpu")
def test_bench_kernel_cpu_quick(capsys):
    assert main(["bench", "kernel", "--backend", "cpu", "--quick"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "check v0 against the NumPy oracle" in out and "check v2" in out and "FAIL" not in out
    assert "KV GB/s" in out and "v4" in out
    assert "overhead: what the wrapper paged_attention() adds" in out


@pytest.mark.requires("cuda-cpu")
def test_bench_kernel_skips_a_single_pass_whose_logits_do_not_fit(capsys):
    # 8 query heads on one KV head: v3 keeps 8 x 8192 float logits (256 KiB) in shared memory,
    # more than a thread block may use; it is left out, and the other versions still run
    assert main(["bench", "kernel", "--backend", "cpu", "--quick", "--heads", "8",
                 "--kv-heads", "1", "--contexts", "8192"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "not run (v3 at 8192)" in out and "v4" in out


@pytest.mark.skipif(have("gpu"), reason="this machine has a GPU: the no-GPU message cannot show")
def test_bench_kernel_cupy_without_gpu_says_so(capsys):
    assert main(["bench", "kernel", "--backend", "cupy"]) == 3      # as gpu-check: nothing ran
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "No GPU" in out and "Nothing was measured" in out
