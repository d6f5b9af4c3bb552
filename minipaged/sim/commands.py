"""``minipaged simulate`` and ``minipaged experiment``: the simulator from the command line.

``simulate`` runs one configuration and prints a summary (``--json PATH`` writes every figure);
``experiment N`` reproduces one of the paper's results (see ``experiments.py``). Both show a
progress bar on a terminal. Same seed, same output. Read before: ``simulator.py``.
"""

from __future__ import annotations

import argparse
import json
import math

SIM_HELP = """\
Simulate serving a workload with the real scheduler and KV cache managers (vLLM paper sections
4.5 and 6): requests arrive (Poisson, seeded), the scheduler batches them step by step over a
paged KV cache or an Orca-style contiguous one, and a roofline cost model turns each step into
time. Prints KV memory usage by category (the paper's Fig. 2), batch size, throughput and
normalized latency (end-to-end latency / output tokens).

examples:
  minipaged simulate --workload sharegpt --policy paged --num-requests 1000 --request-rate 2
  minipaged simulate --workload alpaca --policy paged --beam-width 4 --json out.json
  minipaged simulate --workload trace.jsonl --policy orca-oracle
"""


EXPERIMENTS_HELP = """\
Reproduce one of the vLLM paper's results with the project's scheduler and memory managers,
printing the paper's figure beside ours (minipaged/sim/experiments.py explains the differences):

    1  Fig. 2   where KV memory goes: orca-max / orca-pow2 / orca-oracle / paged on ShareGPT
    2  Fig. 15  memory saved by parallel sampling (n = 2, 4, 6) and beam search (k = 2, 4, 6)
    3  Fig. 12  average batch size and the highest request rate each policy sustains
    4  Fig. 18b block size 1..256: fragmentation, block-table bytes, blocks read, throughput
    5  Fig. 19  swap versus recompute under memory pressure, per block size

examples:
  minipaged experiment 1
  minipaged experiment 4 --quick --json block_size.json
"""


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number (use inf for all at once)") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return v


def add_sim_args(p: argparse.ArgumentParser) -> None:
    from minipaged.serving.memory_policy import POLICY_NAMES
    from minipaged.sim.memory import PRESETS

    p.add_argument("--workload", default="sharegpt",
                   help="sharegpt, alpaca (synthetic, shaped like the paper's Fig. 11) or a "
                        "JSONL file of {\"prompt_len\", \"output_len\"[, \"arrival_s\"]} lines")
    p.add_argument("--policy", default="paged", choices=POLICY_NAMES,
                   help="paged (vLLM) or an Orca baseline reserving max / next power of two / "
                        "exactly the final length")
    p.add_argument("--num-requests", type=int, default=1000)
    p.add_argument("--request-rate", type=positive_float, default=math.inf,
                   help="requests per second, Poisson arrivals (default inf: all at t=0)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, default=16, help="tokens per block (paged)")
    p.add_argument("--model", default="opt-13b", choices=sorted(PRESETS),
                   help="memory and cost preset (opt-13b: A100-40GB, 12 GiB of KV cache)")
    p.add_argument("--kv-cache-gb", type=float, default=None, help="override the KV budget")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--n", type=int, default=1, help="parallel samples per request")
    g.add_argument("--beam-width", type=int, default=1, help="beam search width")
    p.add_argument("--sharing", choices=("cow", "prefix"), default="cow",
                   help="with --n: share the prompt by fork + copy-on-write (vLLM v0) or as n "
                        "requests through the prefix cache (vLLM v1)")
    p.add_argument("--prefix-caching", action="store_true", help="enable prefix caching")
    p.add_argument("--preemption", choices=("recompute", "swap"), default="recompute",
                   help="how to evict a sequence group when blocks run out")
    p.add_argument("--chunked-prefill", action="store_true",
                   help="split prompts into chunks within a per-step token budget")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="per-step token budget (default 2048, or 512 with chunked prefill)")
    p.add_argument("--max-num-seqs", type=int, default=256)


def config_from_args(args: argparse.Namespace, **overrides):
    from minipaged.sim.simulator import SimConfig

    kw = dict(workload=args.workload, policy=args.policy, num_requests=args.num_requests,
              request_rate=args.request_rate, seed=args.seed, block_size=args.block_size,
              model=args.model, kv_cache_gb=args.kv_cache_gb, n=args.n,
              beam_width=args.beam_width, sharing=args.sharing,
              enable_prefix_caching=args.prefix_caching, preemption_mode=args.preemption,
              chunked_prefill=args.chunked_prefill,
              max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs)
    kw.update(overrides)
    return SimConfig(**kw)


