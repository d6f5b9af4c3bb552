# %% [markdown]
# # Lesson 12: what chunked prefill buys: decodes that a long prompt no longer stalls
#
# Lesson 11 built the schedule: one token budget per step, decodes first, prompt chunks in the
# rest of the budget, a partly prefilled prompt kept in the paged cache between steps. This
# lesson measures what that schedule changes in time, with the simulator: how long running
# requests wait between tokens when a long prompt arrives, why a decode costs almost nothing
# in a step that also carries a prompt chunk (SARATHI's "piggybacking": Agrawal et al., 2023,
# arXiv 2308.16369), and what a whole workload's latency looks like with and without chunking.
#
# Code: `minipaged/serving/scheduler.py` (`SchedulerConfig(chunked_prefill=True)`),
# `minipaged/sim/cost.py` (the step-time model), `minipaged/sim/simulator.py`. Read before:
# lesson 11.

# %%
from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from minipaged.serving.memory_policy import make_policy
from minipaged.serving.scheduler import Scheduler, SchedulerConfig
from minipaged.sim.cost import CostModel
from minipaged.sim.executor import SimExecutor
from minipaged.sim.memory import preset
from minipaged.sim.simulator import SimConfig, build, simulate
from minipaged.sim.workloads import prompt_token_ids

console = Console()

# %% [markdown]
# ## Why: a long prompt no longer stalls the running decodes
#
# Time here comes from the simulator's cost model (`minipaged/sim/cost.py`: OPT-13B on an
# A100-40GB, a roofline of weight and KV reads against compute; estimates, not measurements).
# Eight chats are decoding when a long prompt arrives. Without chunking, its whole prefill is
# one step that no chat takes part in; with chunking, each step carries the chats' decodes
# and a piece of the prompt.

# %%
MODEL = preset("opt-13b")
COST = CostModel.for_preset(MODEL)
LONG_PROMPT, CHATS = 1800, 8


def run_step(s: Scheduler, ex: SimExecutor, now: float, times: dict):
    """One scheduler step through the simulator's cost model; returns (the step, the clock
    after it) and appends the clock to ``times[request]`` for every request that sampled."""
    out = s.schedule()
    res = ex.execute(out)
    now += res.duration_s
    s.update(out, res, now)
    for q in out.sampled:
        times[q.group.request_id].append(now)
    return out, now


def long_prompt_run(chunked: bool, budget: int | None) -> dict:
    policy = make_policy("paged", num_slots=MODEL.num_token_slots, block_size=16,
                         max_seq_len=MODEL.model.max_model_len)
    cfg = SchedulerConfig(max_model_len=MODEL.model.max_model_len, chunked_prefill=chunked,
                          max_num_batched_tokens=budget)
    s = Scheduler(policy, cfg)
    ex = SimExecutor(COST, MODEL.model.kv_bytes_per_token * 16)
    times: dict[str, list[float]] = {}
    for i in range(CHATS):
        s.add_request(f"chat{i}", prompt_token_ids(i, 200), 60)
        times[f"chat{i}"] = []
    now, step, arrived = 0.0, 0, None
    while s.has_unfinished():
        if step == 10:  # the chats are all decoding by now
            s.add_request("long", prompt_token_ids(99, LONG_PROMPT), 20, arrival_s=now)
            times["long"], arrived = [], now
        _, now = run_step(s, ex, now, times)
        step += 1
    gaps = [b - a for name, ts in times.items() if name != "long"
            for a, b in zip(ts, ts[1:])]
    return {"budget": cfg.token_budget, "ttft": times["long"][0] - arrived,
            "median_gap": float(np.median(gaps)), "max_gap": max(gaps)}


runs = {"v0-style": long_prompt_run(False, None),
        "chunked 512": long_prompt_run(True, 512),
        "chunked 2048": long_prompt_run(True, 2048)}
t = Table(title=f"{CHATS} chats decoding, a {LONG_PROMPT}-token prompt arrives "
          f"(cost model: OPT-13B, A100-40GB)", title_justify="left")
