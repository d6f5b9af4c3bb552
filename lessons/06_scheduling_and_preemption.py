# %% [markdown]
# # Lesson 06: scheduling, preemption, and why memory decides throughput
#
# Lessons 02-05 built the memory: contiguous regions, then blocks, then shared blocks. This one
# puts requests through it. vLLM's scheduler (paper section 4.5) works **per iteration**: every
# step it admits waiting requests first-come-first-served while blocks allow, runs one decode
# token for every running sequence, and when a running sequence cannot get a slot it
# **preempts** the most recently arrived request, all or nothing: by **swapping** its blocks to
# CPU memory, or by dropping them to **recompute** the tokens later as one prefill.
#
# Code: `minipaged/scheduler.py` (the scheduler), `minipaged/memory_policy.py` (paged and
# contiguous memory behind one interface), `minipaged/sim/` (workloads, memory, cost model,
# simulator). Next: lesson 07 (block size and block-table memory).

# %%
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from minipaged.serving.memory_policy import make_policy
from minipaged.serving.scheduler import Scheduler, SchedulerConfig
from minipaged.sim import experiments
from minipaged.sim.cost import CostModel
from minipaged.sim.memory import preset
from minipaged.sim.simulator import SimConfig, SimExecutor, simulate

console = Console()

# %% [markdown]
# ## A schedule you can read, step by step
#
# Four requests of 6 prompt tokens and 10 output tokens each, in a paged cache of only 12
# blocks of 4 slots. Each request will end with 15 tokens with K/V, 4 blocks: all four need
# 16 blocks, so they cannot all stay. Watch the scheduler admit, decode, run out of blocks and
# preempt the newest request, then bring it back. The executor is the simulator's stand-in for
# a model (a cost model for time, a hash of the history for the next token).

# %%


def trace(mode: str) -> Scheduler:
    policy = make_policy("paged", num_slots=12 * 4, block_size=4, max_seq_len=64,
                         num_cpu_blocks=16, watermark=0.0)
    s = Scheduler(policy, SchedulerConfig(max_model_len=64, preemption_mode=mode))
    for i in range(4):
        s.add_request(f"R{i}", [10 * i + t for t in range(6)], 10)
    ex = SimExecutor(CostModel.for_preset(preset("opt-13b")), 1)
    t = Table(title=f"preemption by {mode}: 4 requests, 12 blocks of 4 slots",
              title_justify="left")
    for c in ("step", "kind", "running", "waiting", "swapped", "free blocks", "preempted"):
        t.add_column(c)
    now, step = 0.0, 0
    while s.has_unfinished():
        out = s.schedule()
        res = ex.execute(out)
        now += res.duration_s
        s.update(out, res, now)
        step += 1
        kind = "prefill" if out.prefills else "decode"
        pre = ", ".join(f"{g.request_id} ({m})" for g, m in out.preempted)
        if out.prefills or out.preempted or out.blocks_to_swap_in or step % 4 == 0:
            t.add_row(str(step), kind + (" + swap-in" if out.blocks_to_swap_in else ""),
                      " ".join(str(g.request_id) for g in s.running),
                      " ".join(str(g.request_id) for g in s.waiting),
                      " ".join(str(g.request_id) for g in s.swapped),
                      str(policy.manager.num_free_blocks), pre)
    console.print(t)
    return s


rec = trace("recompute")
swp = trace("swap")
same = all(a.outputs == b.outputs for a, b in zip(rec.finished, swp.finished))
console.print(f"preemptions: recompute {rec.num_preemptions}, swap {swp.num_preemptions}; "
              f"every request produced the same tokens both ways: [bold]{same}[/bold]")

# %% [markdown]
# Things to notice: admission is strictly in arrival order (R3 never overtakes R2); the victim
# is always the newest running request; a swapped request comes back before anything new is
# admitted; after a recompute the request re-enters the waiting queue at its arrival position
# and its prompt *plus the tokens it had generated* are prefilled again. Either way the token
# streams are identical: the stateful test (`tests/test_scheduler_stateful.py`) checks that
# for random workloads, memory sizes and both modes.
#
# ## Experiment 1 (the paper's Fig. 2): where KV memory goes
#
# Now the paper's setting: OPT-13B on an A100-40GB leaves 12 GiB of KV cache, 15,728 token
# slots (`minipaged kv-calc`). ShareGPT-like requests all arrive at once; we average memory
# over the time requests are queued (memory is the bottleneck then). The Orca baselines
# reserve, at admission, the maximum length (2048), the next power of two of the final length,
# or exactly the final length; paged allocates a block when the last one is full.
# `minipaged experiment 1` runs it with 1,000 requests; here 150.

