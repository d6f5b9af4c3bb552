"""``minipaged bench generate``: tokens per second, paged engine versus the reference generator.

Both generate greedy completions for the same requests (32 prompts by default, "count down
from 59:" down to "count down from 28:") with the shipped tiny model on the CPU. The reference
generator runs one sequence at a time over its own contiguous cache; the paged engine runs all
of them as one continuous batch, so each step is one forward pass over up to 32 tokens instead
of 32 passes over one. With a model this small a step costs mostly fixed Python and torch
overhead per layer, and batching pays that overhead once per step instead of once per
sequence: that is where the ratio comes from (on a GPU the same argument holds for reading the
weights, paper section 2.3).

With ``--model DIR`` (a Hugging Face model directory) it measures the paged engine against
transformers' batched ``generate`` instead; see generate_hf.py.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="tokens/s of the paged engine vs the reference generator",
                       description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=None,
                   help="concurrent requests (default 32; 16 with --model)")
    p.add_argument("--max-tokens", type=int, default=64,
                   help="new tokens per request, at most (default 64)")
    p.add_argument("--block-size", type=int, default=16,
                   help="token slots per block of the paged engine (default 16); the reference "
                        "generator has no blocks")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed runs, the median is reported (default 3)")
    hf = p.add_argument_group("with --model: the paged engine against transformers")
    hf.add_argument("--model", default=None, metavar="DIR",
                    help="a Hugging Face model directory (needs transformers)")
    hf.add_argument("--write-random-model", default=None, metavar="DIR",
                    help="first write a random model of SmolLM2-135M's shape to DIR")
    hf.add_argument("--min-prompt", type=int, default=20, help="shortest prompt (default 20)")
    hf.add_argument("--max-prompt", type=int, default=300, help="longest prompt (default 300)")
    hf.add_argument("--min-new", type=int, default=16, help="shortest output (default 16)")
    hf.add_argument("--max-new", type=int, default=256, help="longest output (default 256)")
    hf.add_argument("--seed", type=int, default=0, help="draws prompts and lengths (default 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.model or args.write_random_model:
        from minipaged.kit.bench import generate_hf

        args.requests = args.requests or 16
        return generate_hf.run(args)
    args.requests = 32 if args.requests is None else args.requests
    from rich.console import Console
    from rich.table import Table

    try:
        import torch
    except ImportError:
        Console(stderr=True).print("bench generate needs torch: pip install 'minipaged[torch]'")
        return 2
    from minipaged.kit.bench import median_time
    from minipaged.model import corpus
    from minipaged.model.checkpoint import load_model
    from minipaged.model.engine import LLM
    from minipaged.model.reference import ReferenceGenerator
    from minipaged.model.sampling import SamplingParams

    for flag in ("requests", "max_tokens", "repeats", "block_size"):
        if getattr(args, flag) < 1:
            Console(stderr=True).print(f"bench generate: --{flag.replace('_', '-')}="
                                       f"{getattr(args, flag)} must be >= 1")
            return 2
    torch.set_num_threads(1)
    model = load_model()
    starts = corpus.all_starts()
    prompts = [corpus.prompt_for(starts[-1 - i % len(starts)]) for i in range(args.requests)]
    params = SamplingParams(max_tokens=args.max_tokens)
    llm = LLM(model, num_blocks=4096, block_size=args.block_size)
    ref = ReferenceGenerator(model)
    counts = {}

    def run_engine():
        counts["paged"] = sum(len(o.outputs[0].token_ids) for o in llm.generate(prompts, params))

    def run_ref():
        counts["ref"] = sum(len(o.outputs[0].token_ids) for o in ref.generate(prompts, params))

    t_paged = median_time(run_engine, repeats=args.repeats, warmup=1)
    t_ref = median_time(run_ref, repeats=args.repeats, warmup=0)
    if counts["paged"] != counts["ref"]:
        raise SystemExit(f"token counts differ: paged {counts['paged']} vs ref {counts['ref']}")
    table = Table(title=f"{args.requests} concurrent requests, greedy, <= {args.max_tokens} "
                        f"new tokens each (torch threads 1, median of {args.repeats})")
    for col in ("generator", "tokens", "seconds", "tokens/s"):
        table.add_column(col, justify="right" if col != "generator" else "left")
    table.add_row("reference (contiguous, one at a time)", str(counts["ref"]), f"{t_ref:.2f}",
                  f"{counts['ref'] / t_ref:.0f}")
    table.add_row(f"paged engine (block {args.block_size}, batched)", str(counts["paged"]),
                  f"{t_paged:.2f}", f"{counts['paged'] / t_paged:.0f}")
    console = Console()
    console.print(table)
    console.print(f"paged / reference throughput: {t_ref / t_paged:.2f}x")
    return 0
