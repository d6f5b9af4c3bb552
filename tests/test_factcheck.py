"""The fact-check: every claim gets a measured figure and a verdict from the instruments."""

from __future__ import annotations

import json

import pytest

from minipaged.kit import factcheck as fc
from minipaged.kit.cli import main

CHEAP = [fc.c_refcap, fc.c_block_table_32k, fc.c_128k, fc.c_33_tokens, fc.c_cow, fc.c_int32,
         fc.c_flash, fc.c_trtllm,
         fc.c_default_16]


@pytest.mark.parametrize("claim", CHEAP, ids=[c.__name__ for c in CHEAP])
def test_cheap_claims(claim):
    f = claim(fc.Context(quick=True))
    assert f.verdict in ("holds", "off", "unsupported")
    assert f.quote and f.claim and f.measured and f.right


def test_the_arithmetic_claims_come_out_right():
    ctx = fc.Context(quick=True)
    assert fc.c_refcap(ctx).figures["ref_count"] == 101  # no cap at 16
    assert fc.c_block_table_32k(ctx).figures["bytes_per_1000"] == 8192 * 1000
    f = fc.c_128k(ctx).figures
    assert (f["blocks"], f["bytes_int32"], f["bytes_8"]) == (8192, 32768, 65536)
    w = fc.c_33_tokens(ctx).figures
    assert w["paged_32"] == pytest.approx(31 / 64) and w["paged_16"] == pytest.approx(15 / 48)
    assert w["contiguous"] == pytest.approx(31 / 64)
    assert fc.c_cow(ctx).figures["copies"] and len(fc.c_cow(ctx).figures["copies"]) == 1


def test_factcheck_cli_quick(tmp_path, monkeypatch, capsys):
    # The simulation-backed claims at a tiny size: the CLI path, the table and the JSON.
    from minipaged.sim import experiments
    monkeypatch.setattr(fc.Context, "fig2", lambda self: self.get(
        "fig2", lambda: experiments.fig2(25)))
    monkeypatch.setattr(fc.Context, "rates", lambda self: self.get(
        "rates", lambda: experiments.rates(15, iters=2)))
    monkeypatch.setattr(fc.Context, "block_sweep", lambda self: self.get(
        "blocks", lambda: experiments.block_size(15, sizes=(8, 16, 32),
                                                 workloads=("sharegpt", "alpaca"))))
    p = tmp_path / "f.json"
    assert main(["factcheck", "--quick", "--json", str(p)]) == 0
    found = json.loads(p.read_text())
    assert len(found) == len(fc.CLAIMS)
    by_id = {f["claim_id"]: f for f in found}
    assert by_id["utilization-before"]["verdict"] == "off"
    assert by_id["refcount-cap"]["verdict"] == "unsupported"
    assert by_id["no-page-replacement"]["figures"]["preemptions"] > 0
    assert by_id["no-page-replacement"]["figures"]["evictions"] > 0
    assert "claims:" in capsys.readouterr().out
