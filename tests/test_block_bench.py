"""`minipaged bench allocator`: the CLI runs, and the plain baseline manager it measures against
behaves like KVCacheManager on the same trace (same hits, same blocks), so the ratio compares
equal work."""

from __future__ import annotations

import subprocess
import sys

from minipaged.kit.bench.allocator import make_trace, replay
from minipaged.kit.bench.plain_manager import PlainBlockManager
from minipaged.kit.cli import main
from minipaged.serving.swap import KVCacheManager


def test_cli_quick_runs_and_prints_both_modes(capsys):
    assert main(["bench", "allocator", "--quick", "--requests", "40", "--num-blocks", "512"]) == 0
    out = capsys.readouterr().out
    assert "40 requests, NB=512" in out   # --quick's 300 is for an unset --requests only
    assert "without prefix caching" in out and "with prefix caching" in out
    assert "minipaged / plain" in out and "append" in out


def test_help_explains():
    out = subprocess.run([sys.executable, "-m", "minipaged", "bench", "allocator", "--help"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "plain" in out.stdout and "--quick" in out.stdout


def test_baseline_does_the_same_work():
    trace = make_trace(60, seed=3)
    for prefix in (False, True):
        ours = KVCacheManager(256, 16, enable_prefix_caching=prefix)
        plain = PlainBlockManager(256, 16, prefix)
        a, b = replay(ours, trace, prefix), replay(plain, trace, prefix)
        assert {op: v[1] for op, v in a.items()} == {op: v[1] for op, v in b.items()}
        assert ours.num_free_blocks == 256 == len(plain.free_ids)


def test_baseline_prefix_hits_match():
    trace = make_trace(30, seed=1)
    ours = KVCacheManager(4096, 16, enable_prefix_caching=True)
    plain = PlainBlockManager(4096, 16, True)
    for r, (prompt, _, _) in enumerate(trace):
        assert ours.allocate(r, prompt) == plain.allocate(r, prompt)
        if r % 3 == 0:
            ours.free(r)
            plain.free(r)


def test_interleaved_compare_does_the_same_work_as_whole_replays():
    """``compare`` alternates the managers chunk by chunk; chunking must not change the work:
    every operation count equals that of an uninterrupted replay, for both managers, and there
    is one ratio per chunk in which both did something."""
    from minipaged.kit.bench.allocator import compare

    trace = make_trace(40, seed=5)
    for prefix in (False, True):
        whole = replay(KVCacheManager(256, 16, enable_prefix_caching=prefix), trace, prefix)
        totals, ratios = compare(trace, 256, 16, prefix, repeats=2, steps_per_chunk=3)
        for name in ("minipaged", "plain"):
            assert {op: v[1] for op, v in totals[name].items()} == {
                op: 2 * v[1] for op, v in whole.items()}
        assert ratios and all(r > 0 for r in ratios)
