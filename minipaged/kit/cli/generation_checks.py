"""What ``generate`` refuses, in its flags' words: flags the chosen generator or decoding would
not use (the sampling flags: SamplingParams' own refusal, reworded), prompts the tiny model
cannot read, more samples than memory holds, and the engine's refusals (a pool too small or too
big, beams on a model whose prompts are chunked) said as what to type. ``generation.py`` calls
them, all but the last before any work.
"""

from __future__ import annotations

import re

from minipaged.kit.cli.common import flag_words, refuse_if_too_big, refuse_unused
from minipaged.model.engine_samples import BYTES_PER_SAMPLE  # what one sample holds
from minipaged.model.sampling import SamplingParams

SAMPLING_FLAGS = {"max_tokens": "--max-tokens", "temperature": "--temperature", "top_k": "--top-k",
                  "n": "--n", "beam_width": "--beam-width", "seed": "--seed"}


def check_flags(args) -> SamplingParams:
    """What the parser cannot see, before any work: flags the chosen generator or decoding
    would not use, and more samples than memory holds. Returns the sampling flags as
    SamplingParams, which refuses the sampling flags that greedy decoding and beam search would
    not read (in the flags' words here); an unset --seed is 0 where sampling draws."""
    if args.reference:
        refuse_unused(args, "--reference runs the plain generator, without the paged engine's "
                      "pool, scheduler or kernels", args.engine_options,
                      "--reference without them")
    if args.beam_width > 1 and args.chunked_prefill:
        raise ValueError(f"--beam-width={args.beam_width} samples every beam of a request in "
                         f"the same step, which --chunked-prefill={args.chunked_prefill} "
                         "splits; expected one of them")
    draws = args.temperature > 0 and args.beam_width == 1
    with flag_words(SAMPLING_FLAGS):
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                top_k=args.top_k, n=args.n, beam_width=args.beam_width,
                                seed=0 if draws and args.seed is None else args.seed)
    width = f"--n={args.n}" if args.n > 1 else f"--beam-width={args.beam_width}"
    refuse_if_too_big(f"{len(args.prompts)} PROMPT(s) x {width} sequences",
                      len(args.prompts) * max(args.n, args.beam_width) * BYTES_PER_SAMPLE)
    return params


def check_prompts(args) -> None:
    """The tiny model's prompts, read by its tokenizer before any work: a character outside its
    vocabulary is named by PROMPT and place (the tokenizer's ``text[i]`` is the API's word)."""
    if args.model is not None:
        return
    from minipaged.model.tokenizer import CharTokenizer

    for k, prompt in enumerate(args.prompts, 1):
        try:
            CharTokenizer().encode(prompt)
        except ValueError as e:
            m = re.match(r"text\[(\d+)\] = ('.*?'|\".*?\") ", str(e))
            where = f"its character {int(m[1]) + 1}, {m[2]}, " if m else ""
            raise ValueError(f"PROMPT {k} {prompt!r:.60}: {where}{str(e)[m.end() if m else 0:]}"
                             ) from None


def check_beams_in_one_step(args, positions: int) -> None:
    """Beam search samples every beam of a request in one step, which the chunked prefill of a
    long-context model (on by itself, engine.py) cannot do: refused before the weights load."""
    from minipaged.model.engine import LONG_CONTEXT

    if args.beam_width > 1 and not args.reference and positions > LONG_CONTEXT:
        raise ValueError(f"--beam-width={args.beam_width} samples every beam of a request in "
                         f"the same step, but the prompts of a model of {positions:,} "
                         f"positions (more than {LONG_CONTEXT:,}) are split over steps "
                         "(chunked prefill, on for such models even with --chunked-prefill=0); "
                         f"expected a --max-model-len of at most {LONG_CONTEXT}, or --reference")


def too_small(args, e, blocks: int, kv_cache_gb: float | None) -> str:
    """The engine's refusal of a request no pool of this size can run, in the flags' words."""
    if args.num_blocks is not None:
        source = "given"
    elif kv_cache_gb is not None:
        source = f"what --kv-cache-gb={kv_cache_gb:g} holds"
    else:
        source = "the default"
    flag, value = ("--n", args.n) if args.n > 1 else ("--beam-width", args.beam_width)
    together = e.num_seqs > 1    # a prompt's forked samples or beams, which need room at once
    return (f"PROMPT {e.prompt_index + 1}" + (f" with {flag}={value}" if together else "")
            + f": {e.num_seqs} sequence(s) of up to {e.final_len} tokens do not fit, even alone,"
            f" in the pool's {blocks:,} blocks of --block-size={args.block_size} ({source}); "
            "expected a larger --num-blocks or --kv-cache-gb, or a smaller --max-tokens"
            + (f" or {flag}" if together else ""))
