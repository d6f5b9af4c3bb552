"""The simulator end to end, from Python and from the command line: a seed gives one result,
every policy finishes with usage that adds up, paging beats contiguous reservations, sharing saves
memory, both preemption modes and chunked prefill run, the experiments point the paper's way,
simulate, kv-calc, bench simulate and experiment write what they promise, and a pool too small for
every request, or a step that does nothing, is refused instead of hanging."""

from __future__ import annotations

import json
import math

import pytest

from minipaged.kit.cli import main
from minipaged.sim import experiments
from minipaged.sim.simulator import SimConfig, simulate

# ---- the simulator ---------------------------------------------------------------------------

SMALL = dict(num_requests=40, seed=5)


def test_same_seed_same_result_and_another_seed_differs():
    a = simulate(SimConfig(**SMALL)).as_dict()
    b = simulate(SimConfig(**SMALL)).as_dict()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    c = simulate(SimConfig(num_requests=40, seed=6)).as_dict()
    assert c["kv_usage"] != a["kv_usage"]


@pytest.mark.parametrize("policy", ["paged", "orca-max", "orca-pow2", "orca-oracle"])
def test_every_policy_finishes_and_fractions_add_up(policy):
    r = simulate(SimConfig(policy=policy, request_rate=5.0, **SMALL))
    assert r.num_finished == 40 and r.num_rejected == 0
    u = r.kv_usage
    assert math.isclose(sum(u.values()), 1.0, rel_tol=1e-9)
    assert all(v >= 0 for v in u.values())
    assert r.throughput_tokens_per_s > 0 and r.normalized_latency_s_per_token > 0
    if policy == "paged":
        assert u["external_fragmentation"] == 0
    if policy == "orca-max":
        assert u["internal_fragmentation"] > u["token"]


def test_paged_beats_contiguous_on_memory_and_batch():
    res = {p: simulate(SimConfig(policy=p, num_requests=80, seed=1))
           for p in ("paged", "orca-oracle", "orca-max")}
    tok = {p: (r.kv_usage_saturated or r.kv_usage)["token"] for p, r in res.items()}
    assert tok["paged"] > tok["orca-oracle"] > tok["orca-max"]
    assert res["paged"].avg_batch_size > res["orca-max"].avg_batch_size


def test_sharing_saves_memory_beam_more_than_parallel():
    par = simulate(SimConfig(workload="alpaca", num_requests=30, n=4, seed=2))
    beam = simulate(SimConfig(workload="alpaca", num_requests=30, beam_width=4, seed=2))
    v1 = simulate(SimConfig(workload="alpaca", num_requests=30, n=4, sharing="prefix", seed=2))
    assert 0 < par.memory_saving < beam.memory_saving < 1
    assert v1.num_finished == 120 and v1.memory_saving is not None
    assert simulate(SimConfig(**SMALL)).memory_saving is None


def test_swap_and_recompute_both_finish_under_pressure():
    for mode in ("swap", "recompute"):
        r = simulate(SimConfig(num_requests=30, kv_cache_gb=1.5, preemption_mode=mode, seed=4))
        assert r.num_finished == 30 and r.num_preemptions > 0
        assert (r.num_swapped_out > 0) == (mode == "swap")


def test_chunked_prefill_runs():
    r = simulate(SimConfig(chunked_prefill=True, **SMALL))
    assert r.num_finished == 40


# ---- experiments (tiny sizes: they check shape and direction, not the paper's numbers) -------


def test_experiments_small():
    f = experiments.fig2(30)
    assert f["paged"]["usage"]["token"] > f["orca-max"]["usage"]["token"]
    b = experiments.block_size(20, sizes=(1, 16, 256), workloads=("alpaca",))
    waste = [b["alpaca"][s]["waste_share_of_used"] for s in (1, 16, 256)]
    table = [b["alpaca"][s]["block_table_bytes_per_request"] for s in (1, 16, 256)]
    assert waste == sorted(waste) and table == sorted(table, reverse=True)
    s = experiments.swap_vs_recompute(20, sizes=(8,), kv_cache_gb=1.5)
    assert set(s[8]) == {"swap", "recompute"}


# ---- the command line ------------------------------------------------------------------------


def test_simulate_cli_json_is_reproducible(tmp_path, capsys):
    paths = [tmp_path / "a.json", tmp_path / "b.json"]
    for p in paths:
        assert main(["simulate", "--num-requests", "25", "--seed", "3", "--request-rate", "4",
                     "--json", str(p)]) == 0
    a, b = (json.loads(p.read_text()) for p in paths)
    assert a == b
    for key in ("kv_usage", "avg_batch_size", "throughput_tokens_per_s",
                "normalized_latency_s_per_token", "num_preemptions", "memory_saving"):
        assert key in a
    assert set(a["kv_usage"]) >= {"token", "reserved", "internal_fragmentation",
                                  "external_fragmentation"}
    assert "normalized latency" in capsys.readouterr().out


