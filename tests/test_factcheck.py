"""The fact-check: every claim of the interview answer gets a measured figure and its verdict,
and every figure the course states in several places is one number from one run.

Each claim is pinned to its expected verdict on the canonical run (``context.canonical``: the
run the lessons, the quiz and the slides print), and again on a tiny run where the verdict must
not depend on the size. The figures shared between tools (preemptions in a 2 GiB cache, the
parallel-sampling saving at n = 6, the best Alpaca block size) are computed once here and
looked for in every place that states them: the fact-check, the quiz's drills and lessons 04,
07 and 10 (run as a learner runs them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from minipaged.kit.cli import main
from minipaged.kit.quiz import DRILLS, Context, factcheck
from minipaged.kit.quiz.answer import CLAIMS
from minipaged.kit.quiz.context import CANONICAL_REQUESTS, CANONICAL_SEED, canonical

ROOT = Path(__file__).resolve().parent.parent

EXPECTED = {
    "max-reservation-internal": "holds", "contiguous-external": "holds",
    "utilization-before": "off", "default-block-16": "holds",
    "no-external-fragmentation": "holds", "copy-on-write": "holds", "refcount-cap": "off",
    "sweet-spot-16": "off", "no-page-replacement": "off", "utilization-after": "holds",
    "throughput-2-4x": "holds", "batch-8-to-32": "holds", "block-table-32k": "off",
    "int32-compression": "unsupported", "block-table-128k": "off",
    "block-size-tradeoff": "holds", "block-32-example": "off",
    "flashattention-compatible": "holds", "others-page-too": "holds",
}


# Claims whose verdict is computed from a measurement (the others are fixed by the source).
MEASURED_VERDICTS = {"throughput-2-4x"}


@pytest.fixture(scope="module")
def findings():
    """The findings on the canonical run: what `minipaged factcheck`, lesson 10 and the quiz
    print."""
    return {f.claim_id: f for f in factcheck.run()}


@pytest.fixture(scope="module")
def tiny():
    return {f.claim_id: f for f in factcheck.run(ctx=Context(num_requests=40))}


def test_one_check_per_claim_of_the_interview_answer():
    assert list(factcheck.CHECKS) == list(CLAIMS) and set(EXPECTED) == set(CLAIMS)


@pytest.mark.parametrize("claim_id", list(EXPECTED))
def test_every_claim_has_its_verdict(findings, claim_id):
    f = findings[claim_id]
    assert f.verdict == EXPECTED[claim_id], (claim_id, f.measured, f.right)
    assert (f.quote, f.claim) == CLAIMS[claim_id]
    assert f.measured and f.right
    assert f.run == canonical().label


@pytest.mark.parametrize("claim_id", sorted(set(EXPECTED) - MEASURED_VERDICTS))
def test_fixed_verdicts_do_not_depend_on_the_run(tiny, claim_id):
    assert tiny[claim_id].verdict == EXPECTED[claim_id], claim_id


def test_the_canonical_run_is_the_default_everywhere():
    ctx = canonical()
    assert (ctx.num_requests, ctx.seed) == (CANONICAL_REQUESTS, CANONICAL_SEED) == (300, 0)
    assert ctx is canonical() and ctx.label.startswith("canonical run: 300 requests")
    assert Context().label == ctx.label and "canonical" not in Context(40).label
    assert factcheck.run.__defaults__[0] is False   # quick=False: the canonical run


def test_every_place_states_the_same_shared_figures(findings):
    """One number for one quantity: each shared figure, computed once, is what every place
    that states it prints."""
    ctx = canonical()
    shared = ctx.shared_figures()
    pre, ps6, best = (shared[k] for k in ("preemptions_2gib", "parallel_saving_n6",
                                           "best_alpaca_block_size"))
    assert int(pre) > 0 and ps6.endswith("%") and best in ("16", "32")
    # the fact-check
    assert f"{pre} preemptions" in findings["no-page-replacement"].measured
    assert findings["sweet-spot-16"].figures["best"]["alpaca"] == int(best)
    # the quiz's drills, on the same context
    drills = {d.key: d.answer(ctx) for d in DRILLS}
    figs = {k: dict(a.figures) for k, a in drills.items()}
    assert figs["no-replacement"][
        "preemptions, ShareGPT, 2 GiB of KV cache, 2 requests/s (recompute)"] == pre
    assert figs["swap-vs-recompute"][
        "ShareGPT, 2 GiB KV, 2 req/s, recompute: preemptions / normalized latency"
    ].startswith(f"{pre} / ")
    assert figs["sharing-savings"]["Alpaca, parallel sampling n = 6: memory saved"] == ps6
    assert figs["why-16"]["Alpaca: block size with the highest throughput"] == best
    # the lessons, run as a learner runs them (wide, so that no figure is wrapped)
    env = dict(os.environ, COLUMNS="250", TERM="dumb")
    out = {}
    for name in ("04_copy_on_write", "07_block_size", "10_factcheck"):
        r = subprocess.run([sys.executable, str(ROOT / "lessons" / f"{name}.py")], cwd=ROOT,
                           capture_output=True, text=True, timeout=600, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        out[name] = r.stdout
    assert ps6 in out["04_copy_on_write"] and ps6 in out["07_block_size"]
    assert f"ShareGPT {findings['sweet-spot-16'].figures['best']['sharegpt']}, Alpaca {best}" \
        in out["07_block_size"]
    assert f"{pre} preemptions in a 2 GiB cache" in out["10_factcheck"]
    assert f"best Alpaca block size {best}" in out["10_factcheck"]
    for text in out.values():
        assert ctx.label in text   # each print says the run it came from


def test_the_arithmetic_claims_come_out_right(findings):
    """The figures behind the verdicts (the paper's own numbers, or exact arithmetic)."""
    assert findings["refcount-cap"].figures["ref_count"] == 101  # no cap at 16
    assert findings["block-table-32k"].figures["bytes_per_1000"] == 8192 * 1000
    f = findings["block-table-128k"].figures
    assert (f["blocks"], f["bytes_int32"], f["bytes_8"]) == (8192, 32768, 65536)
    w = findings["block-32-example"].figures
    assert w["paged_32"] == pytest.approx(31 / 64) and w["paged_16"] == pytest.approx(15 / 48)
    assert w["contiguous"] == pytest.approx(31 / 64)
    cow = findings["copy-on-write"].figures   # the quiz's pitfall-concept prints these
    assert cow["ref_counts"] == [2, 2] and cow["copies"] == [(cow["table"][1],
                                                              cow["child_table"][1])]
    assert cow["parent_slot"] == cow["table"][1] * 16 + 4   # in place: no second copy
    nr = findings["no-page-replacement"].figures
    assert nr["preemptions"] > 0 and nr["hit_before"] == 8 and nr["hit_after"] == 0


def test_batch_8_to_32_holds_because_the_simulator_matches_fig13(findings):
    """The verdict says the simulator's own batch ratios agree with the paper's Fig. 13 (4.3x
    over Orca (Max), 2.2x over Orca (Oracle)): within 20% of each, on the canonical run."""
    b = findings["batch-8-to-32"].figures
    assert abs(b["paged"] / b["orca-max"] / 4.3 - 1) < 0.2
    assert abs(b["paged"] / b["orca-oracle"] / 2.2 - 1) < 0.2


def test_findings_are_measured_once_per_context(monkeypatch):
    ctx = Context(num_requests=20)
    calls = []
    real = factcheck.CHECKS["refcount-cap"]
    monkeypatch.setitem(factcheck.CHECKS, "refcount-cap", lambda c: calls.append(c) or real(c))
    assert ctx.finding("refcount-cap") is ctx.finding("refcount-cap")
    assert ctx.verdicts("refcount-cap")[0][1] == "off" and len(calls) == 1


def test_factcheck_cli(tmp_path, monkeypatch, capsys):
    # The CLI path, the table and the JSON, with every simulation at a tiny size.
    real_init = Context.__init__
    monkeypatch.setattr(Context, "__init__",
                        lambda self, num_requests=300, seed=0: real_init(self, 40, seed))
    p = tmp_path / "f.json"
    assert main(["factcheck", "--quick", "--json", str(p)]) == 0
    found = json.loads(p.read_text())
    assert [f["claim_id"] for f in found] == list(CLAIMS)
    assert {f["claim_id"]: f["verdict"] for f in found} == EXPECTED
    assert "19 claims:" in capsys.readouterr().out
