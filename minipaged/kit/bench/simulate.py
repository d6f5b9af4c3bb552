"""How fast the simulator runs, in requests simulated per second.

It runs the ShareGPT workload (block 16, OPT-13B memory, all requests arriving at t=0: the most
preemption, the worst case) for 1K, 10K and 100K requests (--quick: 200 and 1K) and prints wall
and CPU seconds, requests per second and decode tokens per second. The cost is linear in the
requests: per token, one KVCacheManager.append_slot call, one scheduler loop iteration and one
sampled token; per step, a schedule() and an update(); every max(16, requests // 8) steps a
usage() snapshot. Budget: 10K requests in under 10 s on one core.
"""

from __future__ import annotations

import time

from rich.console import Console

from minipaged.kit.bench import fill_unset
from minipaged.kit.cli.common import check_sim_size, flag_words, progress_bar, table

# The request counts when --sizes is not given, without and with --quick.
DEFAULTS, QUICK = dict(sizes=[1000, 10_000, 100_000]), dict(sizes=[200, 1000])


def run(args) -> int:
    from minipaged.sim.simulator import SimConfig, simulate

    fill_unset(args, DEFAULTS, QUICK)
    sizes = args.sizes
    with flag_words({"policy": "--policy", "block_size": "--block-size"}):
        SimConfig(policy=args.policy, block_size=args.block_size)  # refused now, not at size 1
    paged = args.policy == "paged"  # a contiguous policy has no blocks (nor their state)
    check_sim_size(max(sizes), block_size=args.block_size if paged else None, flag="--sizes")
    console = Console()
    policy = f"{args.policy}, block {args.block_size}" if paged else args.policy
    t = table(f"simulator speed: ShareGPT, {policy}, all arrivals at t=0; rates per CPU second",
              ("requests", "wall s", "CPU s", "requests/s", "tokens/s", "steps", "preemptions"))
    for n in sizes:
        cfg = SimConfig(workload="sharegpt", policy=args.policy, num_requests=n,
                        block_size=args.block_size)
        with progress_bar(console, f"{n} requests") as update:
            w0, c0 = time.perf_counter(), time.process_time()
            r = simulate(cfg, progress=update)
            wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        tokens = r.throughput_tokens_per_s * r.sim_time_s
        t.add_row(f"{n:,}", f"{wall:.2f}", f"{cpu:.2f}", f"{n / cpu:,.0f}",
                  f"{tokens / cpu:,.0f}", f"{r.num_steps:,}", f"{r.num_preemptions:,}")
    console.print(t)
    return 0
