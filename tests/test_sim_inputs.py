"""What a simulated run is made of: the workloads (the synthetic ShareGPT and Alpaca draws, their
means, caps, seeding, Poisson arrivals and bad arguments; JSONL traces, read, sorted and capped,
or refused naming the file, the line and the field), the memory calculator checked against the
paper's numbers, and the cost model's step times."""

from __future__ import annotations

import math

import numpy as np
import pytest

from minipaged.sim.cost import CostModel
from minipaged.sim.memory import GiB, block_table_bytes, kv_calc, preset
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


def test_trace_arrivals_and_the_model_length(tmp_path):
    """A trace whose arrival_s are null has no arrival times (load_jsonl draws them), and a trace
    is read at the model's own max_model_len: a 3000-token prompt fits llama-3-8b's 8192."""
    from minipaged.kit.cli import main
    from minipaged.sim.simulator import SimConfig, simulate
    from minipaged.sim.workloads import has_arrival_times

    null = tmp_path / "null.jsonl"
    null.write_text('{"prompt_len": 5, "output_len": 5, "arrival_s": null}\n')
    assert not has_arrival_times(null)
    long = tmp_path / "long.jsonl"
    long.write_text('{"prompt_len": 3000, "output_len": 4}\n')
    assert main(["simulate", "--workload", str(long), "--model", "llama-3-8b"]) == 0
    # A run shorter than its first usage snapshot has no usage figures, not zeros.
    r = simulate(SimConfig(workload=str(long), model="llama-3-8b", num_requests=1))
    assert r.num_steps < 16 and r.kv_usage is None


def test_workload_arguments_are_checked_by_name(tmp_path):
    """num_requests of a trace was a slice (-1 dropped the last request), and seeds, lengths and
    rates reached NumPy unchecked; a blank or non-object first line is no arrival time."""
    from minipaged.sim.workloads import has_arrival_times

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"prompt_len": 5, "output_len": 5}\n' * 3)
    for n, err in ((-1, ValueError), (0, ValueError), (True, TypeError), (2.5, TypeError)):
        with pytest.raises(err, match="num_requests="):
            make_workload(str(trace), n)
    for kw, err in ((dict(seed=-1), ValueError), (dict(seed=1.5), TypeError),
                    (dict(seed=None), TypeError), (dict(max_model_len=13.5), TypeError),
                    (dict(request_rate=1e-320), ValueError)):
        with pytest.raises(err, match=next(iter(kw)) + "="):
            synthetic("alpaca", 3, **kw)
        with pytest.raises(err, match=next(iter(kw)) + "="):
            load_jsonl(trace, **kw)
    with pytest.raises(TypeError, match="workload=5 must be a workload name or a path"):
        make_workload(5, 2)
    (tmp_path / "blank.jsonl").write_text("\n\n")
    (tmp_path / "list.jsonl").write_text("[1]\n")
    assert not has_arrival_times(tmp_path / "blank.jsonl")
    assert not has_arrival_times(tmp_path / "list.jsonl")
