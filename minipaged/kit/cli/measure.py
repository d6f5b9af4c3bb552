"""The measuring commands: ``bench`` (speed against a baseline) and ``gpu-check`` (the kernels on
a real GPU).

Their parsers are here; what they do lives beside what they measure: each ``bench NAME`` in
``minipaged/kit/bench/NAME.py`` (whose docstring is its ``--help``), and ``gpu-check`` in
``minipaged/cuda/gpu_check.py``, which the runner ``gpu_check`` hands its arguments to.
"""

from __future__ import annotations

from minipaged.kit.cli.args import (
    NON_NEGATIVE,
    bounds,
    command,
    input_dir,
    num,
    output_dir,
    output_file,
    path,
)

# ---- bench -------------------------------------------------------------------------------------

# Timed runs per figure: enough for a stable median, few enough to finish.
REPEATS = bounds(low=1, high=1000)


def _unset(bench, name: str) -> str:
    """What an option left unset becomes, from the benchmark's own tables (``DEFAULTS``, or
    ``GPU`` and ``CPU`` for the kernel, and ``QUICK``): "(unset: 32; 4 with --quick)"."""
    def show(value) -> str:
        return " ".join(map(str, value)) if isinstance(value, list) else str(value)

    if hasattr(bench, "DEFAULTS"):
        full = show(bench.DEFAULTS[name])
    else:
        gpu, cpu = show(bench.GPU[name]), show(bench.CPU[name])
        full = gpu if gpu == cpu else f"{gpu} on cupy, {cpu} on cpu"
    quick = getattr(bench, "QUICK", {})
    quick = f"; {show(quick[name])} with --quick" if name in quick else ""
    return f"(unset: {full}{quick})"


