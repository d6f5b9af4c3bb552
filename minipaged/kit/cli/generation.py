"""The ``generate`` command: prompts through the paged cache.

Its ``--help`` text, its parser (``add_generate``) and its runner (``generate``): the tiny
trained model, or a Hugging Face one with ``--model DIR``, runs through the paged engine
(``minipaged/model/engine.py``) or the plain reference generator, and its progress and block
tables are drawn on stderr. ``train``, which retrains the shipped model, is ``training.py``.
"""

from __future__ import annotations

import pickle
import sys
import time
from contextlib import nullcontext

from rich.console import Console
from rich.text import Text

from minipaged._install import HF_EXTRA  # the install hint, one text for every command
from minipaged.kit.cli.args import (
    NON_NEGATIVE,
    bounds,
    command,
    input_dir,
    input_file,
    num,
    path,
    unset,
)
from minipaged.kit.cli.common import describe, flag_words, in_flag_words, need_torch, reading
from minipaged.kit.cli.generation_checks import (
    check_beams_in_one_step,
    check_flags,
    check_prompts,
    too_small,
)
from minipaged.model.checkpoint import load_model
from minipaged.model.pool import DEFAULT_KV_CACHE_GB

GENERATE_HELP = """\
The tiny model completing prompts through the paged KV cache.

Every prompt becomes a request; all of them run as one continuous batch through the scheduler,
and each prompt's completion is printed on one line, in prompt order (a newline inside a
completion is printed as \\n). --reference runs the plain generator (one sequence at a time,
a contiguous cache each) instead: the two must print the same thing for greedy decoding.

The shipped model was trained on one task, counting down ("count down from 42:"), so that its
answers can be checked; any printable ASCII prompt is accepted, but elsewhere it babbles.
"""

GENERATE_EXAMPLES = """\
examples:
  minipaged generate "count down from 42:"
  minipaged generate "count down from 9:" "count down from 23:" --block-size 4 --show-blocks
  minipaged generate "count down from 20:" --n 3 --temperature 0.8 --seed 1
  minipaged generate "count down from 12:" --beam-width 4
  minipaged generate "count down from 30:" "count down from 33:" --num-blocks 30 \\
      --block-size 4 --preemption swap      (a pool too small for both: watch the preemptions)
"""


POOL_FLAGS = {"backend": "--backend", "num_blocks": "--num-blocks", "block_size": "--block-size",
              "kv_cache_gb": "--kv-cache-gb"}