def test_simulate_cli_beam_and_bad_rate(tmp_path):
    p = tmp_path / "beam.json"
    assert main(["simulate", "--workload", "alpaca", "--num-requests", "10", "--beam-width",
                 "2", "--json", str(p)]) == 0
    assert json.loads(p.read_text())["memory_saving"] > 0
    assert main(["simulate", "--request-rate", "-1"]) == 2


def test_kv_calc_cli(capsys):
    assert main(["kv-calc", "--context-len", "32768", "--num-requests", "1000", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["block_table_bytes_per_request"] == 8192 and r["token_slots"] == 15728
    assert main(["kv-calc", "--model", "llama-3-8b"]) == 0


def test_bench_simulate_quick_cli(capsys):
    assert main(["bench", "simulate", "--sizes", "30", "60"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the title may wrap
    assert "requests/s" in out and "rates per CPU second" in out and "60" in out


def test_bench_simulate_names_a_block_size_only_for_paged(capsys):
    assert main(["bench", "simulate", "--sizes", "20", "--policy", "orca-max"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the title may wrap
    assert "ShareGPT, orca-max, all arrivals" in out and "block" not in out


def test_bench_simulate_quick_flag(capsys):
    assert main(["bench", "simulate", "--quick"]) == 0
    assert "1,000" in capsys.readouterr().out


def test_experiment_cli(tmp_path):
    p = tmp_path / "e.json"
    assert main(["experiment", "1", "--num-requests", "20", "--json", str(p)]) == 0
    assert set(json.loads(p.read_text())) == {"orca-max", "orca-pow2", "orca-oracle", "paged"}


def test_experiment_json_with_numeric_keys(tmp_path):
    p = tmp_path / "e4.json"
    assert main(["experiment", "4", "--num-requests", "10", "--quick", "--json", str(p)]) == 0
    d = json.loads(p.read_text())
    assert set(d) == {"sharegpt", "alpaca"} and "16" in d["alpaca"]


def test_simulate_titles_a_trace_with_its_own_count_and_clock(tmp_path, capsys):
    """The title states what ran: the trace's request count (not --num-requests), and for a
    trace with arrival times, those times (a --request-rate it would not use is refused)."""
    untimed = tmp_path / "one.jsonl"
    untimed.write_text('{"prompt_len": 10, "output_len": 5}\n')
    assert main(["simulate", "--workload", str(untimed), "--request-rate", "3"]) == 0
    title = " ".join(capsys.readouterr().out.split())
    assert "1 request at 3.0 req/s" in title
    timed = tmp_path / "two.jsonl"
    timed.write_text('{"prompt_len": 10, "output_len": 5, "arrival_s": 0}\n'
                     '{"prompt_len": 10, "output_len": 5, "arrival_s": 1.5}\n')
    assert main(["simulate", "--workload", str(timed)]) == 0
    title = " ".join(capsys.readouterr().out.split())
    assert "2 requests at the trace's arrival times" in title
    assert main(["simulate", "--workload", str(timed), "--request-rate", "3"]) == 2


# ---- nothing hangs ----------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [dict(n=3), dict(n=1), dict(n=2), dict(beam_width=3)])
def test_a_pool_too_small_for_every_request_refuses_them_instead_of_hanging(kw):
    # This run (`minipaged simulate --num-requests 30 --n 3 --preemption swap --kv-cache-gb
    # 0.05`) once spun forever on a swapped group that could never come back.
    from time_limit import time_limit

    with time_limit(30):
        r = simulate(SimConfig(num_requests=30, preemption_mode="swap", kv_cache_gb=0.05, **kw))
    assert r.num_rejected == 30 and r.num_finished == 0 and r.num_steps == 0
    assert "needs up to" in r.extra["first_rejection"] and "num_blocks=4" in \
        r.extra["first_rejection"]


@pytest.mark.parametrize("mode", ["swap", "recompute"])
def test_under_pressure_parallel_samples_finish_or_are_refused(mode):
    from time_limit import time_limit

    with time_limit(60):  # also hung once, with 1 GiB
        r = simulate(SimConfig(num_requests=30, n=3, preemption_mode=mode, kv_cache_gb=1.0))
    assert r.num_finished + r.num_rejected == 30 and r.num_finished > 0
    assert r.num_preemptions > 0 and r.num_swapped_out > 0  # groups of 3 swap when they can


def test_the_simulator_reports_a_step_that_does_nothing(monkeypatch):
    from minipaged.serving.scheduler import NoProgressError, Scheduler, SchedulerOutput

    monkeypatch.setattr(Scheduler, "schedule", lambda self: SchedulerOutput())
    with pytest.raises(NoProgressError, match=r"step 0: no progress: request \(0, 0\) "
                                              r"\(waiting, 1 sequence\(s\)"):
        simulate(SimConfig(num_requests=3))
