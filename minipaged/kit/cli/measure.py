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


def add_bench(sub) -> None:
    from minipaged.kit import bench
    from minipaged.kit.bench import allocator, attention, generate, kernel, simulate
    from minipaged.serving.memory_policy import POLICY_NAMES

    p = command(sub, "bench", "measure speed: medians and ratios against a baseline run side "
                "by side", bench.__doc__, None)
    benches = p.add_subparsers(dest="bench", metavar="NAME", required=True)

    a = command(benches, "allocator", "block manager ops/s: minipaged vs a plain manager",
                allocator.__doc__, allocator.run)
    num(a, "--requests", int, 3000, "requests in the trace")
    num(a, "--num-blocks", int, 2048, "GPU blocks")
    num(a, "--block-size", int, 16, "tokens per block")
    num(a, "--repeats", int, 3, "replays of the whole trace per manager (times are summed)",
        REPEATS)
    num(a, "--chunk", int, 8, "scheduling steps per chunk; the managers alternate by chunk",
        bounds(low=1, high=10**6))
    a.add_argument("--quick", action="store_true", help="300 requests, 1 run: a smoke test")

    t = command(benches, "attention", "paged decode attention (gather, online) vs dense NumPy",
                attention.__doc__, attention.run)
    num(t, "--seqs", int, 32, "S, sequences in the batch")
    num(t, "--heads", int, 32, "H, query heads")
    num(t, "--kv-heads", int, 8, "Hkv, KV heads")
    num(t, "--head-size", int, 128, "D")
    num(t, "--block-size", int, 16, "BS, tokens per block")
    num(t, "--contexts", int, [1024, 4096], "context lengths Tk to measure", nargs="+")
    t.add_argument("--dtype", choices=("float16", "float32", "float64"), default="float32",
                   help="element type of q, K and V")
    num(t, "--repeats", int, 5, "timed runs per figure (median)", REPEATS)
    t.add_argument("--no-online", action="store_true", help="skip the (slow) online method")
    t.add_argument("--quick", action="store_true", help="a tiny configuration (about a second)")
    num(t, "--seed", int, 0, "seed of the random q, K and V", NON_NEGATIVE)

    g = command(benches, "generate", "tokens/s of the paged engine vs the reference generator",
                generate.__doc__, generate.run)
    num(g, "--requests", int, None, "concurrent requests (unset: 32; 16 with --model)")
    num(g, "--max-tokens", int, 64, "new tokens per request, at most")
    num(g, "--block-size", int, 16, "token slots per block of the paged engine")
    num(g, "--repeats", int, 3, "timed runs (the median is reported)", REPEATS)
    hf = g.add_argument_group("with --model: the paged engine against transformers")
    path(hf, "--model", input_dir, "a Hugging Face model directory (needs transformers)",
         metavar="DIR")
    path(hf, "--write-random-model", output_dir, "first write a random model of SmolLM2-135M's "
         "shape to DIR", metavar="DIR")
    num(hf, "--min-prompt", int, 20, "shortest prompt, tokens")
    num(hf, "--max-prompt", int, 300, "longest prompt, tokens")
    num(hf, "--min-new", int, 16, "shortest output, tokens")
    num(hf, "--max-new", int, 256, "longest output, tokens")
    num(hf, "--seed", int, 0, "draws prompts and lengths", NON_NEGATIVE)

    k = command(benches, "kernel", "the CUDA paged attention kernel (GPU via CuPy, or the CPU "
                "harness): correctness, then time, bandwidth and a contiguous baseline",
                kernel.__doc__, kernel.run)
    k.add_argument("--backend", choices=("cupy", "cpu"), default="cupy",
                   help="cupy: the GPU (needs CuPy and a device); cpu: the emulation harness")
    num(k, "--seqs", int, None, "S (unset: 64 on cupy, 2 on cpu)")
    num(k, "--heads", int, 32, "H, query heads")
    num(k, "--kv-heads", int, 8, "Hkv, KV heads")
    k.add_argument("--head-size", type=int, default=128, choices=(64, 128), help="D")
    k.add_argument("--block-size", type=int, default=16, choices=(8, 16, 32), help="BS")
    num(k, "--contexts", int, None, "context lengths (unset: 1024 4096 16384 on cupy, "
        "256 1024 on cpu)", nargs="+")
    k.add_argument("--dtype", choices=("float16", "float32"), default="float16",
                   help="element type of q, K and V")
    num(k, "--repeats", int, None, "timed runs per figure (unset: 20 on cupy, 3 on cpu)",
        REPEATS)
    k.add_argument("--quick", action="store_true", help="a tiny configuration (seconds)")
    num(k, "--seed", int, 0, "seed of the random q, K and V", NON_NEGATIVE)

    s = command(benches, "simulate", "requests simulated per second (1K / 10K / 100K)",
                simulate.__doc__, simulate.run)
    s.add_argument("--quick", action="store_true", help="200 and 1K requests only")
    num(s, "--sizes", int, None, "request counts to run (unset: 1000 10000 100000)", nargs="+")
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
