"""Workloads, the memory calculator, the cost model and the simulator end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from minipaged.kit.cli import main
from minipaged.sim import experiments
from minipaged.sim.cost import CostModel
from minipaged.sim.memory import GiB, block_table_bytes, kv_calc, preset
from minipaged.sim.simulator import SimConfig, simulate
from minipaged.sim.workloads import WORKLOADS, load_jsonl, make_workload, synthetic

# ---- workloads -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_synthetic_means_caps_and_seeding(name):
    reqs = synthetic(name, 20000, seed=3)
    p = np.array([r.prompt_len for r in reqs])
    o = np.array([r.output_len for r in reqs])
    dist_in, dist_out = WORKLOADS[name]
    # 3%: sampling error of a heavy-tailed mean over 20K draws plus the joint cap, which trims
    # outputs of long prompts (the calibration only corrects each marginal for its own cap).
    assert abs(p.mean() / dist_in.mean - 1) < 0.03
    assert abs(o.mean() / dist_out.mean - 1) < 0.03
    assert p.min() >= 1 and o.min() >= 1 and (p + o).max() <= 2048
    assert synthetic(name, 500, seed=3) == synthetic(name, 500, seed=3)
    assert synthetic(name, 200, seed=1) != synthetic(name, 200, seed=2)


def test_poisson_arrivals():
    reqs = synthetic("alpaca", 20000, request_rate=4.0, seed=0)
    t = np.array([r.arrival_s for r in reqs])
    assert np.all(np.diff(t) >= 0)
    # Mean gap 1/rate; 3% is ~4 standard errors of the mean of 20K exponential gaps.
    assert abs(np.diff(t).mean() * 4.0 - 1) < 0.03
    assert all(r.arrival_s == 0 for r in synthetic("alpaca", 10, request_rate=math.inf))


@pytest.mark.parametrize("kw, msg", [
    (dict(name="lmsys"), "workload='lmsys' is not one of"),
    (dict(num_requests=0), "num_requests=0 is out of range: expected >= 1"),
    (dict(max_model_len=1), "max_model_len=1 is out of range: expected >= 2"),
    (dict(request_rate=0.0), "request_rate=0.0 must be > 0"),
])
def test_synthetic_bad_args(kw, msg):
    args = dict(name="sharegpt", num_requests=5) | kw
    name = args.pop("name")
    with pytest.raises(ValueError, match=msg):
        synthetic(name, **args)


def test_jsonl_trace(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"prompt_len": 5, "output_len": 3, "arrival_s": 2.0}\n\n'
                 '{"prompt_len": 7, "output_len": 4000, "arrival_s": 1.0}\n')
    reqs = load_jsonl(f, max_model_len=2048)
    assert [(r.prompt_len, r.output_len, r.arrival_s) for r in reqs] == [
        (7, 2041, 1.0), (5, 3, 2.0)]  # sorted by arrival, output capped to fit the model
    g = tmp_path / "g.jsonl"
    g.write_text('{"prompt_len": 5, "output_len": 3}\n' * 4)
    a = load_jsonl(g, request_rate=2.0, seed=1)
    assert [r.arrival_s for r in a] == [r.arrival_s for r in load_jsonl(g, request_rate=2.0,
                                                                        seed=1)]
    assert make_workload(str(g), 2)[1].request_id == 1


@pytest.mark.parametrize("text, msg", [
    ('{"prompt_len": 5, "output_len": 3}\n{"prompt_len": 5,', r":2: not valid JSON"),
    ('{"prompt_len": 5}\n', r":1: missing field 'output_len'"),
    ('{"prompt_len": "5", "output_len": 3}\n', r":1: field 'prompt_len' = '5' must be an int"),
    ('{"prompt_len": true, "output_len": 3}\n', r"field 'prompt_len' = True"),
    ('{"prompt_len": 0, "output_len": 3}\n', r"field 'prompt_len' = 0"),
    ('[1, 2]\n', r":1: expected a JSON object"),
    ('{"prompt_len": 2048, "output_len": 3}\n', r"leaves no room"),
    ('{"prompt_len": 5, "output_len": 3, "arrival_s": -1}\n', r"'arrival_s' = -1"),
    ('{"prompt_len": 5, "output_len": 3, "arrival_s": 1}\n{"prompt_len": 5, "output_len": 3}\n',
     r":2: field 'arrival_s' must be given on every line or on none"),
    ('\n\n', "holds no requests"),
])
def test_jsonl_errors_name_file_line_and_field(tmp_path, text, msg):
    f = tmp_path / "bad.jsonl"
    f.write_text(text)
    with pytest.raises(ValueError, match=msg) as e:
        load_jsonl(f)
    assert "bad.jsonl" in str(e.value)


def test_missing_trace_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        make_workload(str(tmp_path / "nope.jsonl"), 3)


# ---- memory and cost --------------------------------------------------------------------------


def test_memory_presets_match_the_paper():
    p = preset("opt-13b")
    assert p.model.kv_bytes_per_token == 2 * 40 * 5120 * 2 == 800 * 1024
    assert p.kv_cache_bytes == 12 * GiB and p.num_token_slots == 15728  # "about 15.7K"
    assert preset("llama-3-8b").model.kv_bytes_per_token == 128 * 1024
    assert preset("opt-13b", kv_cache_gb=6).num_token_slots == 15728 // 2
    with pytest.raises(ValueError, match="model='gpt-5'"):
        preset("gpt-5")
    with pytest.raises(ValueError, match="block_size=0 is out of range: expected >= 1"):
        p.num_blocks(0)


def test_block_table_arithmetic():
    assert block_table_bytes(32 * 1024, 16) == 2048 * 4
    assert block_table_bytes(128 * 1024, 16, entry_bytes=8) == 64 * 1024
    assert block_table_bytes(33, 32) == 8 and block_table_bytes(0, 16) == 0
    r = kv_calc(preset("opt-13b"), block_size=16, context_len=2048, num_requests=10)
    assert r["num_blocks"] == 15728 // 16 and r["block_table_bytes_total"] == 10 * 128 * 4
    with pytest.raises(ValueError, match="context_len=-1 is out of range: expected >= 0"):
        block_table_bytes(-1, 16)


def test_cost_model_is_memory_bound_and_monotone():
    c = CostModel.for_preset(preset("opt-13b"))
    t1, t32 = c.step_time(1, 500), c.step_time(32, 32 * 500)
    assert t1 > c.weight_bytes / (c.mem_bw * c.mem_eff)  # at least the weights
    assert t1 < t32 < 32 * t1  # batching is far cheaper than running one by one
    assert c.step_time(0, 0) == 0.0
    assert c.step_time(8, 800, blocks_read=100) > c.step_time(8, 800, blocks_read=50)
    small = c.step_time(1, 10, blocks_swapped=64, block_bytes=1 << 20)
    big = c.step_time(1, 10, blocks_swapped=16, block_bytes=4 << 20)
    assert small > big  # same bytes in more, smaller copies costs more


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
    out = capsys.readouterr().out
    assert "requests/s" in out and "60" in out


def test_bench_simulate_quick_flag(capsys):
    assert main(["bench", "simulate", "--quick"]) == 0
    assert "1,000" in capsys.readouterr().out


def test_experiment_cli(tmp_path):
    p = tmp_path / "e.json"
    assert main(["experiment", "1", "--num-requests", "20", "--json", str(p)]) == 0
    assert set(json.loads(p.read_text())) == {"orca-max", "orca-pow2", "orca-oracle", "paged"}


def test_bad_sim_configs_are_refused():
    with pytest.raises(ValueError, match="policy='orca-max' cannot share"):
        SimConfig(policy="orca-max", n=2)
    with pytest.raises(ValueError, match="policy='vllm' is not one of"):
        simulate(SimConfig(policy="vllm", num_requests=2))
    with pytest.raises(ValueError, match="block_size=0 is out of range: expected >= 1"):
        simulate(SimConfig(block_size=0, num_requests=2))


def test_experiment_json_with_numeric_keys(tmp_path):
    p = tmp_path / "e4.json"
    assert main(["experiment", "4", "--num-requests", "10", "--quick", "--json", str(p)]) == 0
    d = json.loads(p.read_text())
    assert set(d) == {"sharegpt", "alpaca"} and "16" in d["alpaca"]


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


def test_simulate_titles_a_trace_with_its_own_count_and_clock(tmp_path, capsys):
    """The title states what ran: the trace's request count (not --num-requests), and for a
    trace with arrival times, those times instead of a --request-rate it does not use."""
    untimed = tmp_path / "one.jsonl"
    untimed.write_text('{"prompt_len": 10, "output_len": 5}\n')
    assert main(["simulate", "--workload", str(untimed), "--request-rate", "3"]) == 0
    title = " ".join(capsys.readouterr().out.split())
    assert "1 request at 3.0 req/s" in title
    timed = tmp_path / "two.jsonl"
    timed.write_text('{"prompt_len": 10, "output_len": 5, "arrival_s": 0}\n'
                     '{"prompt_len": 10, "output_len": 5, "arrival_s": 1.5}\n')
    assert main(["simulate", "--workload", str(timed), "--request-rate", "3"]) == 0
    title = " ".join(capsys.readouterr().out.split())
    assert "2 requests at the trace's arrival times (--request-rate is not used)" in title


def test_simulate_refuses_what_is_not_a_config_or_a_callback():
    for kw, err, match in ((dict(seed=-1), ValueError, "seed=-1"),
                           (dict(seed=1.5), TypeError, "seed=1.5"),
                           (dict(num_requests=True), TypeError, "num_requests=True"),
                           (dict(beam_width=0), ValueError, "beam_width=0")):
        with pytest.raises(err, match=match):
            SimConfig(**kw)
    with pytest.raises(TypeError, match="cfg must be a SimConfig"):
        simulate({"num_requests": 5})
    with pytest.raises(ValueError, match="progress_every=0"):
        simulate(SimConfig(num_requests=5), progress=lambda a, b: None, progress_every=0)
    with pytest.raises(TypeError, match="progress=5 must be a callable"):
        simulate(SimConfig(num_requests=5), progress=5)


# ---- refused before anything runs ------------------------------------------------------------


def test_sim_config_refuses_a_workload_that_is_not_one(tmp_path):
    """'' was read as "." and a directory "does not exist", both only when the run started."""
    for bad, why in (("", "is empty"), (str(tmp_path), "is a directory"),
                     (str(tmp_path / "no.jsonl"), "does not exist")):
        with pytest.raises(ValueError, match=f"workload=.* {why}; expected one of"):
            SimConfig(workload=bad)
    with pytest.raises(TypeError, match="workload=5 must be a workload name or a path"):
        SimConfig(workload=5)
    with pytest.raises(ValueError, match="is a directory"):
        load_jsonl(tmp_path)


@pytest.mark.parametrize("kw, match", [
    (dict(num_slots=10_000, kv_cache_gb=1.0), "num_slots=10000 and kv_cache_gb=1.0 both set"),
    (dict(policy="orca-max", enable_prefix_caching=True), "policy='orca-max' reserves one "
     "contiguous region per request and would ignore enable_prefix_caching=True: only "
     "policy='paged' uses it"),
    (dict(policy="orca-pow2", preemption_mode="swap"), "would ignore preemption_mode='swap'"),
    (dict(policy="orca-oracle", block_size=32), "would ignore block_size=32"),
    (dict(policy="orca-max", preemption_mode="swap", block_size=8),
     "would ignore preemption_mode='swap', block_size=8: only policy='paged' uses them"),
    (dict(swap_space_blocks=10), "swap_space_blocks=10 would never be used: with "
     "preemption_mode='recompute' only a group of several sequences"),
    (dict(swap_space_blocks=10, n=2, sharing="prefix"), "swap_space_blocks=10 would never"),
])
def test_sim_config_refuses_settings_the_run_would_ignore(kw, match):
    with pytest.raises(ValueError, match=match):
        SimConfig(num_requests=5, **kw)


def test_sim_config_accepts_what_a_run_uses():
    # Groups of several sequences swap even under recompute (vLLM v0's _preempt), so their CPU
    # pool is used; a contiguous policy may spell out the default block size.
    for kw in (dict(swap_space_blocks=10, n=2), dict(swap_space_blocks=10, beam_width=2),
               dict(swap_space_blocks=10, preemption_mode="swap"), dict(swap_space_blocks=0),
               dict(policy="orca-max", block_size=16), dict(num_slots=2**31 - 1)):
        SimConfig(num_requests=5, **kw)


@pytest.mark.parametrize("kw, err, match", [
    (dict(chunked_prefill="x"), TypeError, "chunked_prefill='x' must be a bool"),
    (dict(enable_prefix_caching="yes"), TypeError, "enable_prefix_caching='yes' must be a bool"),
    (dict(enable_prefix_caching=None), TypeError, "enable_prefix_caching=None must be a bool"),
    (dict(num_slots=10**10), ValueError,
     r"num_slots=10000000000 is out of range: expected in \[1, 2147483648\)"),
    (dict(num_slots=2.5), TypeError, "num_slots=2.5 must be an integer"),
    (dict(swap_space_blocks=10**30, preemption_mode="swap"), ValueError,
     "swap_space_blocks=10{30} is out of range"),
    (dict(usage_every=1.5), TypeError, "usage_every=1.5 must be an integer"),
    (dict(kv_cache_gb=1e30), ValueError, r"kv_cache_gb=1e\+30 must be > 0 and <= 2\*\*40"),
    (dict(kv_cache_gb=1e300), ValueError, r"kv_cache_gb=1e\+300 must be > 0"),  # overflowed
    (dict(kv_cache_gb="1"), TypeError, "kv_cache_gb='1' must be a number"),
    (dict(kv_cache_gb=math.inf), ValueError, "kv_cache_gb=inf must be finite"),
    (dict(kv_cache_gb=1e9), ValueError,
     r"kv_cache_gb=1e\+09 holds 81,920,000,000 blocks; expected fewer than 2\*\*31"),
    (dict(kv_cache_gb=1e9, policy="orca-max"), ValueError,
     r"kv_cache_gb=1e\+09 holds 1,310,720,000,000 token slots"),
    (dict(policy="vllm"), ValueError, "policy='vllm' is not one of"),
    (dict(sharing="fork"), ValueError, r"sharing='fork' is not one of \['cow', 'prefix'\]"),
    (dict(block_size=16.0), TypeError, "block_size=16.0 must be an integer"),
])
def test_sim_config_refuses_bad_flags_and_sizes(kw, err, match):
    with pytest.raises(err, match=match):
        SimConfig(num_requests=5, **kw)


def test_simulate_refuses_a_run_too_big_for_this_machine(monkeypatch, tmp_path):
    """The command line's memory rule, applied by simulate() itself before it allocates: 10**9
    requests were drawn first (7 GiB of arrival times), 10**6 GiB of KV became 82M blocks."""
    from minipaged.sim import host

    monkeypatch.setattr(host, "available_memory", lambda: 8 * GiB)  # 4 GiB may be used
    for kw, match in (
            (dict(num_requests=10**9), "num_requests=1000000000 would need about 7.28 TiB of "
                                       r"memory; at most 4.00 GiB \(half of what is available\)"),
            (dict(num_requests=10**30), "num_requests=10{30} would need about"),
            (dict(num_requests=10**6, n=4), "num_requests=1000000 x 4 sequences would need"),
            (dict(num_requests=5, kv_cache_gb=10**6),
             r"num_requests=5 with kv_cache_gb=1e\+06 \(81,920,000 simulated blocks\) would"),
            (dict(num_requests=5, num_slots=10**9), r"with num_slots=1000000000 \(62,500,000 "),
            (dict(num_requests=5, swap_space_blocks=2**31 - 1, preemption_mode="swap"),
             r"with swap_space_blocks=2147483647 \(2,147,483,647 simulated blocks\)")):
        with pytest.raises(ValueError, match=match):
            simulate(SimConfig(**kw))
    trace = tmp_path / "one.jsonl"  # a trace counts its own requests, not num_requests
    trace.write_text('{"prompt_len": 5, "output_len": 3}\n')
    assert simulate(SimConfig(workload=str(trace), num_requests=10**9)).num_finished == 1
