"""``minipaged gpu-check``: one line and exit 3 without a GPU; the full report with one."""

from __future__ import annotations

import json

import numpy as np
import pytest
from capabilities import have
from test_cuda_cases import tolerance

from minipaged.cuda import gpu_check, kernels
from minipaged.kit.cli import main


@pytest.mark.skipif(have("gpu"), reason="this machine has a GPU: the no-GPU line cannot show")
def test_without_a_gpu_one_line_and_exit_3(capsys, tmp_path):
    out = tmp_path / "report.json"
    assert main(["gpu-check", "--out", str(out)]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("minipaged gpu-check: no GPU here (")
    assert lines[0].endswith("; nothing ran")
    assert not out.exists()  # nothing measured, nothing written
    assert gpu_check.gpu_missing() is not None


@pytest.mark.requires("gpu")
def test_with_a_gpu_the_report_is_complete(tmp_path):
    out = tmp_path / "report.json"
    rc = main(["gpu-check", "--out", str(out)])
    report = json.loads(out.read_text())
    assert {"device", "cupy", "nvrtc", "kernels", "versions", "cache_kernels_exact", "limits",
            "bandwidth"} <= set(report)
    assert all(k["local_bytes"] == 0 for k in report["kernels"])
    assert rc == 0, [r for r in report["versions"] if r["error_over_tolerance"] > 1]


@pytest.mark.requires("cuda-cpu")
def test_the_checks_themselves_run_on_the_cpu_harness(monkeypatch):
    # the same functions, backend="cpu", on a small slice: they must pass on correct kernels
    # (and gpu-check's logic is exercised somewhere other than a GPU)
    from minipaged.cuda import checks

    rng = np.random.default_rng(0)
    rows = gpu_check.check_versions(rng, "cpu", (("float16", 64, 16), ("float32", 16, 8)),
                                    lens=(1, 600))
    assert len(rows) == 2 * 2 * len(kernels.VERSIONS)
    assert all(r["error_over_tolerance"] <= 1 for r in rows), rows
    rows = gpu_check.check_versions(rng, "cpu", (("float32", 64, 16),), lens=(5, 40),
                                    heads=((6, 3),))  # bench kernel's: its own shape
    assert [(r["H"], r["Hkv"], r["version"]) for r in rows] == [(6, 3, v) for v in kernels.VERSIONS]
    assert all(r["error_over_tolerance"] <= 1 and r["max_error"] >= 0 for r in rows), rows
    assert gpu_check.check_cache_kernels(rng, "cpu") == {"float32": True, "float16": True}
    monkeypatch.setattr(checks, "MAX_GRID_YZ", 200)  # 300 rows: 2 launches, as 70,000 would be
    limits = gpu_check.probe_limits(rng, "cpu", rows=300)
    assert limits["60000 tokens, version=1"]["launched"] is False
    assert "use version=2" in limits["60000 tokens, version=1"]["refused"]
    assert all(r["error_over_tolerance"] <= 1 for r in limits.values() if r["launched"])
    assert [k for k, r in limits.items() if r["launched"]] == [
        "11600 tokens, version=1", "12200 tokens, version=1", "60000 tokens, version=None",
        "S=300 rows"]



@pytest.mark.parametrize("dtype", list(kernels.DTYPES))
def test_the_oracle_check_allows_twice_the_tests_bound(dtype):
    # kernel and NumPy oracle each keep within test_cuda_cases.tolerance of a float64
    # reference, so gpu-check and bench kernel allow twice that between them, and no more
    want = np.array([0.0, -1e-3, 0.5, -3.0, 60.0])
    assert np.array_equal(gpu_check.tolerance(dtype, want), 2 * tolerance(dtype, want))
    row = gpu_check._close(want + 1.5 * tolerance(dtype, want), want, dtype)
    assert 0.5 < row["error_over_tolerance"] < 1 and row["max_error"] > 0

def test_copy_bandwidth_counts_each_byte_read_and_written():
    """The one denominator of "% of copy bandwidth" (gpu-check and bench kernel): a copy of N
    bytes in t seconds moves 2N / t, so a kernel reading at the copy's pace scores 50%, not 100%."""
    calls = []

    def timer(fn, repeats):
        fn()
        calls.append(repeats)
        return 0.25

    n_bytes = (1 << 25) * 4  # the host copy: 128 MiB of float32
    assert gpu_check.copy_bandwidth(np, timer) == 2 * n_bytes / 0.25
    assert calls == [10]
