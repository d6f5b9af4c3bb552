"""Tokens per second of the paged engine and of the reference generator, side by side.

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


def run(args) -> int:
    import importlib.util

    if args.model or args.write_random_model:
        from minipaged.kit.bench import generate_hf

        args.requests = args.requests or 16
        return generate_hf.run(args)
    args.requests = 32 if args.requests is None else args.requests
    from rich.console import Console
    from rich.table import Table

    from minipaged._install import TORCH_HINT
    from minipaged.kit.cli.common import refuse_if_too_big

    if importlib.util.find_spec("torch") is None:
        raise ValueError(TORCH_HINT)
    refuse_if_too_big(f"--requests={args.requests} and --block-size={args.block_size}",
                      args.requests * 50_000 + 4096 * args.block_size * 1024)
    import torch

    from minipaged.kit.bench import median_time
    from minipaged.model import corpus
    from minipaged.model.checkpoint import load_model
    from minipaged.model.engine import LLM
    from minipaged.model.reference import ReferenceGenerator
    from minipaged.model.sampling import SamplingParams

    torch.set_num_threads(1)
    model = load_model()
    starts = corpus.all_starts()
    prompts = [corpus.prompt_for(starts[-1 - i % len(starts)]) for i in range(args.requests)]
    params = SamplingParams(max_tokens=args.max_tokens)
    llm = LLM(model, num_blocks=4096, block_size=args.block_size)  # 1 KiB a slot at most
    ref = ReferenceGenerator(model)
    counts = {}

    def run_engine():
        counts["paged"] = sum(len(o.outputs[0].token_ids) for o in llm.generate(prompts, params))

    def run_ref():
        counts["ref"] = sum(len(o.outputs[0].token_ids) for o in ref.generate(prompts, params))

    t_paged = median_time(run_engine, repeats=args.repeats, warmup=1)
    t_ref = median_time(run_ref, repeats=args.repeats, warmup=0)
    if counts["paged"] != counts["ref"]:   # not bad input: a bug, so a traceback is right
        raise AssertionError(f"token counts differ: paged {counts['paged']}, reference "
                             f"{counts['ref']}")
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
