"""The ``minipaged`` command line: every subcommand, its arguments, and one error style.

This package owns the whole command line: the parsers are all here, and ``run.py`` holds what
each subcommand does with its arguments (the core, ``sim/`` and ``model/`` only expose plain
functions). Heavy imports (torch, the simulator) happen inside the runners, so ``--help`` is
instant.

One error style: bad input, found by the parser or by the code it calls (a ValueError, a missing
file, a size that does not fit in memory, a closed pipe ...), prints one line,
``minipaged CMD: message``, on stderr and exits with status 2; never a traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from minipaged.kit.cli import run

DESCRIPTION = """\
minipaged: vLLM's PagedAttention from scratch, in NumPy (and CUDA, and a tiny torch model).

Every number these commands print is measured by the package itself. Start with
`minipaged demo`, then read lessons/01_*.py onwards; `minipaged COMMAND --help` explains each
command. A bad argument gets one line on stderr and exit status 2 (set MINIPAGED_TRACEBACK=1
to see the Python traceback instead).
"""


class Parser(argparse.ArgumentParser):
    """argparse's own errors (an unknown option, a bad int) in the one error style."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and every option's default (flags and unset options excepted)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or "%(default)" in text \
                or action.default == argparse.SUPPRESS:
            return text
        return text + " (default: %(default)s)"