for col in ("run", "token budget", "long prompt: time to first token",
            "chats: median time between tokens", "chats: longest time between tokens"):
    t.add_column(col, justify="right")
for name, r in runs.items():
    t.add_row(name, str(r["budget"]), f"{r['ttft'] * 1e3:.0f} ms",
              f"{r['median_gap'] * 1e3:.1f} ms", f"{r['max_gap'] * 1e3:.0f} ms")
console.print(t)
v0, c512 = runs["v0-style"], runs["chunked 512"]
console.print(f"budget 512: the chats' longest wait for a token is {c512['max_gap'] * 1e3:.0f} "
              f"ms instead of {v0['max_gap'] * 1e3:.0f} ms; the long prompt's first token "
              f"comes after {c512['ttft'] * 1e3:.0f} ms instead of {v0['ttft'] * 1e3:.0f} ms")

# %% [markdown]
# The budget is the trade-off vLLM's tuning guide names (`docs/configuration/optimization.md`,
# "Chunked Prefill"): a smaller budget means shorter steps, so running requests wait less between
# tokens (inter-token latency), and a prompt takes more steps before its first token (time to first
# token); a larger budget the reverse. With the budget 2048 the whole prompt fits in one step
# again, but that step still carries the chats' decodes, which a v0-style prefill step does not.
#
# ## Why mixing is cheap: one weight read, more work
#
# A decode step of a 13B model is bound by memory traffic: it reads every weight once, whatever
# the number of tokens, plus the KV of every sequence; a long enough prefill chunk is bound by
# compute. In a mixed step the decodes use a weight read the chunk pays for anyway. The cost
# model's step time is `max(memory time, compute time) + overhead`, here for 8 decodes of
# 210-token contexts and a chunk that fills the rest of a 512-token budget:

# %%
ctx_decode = CHATS * 210
t = Table(title="one step's time in the cost model (OPT-13B, A100-40GB)", title_justify="left")
for col in ("step", "tokens", "memory time", "compute time", "step time"):
    t.add_column(col, justify="right")
cases = {"8 decodes": (CHATS, ctx_decode),
         "a 504-token chunk": (504, 504),
         "8 decodes + the 504-token chunk": (CHATS + 504, ctx_decode + 504)}
step_s = {}
for name, (tokens, ctx) in cases.items():
    # The two sides of the roofline, as in CostModel.step_time (no per-block cost here).
    t_mem = (COST.weight_bytes + ctx * COST.kv_bytes_per_token) / (COST.mem_bw * COST.mem_eff)
    t_compute = tokens * COST.flops_per_token / (COST.flops * COST.compute_eff)
    step_s[name] = COST.step_time(tokens, ctx)
    assert abs(step_s[name] - (max(t_mem, t_compute) + COST.step_overhead_s)) < 1e-12
    t.add_row(name, str(tokens), f"{t_mem * 1e3:.1f} ms", f"{t_compute * 1e3:.1f} ms",
              f"{step_s[name] * 1e3:.1f} ms")
console.print(t)
extra = step_s["8 decodes + the 504-token chunk"] - step_s["a 504-token chunk"]
console.print(f"the 8 decodes add {extra * 1e3:.2f} ms to the chunk's step, against "
              f"{step_s['8 decodes'] * 1e3:.1f} ms for a step of their own")

# %% [markdown]
# That is the GPU-utilisation half of the argument (SARATHI's "piggybacking"): the decodes'
# tokens ride on a step the compute-bound chunk already pays for. The model leaves out what a
# real GPU adds (attention kernels for mixed batches, kernel launch shapes), so read the
# direction, not the digits.
#
# ## A whole workload
#
# Last, the simulator on ShareGPT-like requests arriving at a steady rate: `build` gives the
# same scheduler, memory and executor that `simulate` uses; the loop below is `simulate`'s loop
# plus a clock for every sampled token (it checks that it ends at the same simulated time as
# `simulate`).

