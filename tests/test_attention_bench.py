"""``minipaged bench attention --quick`` runs through the CLI and prints its table.

No timing is asserted (speed is for the reader of the table, never for a test); what is checked
is that the command exists, exits 0 and reports every method, with the paged gather path giving
the same bits as the dense baseline at each context (max |diff| = 0)."""

from __future__ import annotations

import os
import re
import subprocess
import sys


def test_bench_attention_quick_runs_through_the_cli():
    env = dict(os.environ, COLUMNS="160", TERM="dumb", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "minipaged", "bench", "attention", "--quick"],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    text = out.stdout
    for needle in ("decode attention", "median ms", "x dense", "dense matmul", "paged gather",
                   "paged online", "(baseline)"):
        assert needle in text, f"{needle!r} missing from:\n{text}"
    gather_rows = [line for line in text.splitlines() if "paged gather" in line]
    assert len(gather_rows) == 2                         # the two --quick contexts
    for line in gather_rows:
        assert re.search(r"0\.0e\+00", line), f"gather differs from dense: {line}"


def test_bench_attention_rejects_bad_sizes():
    env = dict(os.environ, COLUMNS="160", TERM="dumb")
    out = subprocess.run([sys.executable, "-m", "minipaged", "bench", "attention",
                          "--heads", "6", "--kv-heads", "4", "--contexts", "8"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2
    assert "minipaged bench attention: --heads=6 must be a multiple of --kv-heads=4" in out.stderr