def add_generate(sub) -> None:
    p = command(sub, "generate", "complete prompts with the tiny trained model through the "
                "paged cache", GENERATE_HELP, generate, epilog=GENERATE_EXAMPLES)
    p.add_argument("prompts", nargs="+", metavar="PROMPT", help="printable ASCII prompt(s)")
    num(p, "--max-tokens", int, 80, "new tokens at most")
    num(p, "--temperature", float, 0.0, "0 = greedy; > 0 samples from softmax(logits / T)",
        bounds(low=0))
    num(p, "--top-k", int, 0, "with --temperature above 0: sample among the k likeliest (0 = "
        "all)", NON_NEGATIVE)
    samples = p.add_mutually_exclusive_group()
    num(samples, "--n", int, 1, "parallel samples per prompt (they share the prompt's blocks)")
    num(samples, "--beam-width", int, 1, "> 1: beam search, that many beams")
    num(p, "--seed", int, None, "with --temperature above 0: the sampling seed (unset: 0)",
        NON_NEGATIVE)
    path(p, "--model", input_dir, "a Hugging Face model directory (Llama, Qwen2, Qwen3)")
    p.add_argument("--chat", action="store_true", help="with --model: apply its chat template")
    num(p, "--max-model-len", int, None, "with --model: positions to keep (unset: the config's)")
    p.add_argument("--reference", action="store_true",
                   help="use the plain reference generator (contiguous cache, no batching)")
    path(p, "--checkpoint", input_file, "a checkpoint other than the shipped one")
    engine = p.add_argument_group("the paged engine (not with --reference)")
    pool = engine.add_mutually_exclusive_group()
    num(pool, "--num-blocks", int, None, "KV pool size in blocks (unset: 256 for the tiny "
        "model, else what --kv-cache-gb holds)")
    num(pool, "--kv-cache-gb", float, None, "KV budget in GiB, instead of --num-blocks (unset: "
        "1 with --model)", bounds(above=0), metavar="GB")
    num(engine, "--block-size", int, 16, "token slots per block")
    engine.add_argument("--prefix-caching", action="store_true",
                        help="share full prompt blocks across requests by hash, as "
                             "vLLM's automatic prefix caching does")
    engine.add_argument("--preemption", choices=("recompute", "swap"), default="recompute",
                        help="what to do when the pool runs out")
    num(engine, "--chunked-prefill", int, 0, "split prompts over steps of at most TOKENS "
        "tokens (0: off, except for models of more than 8192 positions, chunked by 512)",
        NON_NEGATIVE, metavar="TOKENS")
    engine.add_argument("--show-blocks", action="store_true",
                        help="draw the block tables after every step that changes them (stderr)")
    engine.add_argument("--backend", choices=("numpy", "cuda-cpu", "cupy"), default="numpy",
                        help="attention and cache kernels: NumPy, the CUDA kernels under their "
                             "CPU emulation (cuda-cpu: needs g++), or the same kernels on a GPU "
                             "through CuPy (cupy: needs a CUDA GPU and CuPy)")
    # What --reference would ignore: each engine option, by its flag, and its unset value.
    p.set_defaults(engine_options=unset(p, *(a.dest for a in engine._group_actions)))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _block_drawer(console):
    """An ``on_step`` callback that draws the block tables when a step changed them."""
    last: dict = {}

    def draw(stats) -> None:
        tables = stats.block_tables
        if tables == last.get("tables") and not stats.copies and not stats.preempted:
            return
        last["tables"] = {k: list(v) for k, v in tables.items()}
        head = Text(f"step {stats.step:3d}  prefill {stats.num_prefill_tokens:3d} tok  "
                    f"decode {stats.num_decodes:2d}  free blocks {stats.num_free_blocks}",
                    style="bold")
        for what, value, style in (("copy-on-write", stats.copies, "magenta"),
                                   ("preempted", stats.preempted, "red"),
                                   ("swapped in", stats.swapped_in, "yellow")):
            if value:
                head.append(f"  {what} {value}", style=style)
        console.print(head)
        for sid, table in sorted(tables.items()):
            line = Text(f"  seq {sid:3d} ")
            for b in table:
                line.append(f"[{b:3d}]", style=f"color({16 + (b * 37) % 200})")
            console.print(line)

    return draw


def _progress(console, every_s: float = 2.0):
    """An ``on_step`` callback: prefill and decode tokens/s over the last ``every_s`` seconds."""
    last = {"t": time.perf_counter(), "pre": 0, "dec": 0}

    def show(stats) -> None:
        last["pre"] += stats.num_prefill_tokens
        last["dec"] += stats.num_decodes
        dt = time.perf_counter() - last["t"]
        if dt >= every_s:
            console.print(f"[dim]step {stats.step}: prefill {last['pre'] / dt:,.0f} tok/s, "
                          f"decode {last['dec'] / dt:,.0f} tok/s, "
                          f"{stats.num_free_blocks} free blocks[/dim]")
            last.update(t=time.perf_counter(), pre=0, dec=0)

    return show


