"""The fact-check: every claim of the interview answer gets a measured figure and its verdict.

Each claim is pinned to its expected verdict; the simulation-backed claims run here at a tiny
size (the verdicts do not depend on it), the arithmetic ones at full precision.
"""

from __future__ import annotations

import json

import pytest

from minipaged.kit.cli import main
from minipaged.kit.quiz import Context, factcheck
from minipaged.kit.quiz.answer import CLAIMS

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


@pytest.fixture(scope="module")
def findings():
    return {f.claim_id: f for f in factcheck.run(ctx=Context(num_requests=40))}


def test_one_check_per_claim_of_the_interview_answer():
    assert list(factcheck.CHECKS) == list(CLAIMS) and set(EXPECTED) == set(CLAIMS)


@pytest.mark.parametrize("claim_id", list(EXPECTED))
def test_every_claim_has_its_verdict(findings, claim_id):
    f = findings[claim_id]
    assert f.verdict == EXPECTED[claim_id], (claim_id, f.measured, f.right)
    assert (f.quote, f.claim) == CLAIMS[claim_id]
    assert f.measured and f.right


def test_the_arithmetic_claims_come_out_right(findings):
    assert findings["refcount-cap"].figures["ref_count"] == 101  # no cap at 16
    assert findings["block-table-32k"].figures["bytes_per_1000"] == 8192 * 1000
    f = findings["block-table-128k"].figures
    assert (f["blocks"], f["bytes_int32"], f["bytes_8"]) == (8192, 32768, 65536)
    w = findings["block-32-example"].figures
    assert w["paged_32"] == pytest.approx(31 / 64) and w["paged_16"] == pytest.approx(15 / 48)
    assert w["contiguous"] == pytest.approx(31 / 64)
    assert len(findings["copy-on-write"].figures["copies"]) == 1
    nr = findings["no-page-replacement"].figures
    assert nr["preemptions"] > 0 and nr["hit_before"] == 8 and nr["hit_after"] == 0


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