def add_bench(sub) -> None:
    from minipaged.kit import bench
    from minipaged.kit.bench import allocator, attention, generate, generate_hf, kernel, simulate
    from minipaged.serving.memory_policy import POLICY_NAMES

    p = command(sub, "bench", "measure speed: medians and ratios against a baseline run side "
                "by side", bench.__doc__, None)
    benches = p.add_subparsers(dest="bench", metavar="NAME", required=True)

    a = command(benches, "allocator", "block manager ops/s: minipaged vs a plain manager",
                allocator.__doc__, allocator.run)
    num(a, "--requests", int, None, "requests in the trace " + _unset(allocator, "requests"))
    num(a, "--num-blocks", int, 2048, "GPU blocks")
    num(a, "--block-size", int, 16, "tokens per block")
    num(a, "--repeats", int, None, "replays of the whole trace per manager (times are summed) "
        + _unset(allocator, "repeats"), REPEATS)
    num(a, "--chunk", int, 8, "scheduling steps per chunk; the managers alternate by chunk",
        bounds(low=1, high=10**6))
    a.add_argument("--quick", action="store_true", help="a smoke test: fewer requests and runs "
                   "(an option given keeps its value)")

    t = command(benches, "attention", "paged decode attention (gather, online) vs dense NumPy",
                attention.__doc__, attention.run)
    num(t, "--seqs", int, None, "S, sequences in the batch " + _unset(attention, "seqs"))
    num(t, "--heads", int, None, "H, query heads " + _unset(attention, "heads"))
    num(t, "--kv-heads", int, None, "Hkv, KV heads " + _unset(attention, "kv_heads"))
    num(t, "--head-size", int, None, "D " + _unset(attention, "head_size"))
    num(t, "--block-size", int, 16, "BS, tokens per block")
    num(t, "--contexts", int, None, "context lengths Tk to measure "
        + _unset(attention, "contexts"), nargs="+")
    t.add_argument("--dtype", choices=("float16", "float32", "float64"), default="float32",
                   help="element type of q, K and V")
    num(t, "--repeats", int, None, "timed runs per figure (median) "
        + _unset(attention, "repeats"), REPEATS)
    t.add_argument("--no-online", action="store_true", help="skip the (slow) online method")
    t.add_argument("--quick", action="store_true", help="a tiny configuration, about a second "
                   "(an option given keeps its value)")
    num(t, "--seed", int, 0, "seed of the random q, K and V", NON_NEGATIVE)

    g = command(benches, "generate", "tokens/s of the paged engine vs the reference generator",
                generate.__doc__, generate.run)
    num(g, "--requests", int, None, "concurrent requests (unset: 32; 16 with --model)")
    num(g, "--max-tokens", int, None, "new tokens per request, at most; not with --model, "
        "whose lengths are --min-new to --max-new " + _unset(generate, "max_tokens"))
    num(g, "--block-size", int, 16, "token slots per block of the paged engine")
    num(g, "--repeats", int, None, "timed runs (the median is reported); not with --model, "
        "which runs each generator once " + _unset(generate, "repeats"), REPEATS)
    hf = g.add_argument_group("with --model: the paged engine against transformers")
    path(hf, "--model", input_dir, "a Hugging Face model directory (needs transformers)",
         metavar="DIR")
    path(hf, "--write-random-model", output_dir, "first write a random model of SmolLM2-135M's "
         "shape to DIR", metavar="DIR")
    for flag, what in (("--min-prompt", "shortest prompt, tokens"),
                       ("--max-prompt", "longest prompt, tokens"),
                       ("--min-new", "shortest output, tokens"),
                       ("--max-new", "longest output, tokens")):
        num(hf, flag, int, None, f"{what} " + _unset(generate_hf, flag[2:].replace("-", "_")))
    num(hf, "--seed", int, None, "draws prompts and lengths " + _unset(generate_hf, "seed"),
        NON_NEGATIVE)

    k = command(benches, "kernel", "the CUDA paged attention kernel (GPU via CuPy, or the CPU "
                "harness): correctness, then time, bandwidth and a contiguous baseline",
                kernel.__doc__, kernel.run)
    k.add_argument("--backend", choices=("cupy", "cpu"), default="cupy",
                   help="cupy: the GPU (needs CuPy and a device); cpu: the emulation harness")
    num(k, "--seqs", int, None, "S " + _unset(kernel, "seqs"))
    num(k, "--heads", int, None, "H, query heads " + _unset(kernel, "heads"))
    num(k, "--kv-heads", int, None, "Hkv, KV heads " + _unset(kernel, "kv_heads"))
    k.add_argument("--head-size", type=int, choices=(64, 128),
                   help="D " + _unset(kernel, "head_size"))
    k.add_argument("--block-size", type=int, default=16, choices=(8, 16, 32), help="BS")
    num(k, "--contexts", int, None, "context lengths " + _unset(kernel, "contexts"), nargs="+")
    k.add_argument("--dtype", choices=("float16", "float32"), default="float16",
                   help="element type of q, K and V")
    num(k, "--repeats", int, None, "timed runs per figure " + _unset(kernel, "repeats"),
        REPEATS)
    k.add_argument("--quick", action="store_true", help="a tiny configuration, seconds (an "
                   "option given keeps its value)")
    num(k, "--seed", int, 0, "seed of the random q, K and V", NON_NEGATIVE)

    s = command(benches, "simulate", "requests simulated per second (1K / 10K / 100K)",
                simulate.__doc__, simulate.run)
    s.add_argument("--quick", action="store_true", help="fewer requests (--sizes, when given, "
                   "keeps its value)")
    num(s, "--sizes", int, None, "request counts to run " + _unset(simulate, "sizes"),
        nargs="+")
    s.add_argument("--policy", default="paged", choices=POLICY_NAMES, help="memory policy")
    num(s, "--block-size", int, 16, "tokens per block")


# ---- gpu-check ---------------------------------------------------------------------------------

def add_gpu_check(sub) -> None:
    p = command(sub, "gpu-check", "with an NVIDIA GPU and CuPy: check every CUDA kernel, probe "
                "its limits, measure its bandwidth, write a JSON report (exit 3 without a GPU)",
                "On a machine with an NVIDIA GPU and CuPy: print the device, CuPy and NVRTC\n"
                "versions and each kernel's registers and occupancy; check every kernel version\n"
                "against the NumPy oracle; probe the launch limits; measure K/V bandwidth\n"
                "against a device-to-device copy; write a JSON report. Without a GPU it says so\n"
                "in one line and exits with status 3.",
                gpu_check)
    path(p, "--out", output_file, "where to write the JSON report", default="gpu-check.json")


def gpu_check(args) -> int:
    from minipaged.cuda import gpu_check as checker  # the command's logic lives with the kernels

    return checker.main(args.out)