# %%


def workload_run(cfg: SimConfig) -> dict:
    reqs, s, ex, _ = build(cfg)
    times: dict = {}
    now, i, steps, with_prefill = 0.0, 0, 0, 0
    while i < len(reqs) or s.has_unfinished():
        while i < len(reqs) and reqs[i].arrival_s <= now:
            r = reqs[i]
            s.add_request(r.request_id, prompt_token_ids(r.request_id, r.prompt_len),
                          r.output_len, arrival_s=r.arrival_s)
            times[r.request_id] = [r.arrival_s]
            i += 1
        if not s.has_unfinished():
            now = reqs[i].arrival_s  # idle: jump to the next arrival
            continue
        out, now = run_step(s, ex, now, times)
        steps += 1
        with_prefill += bool(out.prefills)
    assert now == simulate(cfg).sim_time_s, "the loop must be simulate()'s loop"
    ttft = [ts[1] - ts[0] for ts in times.values()]
    gaps = [b - a for ts in times.values() for a, b in zip(ts[1:], ts[2:])]
    return {"ttft_median": float(np.median(ttft)), "gap_median": float(np.median(gaps)),
            "gap_p99": float(np.percentile(gaps, 99)), "preemptions": s.num_preemptions,
            "prefill_share": with_prefill / steps}


RATE, N = 1.0, 200
t = Table(title=f"ShareGPT-like, {N} requests at {RATE:g} req/s (cost model: OPT-13B, "
          f"A100-40GB)", title_justify="left")
for col in ("run", "token budget", "steps with a prefill", "median time to first token",
            "median time between tokens", "p99 time between tokens", "preemptions"):
    t.add_column(col, justify="right")
results = {}
for name, chunked, budget in (("v0-style", False, None), ("chunked", True, 512),
                              ("chunked", True, 2048)):
    cfg = SimConfig(workload="sharegpt", num_requests=N, request_rate=RATE,
                    chunked_prefill=chunked, max_num_batched_tokens=budget)
    r = workload_run(cfg)
    b = SchedulerConfig(max_model_len=MODEL.model.max_model_len, chunked_prefill=chunked,
                        max_num_batched_tokens=budget).token_budget
    results[(name, b)] = r
    t.add_row(name, str(b), f"{r['prefill_share']:.0%}", f"{r['ttft_median'] * 1e3:.0f} ms",
              f"{r['gap_median'] * 1e3:.1f} ms", f"{r['gap_p99'] * 1e3:.1f} ms",
              str(r["preemptions"]))
console.print(t)
off, on = results[("v0-style", 2048)], results[("chunked", 512)]
console.print(f"in this run, chunked prefill with budget 512 moved the p99 time between tokens "
              f"from {off['gap_p99'] * 1e3:.1f} ms to {on['gap_p99'] * 1e3:.1f} ms")

# %% [markdown]
# The p99 is where the stalls show: the steps that carried a prompt are the slow tail, and the
# "steps with a prefill" column says how few of them there are, which is why the median moves
# far less than the p99. These are simulated times from a cost model and a synthetic workload,
# so compare the rows with each other, not with a real server. `minipaged simulate --num-requests
# 200 --request-rate 1 --chunked-prefill --max-num-batched-tokens 512` runs the same simulation
# from the command line (its summary has throughput and latency per token, not the per-token
# clock of this loop).
#
# ## What to remember
#
# * Without chunking a long prompt's prefill is a step of its own, and every running request
#   waits for it; with a budget, each step carries the decodes and a piece of the prompt.
# * The budget is a trade-off: a smaller one shortens the time between tokens, a larger one a
#   prompt's time to first token.
# * A decode step is bound by memory traffic (every weight is read once), a long chunk's step
#   by compute, so decodes added to a chunk's step cost little (in the cost model: the table
#   above).
# * On a whole workload the stalls live in the tail: compare p99s, not medians.