class Checked(argparse.Action):
    """Store an argument after ``check(value)`` found nothing wrong; otherwise stop with
    ``minipaged CMD: --flag=VALUE <what check said>`` (each value of a list is checked)."""

    def __init__(self, *args, check: Callable[[object], str | None], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.check = check

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        for value in values if isinstance(values, list) else [values]:
            problem = None if value is None else self.check(value)  # None: an absent "?"
            if problem:
                parser.error(f"{option_string or self.dest}={value!r} {problem}")
        setattr(namespace, self.dest, values)


def bounds(*, low: float | None = None, above: float | None = None,
           high: float | None = None, finite: bool = True) -> Callable[[float], str | None]:
    """A check for a number: ``low <= v``, ``above < v``, ``v <= high``, finite unless told."""
    def check(v: float) -> str | None:
        rules = [f"{op} {x:g}" for op, x in ((">=", low), (">", above), ("<=", high))
                 if x is not None]
        if finite and not math.isfinite(v):
            return " ".join(["must be a finite number", *rules[:1]])
        ok = ((low is None or v >= low) and (above is None or v > above)
              and (high is None or v <= high))
        return None if ok else "must be " + " and ".join(rules)
    return check


def input_dir(path: str) -> str | None:
    p = Path(path)
    if p.is_file():
        return "is a file; expected a directory"
    return None if p.is_dir() else "does not exist; expected an existing directory"


def input_file(path: str) -> str | None:
    p = Path(path)
    if p.is_dir():
        return "is a directory; expected a file"
    return None if p.is_file() else "does not exist; expected an existing file"


def output_file(path: str) -> str | None:
    p = Path(path)
    if p.is_dir():
        return "is a directory; expected a file name to write"
    parent = p.parent
    if not parent.is_dir():
        return f"is in a folder that does not exist ({str(parent)!r})"
    return None if os.access(parent, os.W_OK) else f"cannot be written (folder {str(parent)!r})"


def output_dir(path: str) -> str | None:
    p = Path(path)
    return "is a file; expected a directory" if p.exists() and not p.is_dir() else None


def workload(spec: str) -> str | None:
    from minipaged.sim.workloads import WORKLOADS

    if spec in WORKLOADS:
        return None
    problem = input_file(spec)
    return problem and f"{problem} (or one of {', '.join(sorted(WORKLOADS))})"


POSITIVE = bounds(low=1)          # counts and sizes
NON_NEGATIVE = bounds(low=0)      # seeds, offsets


def command(sub, name: str, help: str, description: str, runner, **kw) -> Parser:
    p = sub.add_parser(name, help=help, description=description, formatter_class=Formatter,
                       **kw)
    p.set_defaults(run=runner, prog=p.prog)
    return p


def num(p: Parser, flag: str, kind: type, default, help: str, check=POSITIVE, **kw) -> None:
    """An int or float option whose value is checked as it is parsed."""
    p.add_argument(flag, type=kind, default=default, help=help, action=Checked, check=check,
                   **kw)


def path(p: Parser, flag: str, check, help: str, **kw) -> None:
    p.add_argument(flag, help=help, action=Checked, check=check, **kw)


def json_out(p: Parser, what: str) -> None:
    path(p, "--json", output_file, f"write {what} as JSON to PATH", metavar="PATH")


# ---- the subcommands, in the order of the course -----------------------------------------------

def _demo(sub) -> None:
    p = command(sub, "demo", "the classroom demo: live pictures of block tables, sharing and "
                "preemption", run.DEMO_HELP, run.demo)
    p.add_argument("scene", nargs="?", metavar="SCENE",
                   help="one scene to play (default: the whole tour); see the list above")
    num(p, "--seed", int, 0, "random seed of the requests (same seed, same pictures)",
        NON_NEGATIVE)
    num(p, "--width", int, None, "force the layout width in columns (60 to 500), e.g. for a "
        "projector", bounds(high=500))
    num(p, "--speed", float, 1.5, "seconds per frame when autoplaying", bounds(above=0))
    p.add_argument("--autoplay", action="store_true", help="start in autoplay (a pauses)")
    path(p, "--svg", output_dir, "also write each frame as an SVG file into DIR", metavar="DIR")
    path(p, "--html", output_dir, "also write each frame as an HTML file into DIR",
         metavar="DIR")
    p.add_argument("--list", action="store_true",
                   help="list the scenes and whether this checkout can play them")


def _kv_calc(sub) -> None:
    from minipaged.sim.memory import KV_DTYPE_BYTES, KV_PRESETS

    p = command(sub, "kv-calc", "KV cache arithmetic: bytes per token, slots, blocks, "
                "block-table size", run.KV_CALC_HELP, run.kv_calc)
    p.add_argument("--model", default="opt-13b", choices=sorted(KV_PRESETS),
                   help="model + GPU preset (opt-13b: A100-40GB with 12 GiB of KV cache, the "
                        "paper's setting; llama-3-8b: H100-80GB; deepseek-v2: MLA, 8 H100s)")
    num(p, "--tp", int, None, "tensor-parallel GPUs (unset: the preset's): KV bytes per GPU")
    p.add_argument("--kv-dtype", choices=sorted(KV_DTYPE_BYTES),
                   help="KV cache dtype (unset: the model's): 2 bytes per element, fp8 1")
    num(p, "--kv-cache-gb", float, None, "override the KV cache budget, in GiB",
        bounds(above=0, high=2**40))
    num(p, "--layers", int, None, "custom model: number of layers")
    num(p, "--kv-heads", int, None, "custom model: number of KV heads")
    num(p, "--head-size", int, None, "custom model: head size")
    num(p, "--dtype-bytes", int, None, "custom model: bytes per element (2 fp16, 1 fp8)")
    num(p, "--block-size", int, 16, "tokens per block")
    num(p, "--context-len", int, 2048, "tokens per request, for the per-request figures")
    num(p, "--num-requests", int, 1000, "how many requests' block tables to add up")
    num(p, "--entry-bytes", int, 4, "bytes per block-table entry (vLLM: int32 = 4)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def _sim_args(p: Parser) -> None:
    from minipaged.serving.memory_policy import POLICY_NAMES
    from minipaged.sim.memory import PRESETS

    path(p, "--workload", workload, "sharegpt, alpaca (synthetic, shaped like the paper's "
         "Fig. 11) or a JSONL file of {\"prompt_len\", \"output_len\"[, \"arrival_s\"]} lines",
         default="sharegpt")
    p.add_argument("--policy", default="paged", choices=POLICY_NAMES,
                   help="paged (vLLM) or an Orca baseline reserving max / prompt + output "
                        "rounded up to a power of two / exactly the final length")
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
                        "requests through the prefix cache (vLLM v1)")
    p.add_argument("--prefix-caching", action="store_true", help="enable prefix caching")
    p.add_argument("--preemption", choices=("recompute", "swap"), default="recompute",
                   help="how to evict a sequence group when blocks run out")
    p.add_argument("--chunked-prefill", action="store_true",
                   help="split prompts into chunks within a per-step token budget")
    num(p, "--max-num-batched-tokens", int, None,
        "per-step token budget (unset: 2048, or 512 with chunked prefill)")
    num(p, "--max-num-seqs", int, 256, "sequences per step at most")


def _simulate(sub) -> None:
    p = command(sub, "simulate", "simulate serving a workload: memory, batch, throughput",
                run.SIM_HELP, run.simulate)
    _sim_args(p)
    json_out(p, "every figure")


def _experiment(sub) -> None:
    p = command(sub, "experiment", "reproduce one of the paper's results (1-5)",
                run.EXPERIMENT_HELP, run.experiment)
    p.add_argument("number", type=int, choices=(1, 2, 3, 4, 5), help="which experiment")
    num(p, "--num-requests", int, None, "requests per simulation (unset: the experiment's own)")
    num(p, "--seed", int, 0, "simulation seed", NON_NEGATIVE)
    p.add_argument("--quick", action="store_true", help="fewer requests and points (seconds)")
    json_out(p, "the results")


def _factcheck(sub) -> None:
    p = command(sub, "factcheck", "measure every checkable claim of the interview answer",
                run.FACTCHECK_HELP, run.factcheck)
    p.add_argument("--quick", action="store_true",
                   help="smaller simulations (seconds instead of a minute or two)")
    num(p, "--seed", int, 0, "simulation seed", NON_NEGATIVE)
    json_out(p, "the findings")


def _bench(sub) -> None:
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
    num(a, "--repeats", int, 3, "replays of the whole trace per manager (times are summed)")
    num(a, "--chunk", int, 8, "scheduling steps per chunk; the managers alternate by chunk")
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
    num(t, "--repeats", int, 5, "timed runs per figure (median)")
    t.add_argument("--no-online", action="store_true", help="skip the (slow) online method")
    t.add_argument("--quick", action="store_true", help="a tiny configuration (about a second)")
    num(t, "--seed", int, 0, "seed of the random q, K and V", NON_NEGATIVE)

    g = command(benches, "generate", "tokens/s of the paged engine vs the reference generator",
                generate.__doc__, generate.run)
    num(g, "--requests", int, None, "concurrent requests (unset: 32; 16 with --model)")
    num(g, "--max-tokens", int, 64, "new tokens per request, at most")
    num(g, "--block-size", int, 16, "token slots per block of the paged engine")
    num(g, "--repeats", int, 3, "timed runs (the median is reported)")
    hf = g.add_argument_group("with --model: the paged engine against transformers")
    hf.add_argument("--model", default=None, metavar="DIR",
                    help="a Hugging Face model directory (needs transformers)")
    hf.add_argument("--write-random-model", default=None, metavar="DIR",
                    help="first write a random model of SmolLM2-135M's shape to DIR")
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
    num(k, "--repeats", int, None, "timed runs per figure (unset: 20 on cupy, 3 on cpu)")
    k.add_argument("--quick", action="store_true", help="a tiny configuration (seconds)")
    num(k, "--seed", int, 0, "seed of the random q, K and V", NON_NEGATIVE)

    s = command(benches, "simulate", "requests simulated per second (1K / 10K / 100K)",
                simulate.__doc__, simulate.run)
    s.add_argument("--quick", action="store_true", help="200 and 1K requests only")
    num(s, "--sizes", int, None, "request counts to run (unset: 1000 10000 100000)", nargs="+")
    s.add_argument("--policy", default="paged", choices=POLICY_NAMES, help="memory policy")
    num(s, "--block-size", int, 16, "tokens per block")


def _generate(sub) -> None:
    p = command(sub, "generate", "complete prompts with the tiny trained model through the "
                "paged cache", run.GENERATE_HELP, run.generate, epilog=run.GENERATE_EXAMPLES)
    p.add_argument("prompts", nargs="+", metavar="PROMPT", help="printable ASCII prompt(s)")
    num(p, "--max-tokens", int, 80, "new tokens at most")
    num(p, "--temperature", float, 0.0, "0 = greedy; > 0 samples from softmax(logits / T)",
        bounds(low=0))
    num(p, "--top-k", int, 0, "sample among the k likeliest (0 = all)", NON_NEGATIVE)
    num(p, "--n", int, 1, "parallel samples per prompt (they share the prompt's blocks)")
    num(p, "--beam-width", int, 1, "> 1: beam search, that many beams")
    num(p, "--seed", int, 0, "sampling seed", NON_NEGATIVE)
    num(p, "--num-blocks", int, None, "KV pool size in blocks (unset: 256 for the tiny model, "
        "else what --kv-cache-gb holds)")
    num(p, "--kv-cache-gb", float, None, "KV budget in GiB when --num-blocks is unset (unset: "
        "1 with --model)", bounds(above=0), metavar="GB")
    path(p, "--model", input_dir, "a Hugging Face model directory (Llama, Qwen2, Qwen3)")
    p.add_argument("--chat", action="store_true", help="with --model: apply its chat template")
    num(p, "--max-model-len", int, None, "with --model: positions to keep (unset: the config's)")
    num(p, "--block-size", int, 16, "token slots per block")
    p.add_argument("--prefix-caching", action="store_true",
                   help="share full prompt blocks across requests by hash (vLLM v1)")
    p.add_argument("--preemption", choices=("recompute", "swap"), default="recompute",
                   help="what to do when the pool runs out")
    num(p, "--chunked-prefill", int, 0, "split prompts over steps of at most TOKENS tokens "
        "(0: off, except for models of more than 8192 positions, chunked by 512)", NON_NEGATIVE,
        metavar="TOKENS")
    p.add_argument("--reference", action="store_true",
                   help="use the plain reference generator (contiguous cache, no batching)")
    p.add_argument("--show-blocks", action="store_true",
                   help="draw the block tables after every step that changes them (stderr)")
    p.add_argument("--backend", choices=("numpy", "cuda-cpu", "cupy"), default="numpy",
                   help="attention and cache kernels: NumPy, the CUDA kernels under their CPU "
                        "emulation (cuda-cpu: needs g++), or the same kernels on a GPU through "
                        "CuPy (cupy: needs a CUDA GPU and CuPy)")
    path(p, "--checkpoint", input_file, "a checkpoint other than the shipped one")


def _train(sub) -> None:
    from minipaged.model.checkpoint import DEFAULT_CHECKPOINT
    from minipaged.model.train import TrainSettings

    d = TrainSettings()
    p = command(sub, "train", "train the tiny counting model (a few minutes of CPU)",
                run.TRAIN_HELP, run.train)
    num(p, "--seed", int, d.seed, "seed of the examples and the initial weights", NON_NEGATIVE)
    num(p, "--steps", int, d.steps, "optimizer steps")
    num(p, "--batch-size", int, d.batch_size, "examples per step")
    num(p, "--lr", float, d.lr, "AdamW peak learning rate", bounds(above=0))
    num(p, "--warmup", int, d.warmup, "warm-up steps before the cosine decay", NON_NEGATIVE)
    num(p, "--weight-decay", float, d.weight_decay, "AdamW weight decay", bounds(low=0))
    num(p, "--threads", int, d.threads, "torch CPU threads")
    num(p, "--num-eval", int, d.num_eval, "held-out prompts scored after training")
    path(p, "--out", output_file, "where to write the checkpoint (and its .json report)",
         default=str(DEFAULT_CHECKPOINT))


def _check(sub) -> None:
    p = command(sub, "check", "grade an exercise with hidden tests", run.CHECK_HELP, run.check)
    p.add_argument("exercise", nargs="?", metavar="PATH|NUMBER",
                   help="an exercise number (1-14) or the path of your file")
    p.add_argument("--list", action="store_true", help="list the exercises and exit")
    p.add_argument("--solution", action="store_true",
                   help="grade exercises/solutions/NN_*.py instead (spoiler)")
    num(p, "--timeout", float, 20.0, "seconds the import or one case may run before it is "
        "stopped, so an endless loop is reported instead of hanging (0 = no limit)",
        bounds(low=0))


def _quiz(sub) -> None:
    p = command(sub, "quiz", "interview drills on PagedAttention, answered with live numbers",
                run.QUIZ_HELP, run.quiz)
    p.add_argument("--answers", action="store_true", help="print every answer, never wait")
    p.add_argument("--only", action="append", metavar="KEY|N",
                   help="only this drill (repeatable)")
    p.add_argument("--list", action="store_true", help="list the drills and exit")
    p.add_argument("--glossary", action="store_true", help="print the glossary and exit")
    num(p, "--num-requests", int, 300, "requests per simulation behind the answers")
    num(p, "--seed", int, 0, "simulation seed", NON_NEGATIVE)


def _present(sub) -> None:
    p = command(sub, "present", "present the slide deck in the terminal; regenerate its "
                "figures", run.PRESENT_HELP, run.present)
    path(p, "deck", input_file, "the Marp deck to present", nargs="?", metavar="slides/NAME.md")
    p.add_argument("--notes", action="store_true", help="show speaker notes from the start")
    num(p, "--slide", int, 1, "start at this slide (1-based)")
    p.add_argument("--build-figures", action="store_true",
                   help="regenerate every figure in slides/figures/ (demo frames + simulator)")
    p.add_argument("--check-figures", action="store_true",
                   help="exit 1 when a committed figure differs from a fresh rendering")
    path(p, "--figures-dir", output_dir, "where the figures live (unset: slides/figures)")


def _run_gpu_check(args) -> int:
    from minipaged.cuda import gpu_check  # the command's logic lives with the kernels

    return gpu_check.main(["--out", args.out])


def _gpu_check(sub) -> None:
    p = command(sub, "gpu-check", "with an NVIDIA GPU and CuPy: check every CUDA kernel, probe "
                "its limits, measure its bandwidth, write a JSON report (exit 3 without a GPU)",
                "On a machine with an NVIDIA GPU and CuPy: print the device, CuPy and NVRTC\n"
                "versions and each kernel's registers and occupancy; check every kernel version\n"
                "against the NumPy oracle; probe the launch limits; measure K/V bandwidth\n"
                "against a device-to-device copy; write a JSON report. Without a GPU it says so\n"
                "in one line and exits with status 3.",
                _run_gpu_check)
    path(p, "--out", output_file, "where to write the JSON report", default="gpu-check.json")


COMMANDS = (_demo, _kv_calc, _simulate, _experiment, _factcheck, _bench, _generate, _train,
            _check, _quiz, _present, _gpu_check)


def build_parser() -> Parser:
    parser = Parser(prog="minipaged", description=DESCRIPTION, formatter_class=Formatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command line; returns the exit status (0 ok, 1 a check failed, 2 bad input)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:             # --help (0) or an argument error, already printed (2)
        return e.code if isinstance(e.code, int) else 2
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:             # e.g. `minipaged quiz --answers | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _refuse(args.prog, "the output pipe closed before the output ended")
    except SystemExit as e:             # rich's consoles turn a closed pipe into exit(1)
        if isinstance(e.__context__, BrokenPipeError):
            return _refuse(args.prog, "the output pipe closed before the output ended")
        raise
    except Exception as e:
        if os.environ.get("MINIPAGED_TRACEBACK") or not isinstance(e, run.user_errors()):
            raise
        return _refuse(args.prog, run.describe(e))


def _refuse(prog: str, message: str) -> int:
    try:
        print(f"{prog}: {message}", file=sys.stderr)
    except OSError:                     # stderr is gone too: the exit status still says it
        pass
    return 2


if __name__ == "__main__":
    sys.exit(main())
