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

from rich.console import Console

from minipaged.kit.bench import fill_unset, medians
from minipaged.kit.cli.common import need_torch, refuse_if_too_big, refuse_unused, table
from minipaged.model import corpus
from minipaged.model.checkpoint import load_model
from minipaged.model.sampling import SamplingParams

# The tiny model's options when not given (--model DIR runs once, on lengths of its own).
DEFAULTS = dict(max_tokens=64, repeats=3)


def run(args) -> int:
    from minipaged.kit.bench import generate_hf

    if args.model and args.write_random_model:
        raise ValueError(f"--write-random-model={args.write_random_model!r} writes the model "
                         f"that is then measured, and --model={args.model!r} names another; "
                         "expected one of them")
    if args.model or args.write_random_model:
        mode = "--model DIR" if args.model else "--write-random-model DIR"
        refuse_unused(args, f"{mode} runs each generator once, for output lengths drawn from "
                      "--min-new to --max-new", {f"--{name.replace('_', '-')}": (name, None)
                                                 for name in DEFAULTS},
                      f"{mode} without them (--min-new and --max-new set the lengths)")
        args.requests = args.requests or 16
        return generate_hf.run(args)
    given = [f"--{name.replace('_', '-')}={getattr(args, name)}" for name in generate_hf.DEFAULTS
             if getattr(args, name) is not None]
    if given:  # the tiny model's requests are fixed: these would not be used
        raise ValueError(f"{', '.join(given)} shape the requests of --model DIR (or "
                         "--write-random-model DIR); without it the prompts are the counting "
                         "ones of the tiny model")
    args.requests = args.requests or 32
    fill_unset(args, DEFAULTS, {})
    need_torch()
    refuse_if_too_big(f"--requests={args.requests} and --block-size={args.block_size}",
                      args.requests * 50_000 + 4096 * args.block_size * 1024)
    import torch

    from minipaged.model.engine import LLM
    from minipaged.model.reference import ReferenceGenerator

    torch.set_num_threads(1)
    model = load_model()
    starts = corpus.all_starts()
    prompts = [corpus.prompt_for(starts[-1 - i % len(starts)]) for i in range(args.requests)]
    params = SamplingParams(max_tokens=args.max_tokens)
    llm = LLM(model, num_blocks=4096, block_size=args.block_size)  # 1 KiB a slot at most
    generators = {"paged": llm, "ref": ReferenceGenerator(model)}
    counts = {}

    def run_one(name):
        counts[name] = sum(len(o.outputs[0].token_ids)
                           for o in generators[name].generate(prompts, params))

    secs = medians({name: lambda n=name: run_one(n) for name in generators},
                   repeats=args.repeats)
    if counts["paged"] != counts["ref"]:   # not bad input: a bug, so a traceback is right
        raise AssertionError(f"token counts differ: paged {counts['paged']}, reference "
                             f"{counts['ref']}")
    t = table(f"{args.requests} concurrent requests, greedy, <= {args.max_tokens} new tokens "
              f"each (torch threads 1, median of {args.repeats})",
              ("generator", "tokens", "seconds", "tokens/s"), left=("generator",))
    for name, label in (("ref", "reference (contiguous, one at a time)"),
                        ("paged", f"paged engine (block {args.block_size}, batched)")):
        t.add_row(label, str(counts[name]), f"{secs[name]:.2f}",
                  f"{counts[name] / secs[name]:.0f}")
    console = Console()
    console.print(t)
    console.print(f"paged / reference throughput: {secs['ref'] / secs['paged']:.2f}x")
    return 0