# %%
fig2 = experiments.fig2(150, console=console)

# %% [markdown]
# How close to the paper (in brackets): Orca (Max) lands within about three points in every
# category here and within one point with 1,000 requests (`minipaged experiment 1`); paged is
# within one point of 96.3%. Orca (Oracle) is close. Orca (Pow2) is the
# one we cannot match: we find more token states and far less external fragmentation than the
# paper's 41.6%. Our buddy allocator places power-of-two regions perfectly (a pow2 reservation
# is exactly a buddy block), so little free memory is stranded; the paper's bar is labelled
# "external fragmentation *& others*", and its allocator and counting are not published, so
# the gap is not something we can remove by measurement. The conclusion is the same: every
# contiguous scheme uses well under half its memory for tokens; paging uses nearly all of it.
#
# ## Experiment 3: batch size and the highest sustainable request rate
#
# Memory decides how many sequences run in a step; the cost model (`minipaged/sim/cost.py`)
# says a step of a 13B model is dominated by reading its 26 GB of weights, so the batch is
# nearly free and throughput grows with it. We search for the highest request rate whose mean
# normalized latency (seconds per output token) stays within 4x the unloaded one.
# `minipaged experiment 3` uses 400 requests and 6 bisection steps; here 60 and 3.

# %%
rates = experiments.rates(60, iters=3, console=console)

# %% [markdown]
# The paper reports 2-4x the request rate of Orca (and 1.7-2.7x over Orca (Oracle) on
# ShareGPT). With only 60 requests the cache is barely saturated and the ratios come out low;
# with 400 (`minipaged experiment 3`) we measure about 3.6x over Orca (Max), 1.9x over Pow2 and
# 1.7x over Oracle, at the low end of the paper's band. What we cannot remove: time comes from
# a roofline cost model (weights + KV traffic + compute), not an A100, and the workload is
# synthetic, so only the ratios between policies are meaningful, not the rates themselves.
#
# ## Experiment 5 (Fig. 19): swap or recompute?
#
# With a KV cache shrunk to 4 GiB (about 5K slots), preemption is frequent. Swapping copies
# each block as one small PCIe copy per layer for K and V (2 x 40 copies for OPT-13B), so small
# blocks mean many tiny copies; recomputation re-runs prefill, whose cost does not depend on the
# block size. `minipaged experiment 5` sweeps six block sizes with 300 requests.

# %%
swap = experiments.swap_vs_recompute(60, sizes=(4, 16, 64), console=console)
ratios = {bs: d["recompute"]["normalized_latency_s_per_token"]
          / d["swap"]["normalized_latency_s_per_token"] for bs, d in swap.items()}
console.print("recompute / swap latency in this run (60 requests): "
              + ", ".join(f"block {bs}: {r:.2f}" for bs, r in ratios.items()))

# %% [markdown]
# The paper (Fig. 19): swapping is slow with small blocks, recomputation's overhead stays
# within 20% of swapping's, and end to end the two are comparable for blocks of 16 to 64.
# Read the ratios this run printed (they depend on the run: `minipaged experiment 5` with its
# 300 requests gives other ones): where recompute / swap is above 1, swapping won. Our swap
# cost is a model (PCIe bandwidth plus 5 us per copy), not a measurement, so read the
# direction, not the digits. Preemption modes in vLLM: v0 recomputed single-sequence groups
# and swapped multi-sequence groups (beam search, n > 1), vLLM v0's
# `vllm/core/scheduler.py` `_preempt`; v1 has recompute only (`vllm/v1/core/sched/scheduler.py`).
#
# ## A simulation from the command line
#
# `minipaged simulate` runs any of this with a progress bar and a summary table; `--json`
# writes every figure. Same seed, same output.

# %%
r = simulate(SimConfig(workload="alpaca", num_requests=100, request_rate=20.0, seed=0))
console.print(f"alpaca at 20 req/s: {r.num_finished} finished, batch {r.avg_batch_size:.1f}, "
              f"{r.throughput_tokens_per_s:.0f} tokens/s, "
              f"{r.normalized_latency_s_per_token:.4f} s/token, "
              f"{r.num_preemptions} preemptions")
