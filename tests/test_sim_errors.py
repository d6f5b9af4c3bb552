"""What the simulator refuses before anything runs, each with the reason: configs that cannot
work or whose settings a run would ignore (and what it accepts), bad flags and sizes, a workload
that is not one, what is not a config or a callback, and a run too big for this machine."""

from __future__ import annotations

import math

import pytest

from minipaged.sim.memory import GiB
from minipaged.sim.simulator import SimConfig, simulate
from minipaged.sim.workloads import load_jsonl


def test_bad_sim_configs_are_refused():
    with pytest.raises(ValueError, match="policy='orca-max' cannot share"):
        SimConfig(policy="orca-max", n=2)
    with pytest.raises(ValueError, match="policy='vllm' is not one of"):
        simulate(SimConfig(policy="vllm", num_requests=2))
    with pytest.raises(ValueError, match="block_size=0 is out of range: expected >= 1"):
        simulate(SimConfig(block_size=0, num_requests=2))


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
    (dict(sharing="prefix"), "sharing='prefix' is how the samples of a request share its prompt, "
     "and n=1"),
    (dict(kv_cache_gb=1e-6), r"kv_cache_gb=1e-06 holds 0 token slots, less than one block of "
     "block_size=16; expected a smaller block_size or a larger kv_cache_gb"),
    (dict(num_slots=3), "num_slots=3 holds 3 token slots, less than one block"),
    (dict(kv_cache_gb=1e-6, policy="orca-max"), "kv_cache_gb=1e-06 holds no token slot"),
    (dict(max_num_batched_tokens=100), "max_num_batched_tokens=100 must be >= max_model_len=2048"),
    (dict(request_rate=-1), "request_rate=-1.0 must be > 0"),
    (dict(request_rate=1e-320), "request_rate=1e-320 must be > 0 with a finite mean gap"),
    (dict(n=2, beam_width=2, sharing="prefix"), "n=2 and beam_width=2: at most one of them"),
    (dict(policy="orca-max", num_slots=10), "num_slots=10 holds 10 token slots, fewer than one "
     "region of max_model_len=2048"),
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


def test_flag_words_rewrite_parameters_only():
    """The command line words SimConfig's refusals with its flags: a name=value and a bare name
    with an underscore become the flag; a bare one-word name (n, policy) stays a word."""
    from minipaged.kit.cli.common import in_flag_words
    from minipaged.kit.cli.simulation import SIMULATE_FLAGS

    said = ("policy='orca-max' would ignore enable_prefix_caching=True, block_size=8 and "
            "n=2 (n samples); expected a smaller block_size, max_model_len=2048 kept")
    assert in_flag_words(said, SIMULATE_FLAGS) == (
        "--policy=orca-max would ignore --prefix-caching, --block-size=8 and --n=2 (n samples); "
        "expected a smaller --block-size, max_model_len=2048 kept")


def test_sim_config_stores_what_it_checked(tmp_path):
    """A NumPy int is kept as an int (the result's JSON holds it), a rate that is not a number
    is refused by name, and a trace that gives arrival times refuses a request_rate it would not
    use."""
    import json

    import numpy as np

    r = simulate(SimConfig(seed=np.int64(3), num_requests=np.int64(5)))
    assert type(r.config["seed"]) is int and json.dumps(r.as_dict())
    for bad in ("5", None, True):
        with pytest.raises(TypeError, match="request_rate=.* must be a number"):
            SimConfig(request_rate=bad)
    timed = tmp_path / "timed.jsonl"
    timed.write_text('{"prompt_len": 5, "output_len": 5, "arrival_s": 0.5}\n')
    with pytest.raises(ValueError, match="gives each request's arrival_s: request_rate=5.0 would"):
        SimConfig(workload=str(timed), request_rate=5.0)
    assert SimConfig(workload=str(timed)).request_rate == math.inf