def _load(args):
    """(model, tokenizer or None, prompts as text or token ids): the Hugging Face model of
    ``--model DIR``, the tiny model of ``--checkpoint``, or the shipped tiny model."""
    if args.model is None:
        given = [flag for flag, on in (("--chat", args.chat), (f"--max-model-len="
                 f"{args.max_model_len}", args.max_model_len is not None)) if on]
        if given:
            raise ValueError(f"{' and '.join(given)} need{'s' * (len(given) == 1)} --model DIR")
        if args.checkpoint is None:
            return load_model(), None, args.prompts
        try:
            with reading("--checkpoint", args.checkpoint):
                return load_model(args.checkpoint), None, args.prompts
        except (pickle.UnpicklingError, RuntimeError, EOFError, KeyError) as e:
            # torch's own reason is a paragraph (weights_only advice): its first sentence says it
            raise ValueError(f"--checkpoint={args.checkpoint!r} is not a minipaged checkpoint "
                             f"({describe(e).split('. ')[0].rstrip('.')})") from None
    if args.checkpoint is not None:
        raise ValueError("--checkpoint is the tiny model's; it cannot go with --model")
    try:
        from minipaged.model.hf import config_from_hf, load_hf

        given = args.max_model_len is not None      # the API's max_seq_len is then the flag's
        with flag_words({"max_seq_len": "--max-model-len"}) if given else nullcontext():
            positions = config_from_hf(args.model, max_seq_len=args.max_model_len).max_seq_len
        check_beams_in_one_step(args, positions)    # before the weights load
        model, tok = load_hf(args.model, max_seq_len=args.max_model_len)
    except ImportError as e:
        raise ValueError(f"--model needs {e.name}: from a checkout, {HF_EXTRA}") from None
    prompts = args.prompts
    if args.chat:   # the template writes the special tokens itself: encode without adding any
        prompts = [tok.encode(tok.chat_prompt(p), bos=False) for p in prompts]
    return model, tok, prompts


def generate(args) -> int:
    params = check_flags(args)
    check_prompts(args)
    need_torch()
    import torch

    torch.set_num_threads(1)
    err = Console(stderr=True)
    model, tokenizer, prompts = _load(args)
    t0 = time.perf_counter()
    if args.reference:
        from minipaged.model.reference import ReferenceGenerator

        outs = ReferenceGenerator(model, tokenizer=tokenizer).generate(prompts, params)
        summary = "reference generator (contiguous cache per sequence)"
    else:
        from minipaged.model.engine import LLM, PoolTooSmallError
        from minipaged.model.runner import BackendUnavailableError

        # With --model, LLM gets the loaded model, not its folder: give it the folder's default
        # budget (1 GiB, as --help says) instead of a model object's 256 blocks.
        kv_cache_gb = args.kv_cache_gb
        if kv_cache_gb is None and args.model is not None:
            kv_cache_gb = DEFAULT_KV_CACHE_GB
        # LLM refuses a pool this machine cannot hold, or a budget holding no block, before it
        # allocates (pool.py's rule); here in the flags' words.
        with flag_words(POOL_FLAGS, (ValueError, BackendUnavailableError)):
            llm = LLM(model, tokenizer=tokenizer, num_blocks=args.num_blocks,
                      block_size=args.block_size, kv_cache_gb=kv_cache_gb,
                      enable_prefix_caching=args.prefix_caching, preemption=args.preemption,
                      chunked_prefill=(args.chunked_prefill > 0) or None,
                      max_num_batched_tokens=args.chunked_prefill or None,
                      backend=args.backend)
        show = [_progress(err)]
        if args.show_blocks:
            show.append(_block_drawer(err))
        llm.on_step = lambda stats: [f(stats) for f in show]
        try:
            outs = llm.generate(prompts, params)
        except PoolTooSmallError as e:      # refused before any step
            raise ValueError(too_small(args, e, llm.num_blocks, kv_cache_gb)) from None
        err.print(f"[dim]{in_flag_words(llm.pool_note, POOL_FLAGS)}[/dim]")  # API words
        summary = (f"paged engine: {llm.num_steps} steps, {llm.num_preemptions} preemptions, "
                   f"{llm.runner.num_blocks_copied} blocks copied on write, "
                   f"{llm.runner.num_blocks_swapped} swapped; pool back to "
                   f"{llm.manager.num_free_blocks}/{llm.num_blocks} free blocks")
    dt = time.perf_counter() - t0
    for prompt, o in zip(args.prompts, outs):
        texts = " || ".join(_escape(c.text) for c in o.outputs)
        sys.stdout.write(f"{_escape(prompt)} => {texts}\n")
    sys.stdout.flush()
    n_tok = sum(len(c.token_ids) for o in outs for c in o.outputs)
    err.print(f"[dim]{summary}; {n_tok} tokens in {dt:.2f} s[/dim]")
    return 0
