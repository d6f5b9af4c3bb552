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


@pytest.mark.skipif(have("gpu"), reason="this machine has a GPU: the no-GPU message cannot show")
def test_bench_kernel_cupy_without_gpu_says_so(capsys):
    assert main(["bench", "kernel", "--backend", "cupy"]) == 3      # as gpu-check: nothing ran
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert "No GPU" in out and "Nothing was measured" in out
