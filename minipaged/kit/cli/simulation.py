"""The simulator's commands: ``simulate``, ``experiment`` and ``factcheck``.

Their runners run the serving simulator (``minipaged/sim/``): one workload, one of the paper's
experiments, or every checkable claim of the interview answer (``kit/quiz/factcheck.py``).
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

from rich.console import Console

from minipaged.kit.cli.args import (
    NON_NEGATIVE,
    bounds,
    command,
    json_out,
    num,
    path,
    workload,
)
from minipaged.kit.cli.common import (
    check_sim_size,
    flag_words,
    progress_bar,
    reading,
    table,
    write_json,
)
from minipaged.serving.memory_policy import POLICY_NAMES
from minipaged.sim import pct
from minipaged.sim.memory import PRESETS

# ---- simulate ----------------------------------------------------------------------------------

SIM_HELP = """\
Simulate serving a workload with the real scheduler and KV cache managers (vLLM paper sections
4.5 and 6): requests arrive (Poisson, seeded), the scheduler batches them step by step over a
paged KV cache or an Orca-style contiguous one, and a roofline cost model turns each step into
time. Prints KV memory usage by category (the paper's Fig. 2), batch size, throughput and
normalized latency (end-to-end latency / output tokens). Same seed, same output.

examples:
  minipaged simulate --workload sharegpt --policy paged --num-requests 1000 --request-rate 2
  minipaged simulate --workload alpaca --policy paged --beam-width 4 --json out.json
  minipaged simulate --workload trace.jsonl --policy orca-oracle
"""

def _rate(x: float, decimals: int) -> str:
    """``x`` to ``decimals`` places, or to 3 significant digits where those would print 0."""
    text = f"{x:.{decimals}f}"
    return text if x == 0 or float(text) != 0 else f"{x:.3g}"


SUMMARY_ROWS = (
    *((label, lambda r, k=key: pct(r.kv_usage and r.kv_usage[k])) for label, key in (
        ("token states (of KV memory)", "token"), ("reserved", "reserved"),
        ("internal fragmentation", "internal_fragmentation"),
        ("external fragmentation", "external_fragmentation"), ("free", "free"))),
    ("token states while queued", lambda r: pct(
        None if r.kv_usage_saturated is None else r.kv_usage_saturated["token"])),
    ("avg batch size (seqs/decode step)", lambda r: f"{r.avg_batch_size:.1f}"),
    ("throughput (tokens/s)", lambda r: _rate(r.throughput_tokens_per_s, 0)),
    ("throughput (requests/s)", lambda r: _rate(r.throughput_requests_per_s, 3)),
    ("normalized latency (s/token)", lambda r: f"{r.normalized_latency_s_per_token:.4f}"),
    ("preemptions (swap / recompute)",
     lambda r: f"{r.num_preemptions} ({r.num_swapped_out} / {r.num_recomputed})"),
    ("memory saved by sharing", lambda r: pct(r.memory_saving)),
    ("finished / rejected", lambda r: f"{r.num_finished} / {r.num_rejected}"),
    ("steps, simulated time", lambda r: f"{r.num_steps}, {r.sim_time_s:.1f} s"),
)


def add_simulate(sub) -> None:
    p = command(sub, "simulate", "simulate serving a workload: memory, batch, throughput",
                SIM_HELP, simulate)
    path(p, "--workload", workload, "sharegpt, alpaca (synthetic, shaped like the paper's "
         "Fig. 11) or a JSONL file of {\"prompt_len\", \"output_len\"[, \"arrival_s\"]} lines",
         default="sharegpt")
    p.add_argument("--policy", default="paged", choices=POLICY_NAMES,
                   help="paged (vLLM) or an Orca baseline reserving max_seq_len / the prompt plus "
                        "the output rounded up to a power of two (only the output is rounded) / "
                        "exactly the final length")
    num(p, "--num-requests", int, 1000, "requests to simulate")
    num(p, "--request-rate", float, math.inf, "requests per second, Poisson arrivals (inf: "
        "all at t=0)", bounds(above=0, finite=False))
    num(p, "--seed", int, 0, "seed of the workload and the samples", NON_NEGATIVE)
    num(p, "--block-size", int, 16, "tokens per block (paged)")
    p.add_argument("--model", default="opt-13b", choices=sorted(PRESETS),
                   help="memory and cost preset (opt-13b: A100-40GB, 12 GiB of KV cache)")
    num(p, "--kv-cache-gb", float, None, "override the KV budget, in GiB",
        bounds(above=0, high=2**40))
    g = p.add_mutually_exclusive_group()
    num(g, "--n", int, 1, "parallel samples per request")
    num(g, "--beam-width", int, 1, "beam search width")
    p.add_argument("--sharing", choices=("cow", "prefix"), default="cow",
                   help="with --n: share the prompt by fork + copy-on-write (vLLM v0) or as n "
                        "requests through the prefix cache (vLLM v1, "
                        "vllm/v1/engine/parallel_sampling.py)")
    p.add_argument("--prefix-caching", action="store_true", help="enable prefix caching")
    p.add_argument("--preemption", choices=("recompute", "swap"), default="recompute",
                   help="how to evict a sequence group when blocks run out")
    p.add_argument("--chunked-prefill", action="store_true",
                   help="split prompts into chunks within a per-step token budget")
    num(p, "--max-num-batched-tokens", int, None,
        "per-step token budget (unset: the model's max_model_len, at least 2048; 512 with "
        "chunked prefill)")
    num(p, "--max-num-seqs", int, 256, "sequences per step at most")
    json_out(p, "every figure")


# SimConfig's parameters as simulate's flags: its checks speak for the command line
# (``common.flag_words``). Two flags are spelled otherwise than their parameters.
SIMULATE_FLAGS = {name: "--" + name.replace("_", "-") for name in (
    "workload", "policy", "num_requests", "request_rate", "seed", "block_size", "model",
    "kv_cache_gb", "n", "beam_width", "sharing", "chunked_prefill", "max_num_batched_tokens",
    "max_num_seqs")} | {"enable_prefix_caching": "--prefix-caching",
                        "preemption_mode": "--preemption"}


def simulate(args) -> int:
    from minipaged.sim.simulator import SimConfig, simulate
    from minipaged.sim.workloads import WORKLOADS, has_arrival_times, load_jsonl

    num_requests, rate = args.num_requests, f"at {args.request_rate} req/s"
    if args.workload not in WORKLOADS:       # a trace: read it once here, to blame it by name
        if args.json and Path(args.json).exists() and Path(args.json).samefile(args.workload):
            raise ValueError(f"--json={args.json!r} is the --workload trace, which the report "
                             "would overwrite; expected another file name")
        with reading("--workload", args.workload):
            trace = load_jsonl(args.workload,
                               max_model_len=PRESETS[args.model].model.max_model_len)
        num_requests = min(num_requests, len(trace))
        if has_arrival_times(args.workload):  # (SimConfig refuses a --request-rate then)
            rate = "at the trace's arrival times"
    with flag_words(SIMULATE_FLAGS):
        cfg = SimConfig(workload=args.workload, policy=args.policy,
                        num_requests=args.num_requests, request_rate=args.request_rate,
                        seed=args.seed, block_size=args.block_size, model=args.model,
                        kv_cache_gb=args.kv_cache_gb, n=args.n, beam_width=args.beam_width,
                        sharing=args.sharing, enable_prefix_caching=args.prefix_caching,
                        preemption_mode=args.preemption, chunked_prefill=args.chunked_prefill,
                        max_num_batched_tokens=args.max_num_batched_tokens,
                        max_num_seqs=args.max_num_seqs)
    check_sim_size(num_requests, max(args.n, args.beam_width), model=args.model,
                   kv_cache_gb=args.kv_cache_gb, flag="--num-requests", kv_flag="--kv-cache-gb",
                   block_size=args.block_size if args.policy == "paged" else None)
    console = Console()
    with progress_bar(console, f"simulating {cfg.policy}") as update:
        r = simulate(cfg, progress=update)
    apart = (f" (run as {num_requests * cfg.n}: one per sample, --sharing=prefix)"
             if cfg.sharing == "prefix" else "")
    t = table(f"{cfg.workload}, {num_requests} request{'s' * (num_requests != 1)}{apart} {rate}, "
              f"seed {cfg.seed}",
              ("figure", cfg.policy), left=("figure",))
    for label, cell in SUMMARY_ROWS:
        t.add_row(label, cell(r))
    console.print(t)
    if r.kv_usage is None:
        console.print(f"no KV usage figures: the run ended after {r.num_steps} step(s), before "
                      "its first usage snapshot")
    if r.num_rejected:
        console.print(f"{r.num_rejected} request(s) refused, the first because: "
                      f"{r.extra['first_rejection']}")
    if args.json:
        write_json(console, args.json, r.as_dict())
    return 0


# ---- experiment --------------------------------------------------------------------------------

EXPERIMENT_HELP = """\
Reproduce one of the vLLM paper's results with the project's scheduler and memory managers,
printing the paper's figure beside ours (minipaged/sim/experiments.py explains the differences):

    1  Fig. 2   where KV memory goes: orca-max / orca-pow2 / orca-oracle / paged on ShareGPT
    2  Fig. 15  memory saved by parallel sampling (n = 2, 4, 6) and beam search (k = 2, 4, 6)
    3  Fig. 12-13  the highest request rate each policy sustains, average batch size
    4  Fig. 18b block size 1..256: fragmentation, block-table bytes, blocks read, throughput
    5  Fig. 19  swap versus recompute under memory pressure, per block size

examples:
  minipaged experiment 1
  minipaged experiment 4 --quick --json block_size.json
"""


def add_experiment(sub) -> None:
    p = command(sub, "experiment", "reproduce one of the paper's results (1-5)",
                EXPERIMENT_HELP, experiment)
    p.add_argument("number", type=int, choices=(1, 2, 3, 4, 5), help="which experiment")
    num(p, "--num-requests", int, None, "requests per simulation (unset: the experiment's own; "
        "experiment 4 runs 5x as many of Alpaca's shorter requests)")
    num(p, "--seed", int, 0, "simulation seed", NON_NEGATIVE)
    p.add_argument("--quick", action="store_true", help="fewer requests and points (seconds)")
    json_out(p, "the results")


def experiment(args) -> int:
    from minipaged.sim import experiments

    # The largest run: 6 beams (experiment 2), more than experiment 4's 5x Alpaca requests.
    check_sim_size(args.num_requests or 1000, 6, flag="--num-requests")
    console = Console()
    with progress_bar(console, f"experiment {args.number}: simulating"):  # elapsed time only
        res = experiments.run(args.number, num_requests=args.num_requests, seed=args.seed,
                              quick=args.quick, console=console)
    if args.json:
        write_json(console, args.json, res)
    return 0


# ---- factcheck ---------------------------------------------------------------------------------

FACTCHECK_HELP = """\
Fact-check the interview answer: a model answer to "explain vLLM's PagedAttention" that
candidates learn by heart. For each of its checkable claims, the package's own instruments (the
simulator, kv-calc's arithmetic, the real block managers) measure the figure, printed beside the
claim with a verdict:

    holds        what we measure (or the paper reports) agrees
    off          it disagrees: the right figure is given
    unsupported  neither the paper nor the code says so, and our measurements do not back it

Lesson 10 (lessons/10_factcheck.py) walks through the findings.
"""


def add_factcheck(sub) -> None:
    p = command(sub, "factcheck", "measure every checkable claim of the interview answer",
                FACTCHECK_HELP, factcheck)
    p.add_argument("--quick", action="store_true",
                   help="smaller simulations (seconds instead of a minute or two)")
    num(p, "--seed", int, 0, "simulation seed", NON_NEGATIVE)
    json_out(p, "the findings")


def factcheck(args) -> int:
    from minipaged.kit.quiz import factcheck

    console = Console()
    with progress_bar(console, "checking claims") as update:
        findings = factcheck.run(quick=args.quick, seed=args.seed, progress=update)
    console.print(factcheck.table(findings))
    counts = {v: sum(f.verdict == v for f in findings) for v in factcheck.VERDICTS}
    console.print(f"{len(findings)} claims: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    if args.json:
        write_json(console, args.json, [asdict(f) for f in findings])
    return 0