def progress_bar(console, total_label: str):
    """A rich progress bar as a context manager yielding ``update(done, total)``."""
    from contextlib import contextmanager

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    @contextmanager
    def cm():
        with Progress("[progress.description]{task.description}", BarColumn(),
                      MofNCompleteColumn(), TimeElapsedColumn(), console=console,
                      transient=True, disable=not console.is_terminal) as prog:
            task = prog.add_task(total_label, total=None)

            def update(done: int, total: int) -> None:
                prog.update(task, completed=done, total=total)
            yield update
    return cm()


def summary_table(results: dict, title: str):
    from rich.table import Table

    t = Table(title=title)
    t.add_column("figure")
    for name in results:
        t.add_column(name, justify="right")
    rows = [
        ("token states (of KV memory)", lambda r: f"{100 * r.kv_usage['token']:.1f}%"),
        ("reserved", lambda r: f"{100 * r.kv_usage['reserved']:.1f}%"),
        ("internal fragmentation", lambda r: f"{100 * r.kv_usage['internal_fragmentation']:.1f}%"),
        ("external fragmentation", lambda r: f"{100 * r.kv_usage['external_fragmentation']:.1f}%"),
        ("free", lambda r: f"{100 * r.kv_usage['free']:.1f}%"),
        ("token states while queued", lambda r: "-" if r.kv_usage_saturated is None
         else f"{100 * r.kv_usage_saturated['token']:.1f}%"),
        ("avg batch size (seqs/decode step)", lambda r: f"{r.avg_batch_size:.1f}"),
        ("throughput (tokens/s)", lambda r: f"{r.throughput_tokens_per_s:.0f}"),
        ("throughput (requests/s)", lambda r: f"{r.throughput_requests_per_s:.3f}"),
        ("normalized latency (s/token)", lambda r: f"{r.normalized_latency_s_per_token:.4f}"),
        ("preemptions (swap / recompute)",
         lambda r: f"{r.num_preemptions} ({r.num_swapped_out} / {r.num_recomputed})"),
        ("memory saved by sharing", lambda r: "-" if r.memory_saving is None
         else f"{100 * r.memory_saving:.1f}%"),
        ("finished / rejected", lambda r: f"{r.num_finished} / {r.num_rejected}"),
        ("steps, simulated time", lambda r: f"{r.num_steps}, {r.sim_time_s:.1f} s"),
    ]
    for label, f in rows:
        t.add_row(label, *[f(r) for r in results.values()])
    return t


def _str_keys(obj):
    """JSON objects have string keys (experiment results are keyed by block size or width),
    and strict JSON has no Infinity (an all-at-once request rate)."""
    if isinstance(obj, dict):
        return {str(k): _str_keys(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_str_keys(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)  # "inf": strict JSON has no Infinity
    return obj


def write_json(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_str_keys(obj), f, indent=2, sort_keys=True, default=str, allow_nan=False)
        f.write("\n")


def run_simulate(args: argparse.Namespace) -> int:
    from rich.console import Console

    from minipaged.sim.simulator import simulate

    console = Console()
    cfg = config_from_args(args)
    with progress_bar(console, f"simulating {cfg.policy}") as update:
        r = simulate(cfg, progress=update)
    console.print(summary_table({cfg.policy: r}, f"{cfg.workload}, {cfg.num_requests} requests "
                                f"at {cfg.request_rate} req/s, seed {cfg.seed}"))
    if r.num_rejected:
        console.print(f"{r.num_rejected} request(s) refused, the first because: "
                      f"{r.extra['first_rejection']}")
    if args.json:
        write_json(args.json, r.as_dict())
        console.print(f"wrote {args.json}")
    return 0


def run_experiment(args: argparse.Namespace) -> int:
    from rich.console import Console

    from minipaged.sim import experiments

    console = Console()
    res = experiments.run(args.number, num_requests=args.num_requests, seed=args.seed,
                          quick=args.quick, console=console)
    if args.json:
        write_json(args.json, res)
        console.print(f"wrote {args.json}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="simulate serving a workload: memory, batch, throughput",
                       description=SIM_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sim_args(p)
    p.add_argument("--json", metavar="PATH", default=None, help="write every figure as JSON")
    p.set_defaults(func=run_simulate)

    e = sub.add_parser("experiment", help="reproduce one of the paper's results (1-5)",
                       description=EXPERIMENTS_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("number", type=int, choices=(1, 2, 3, 4, 5))
    e.add_argument("--num-requests", type=int, default=None,
                   help="requests per simulation (default: the experiment's own)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--quick", action="store_true", help="fewer requests and points (seconds)")
    e.add_argument("--json", metavar="PATH", default=None, help="write the results as JSON")
    e.set_defaults(func=run_experiment)
