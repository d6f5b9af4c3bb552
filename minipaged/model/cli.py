"""``minipaged generate``: the tiny model completing prompts through the paged KV cache.

Every prompt becomes a request; all of them run as one continuous batch through the scheduler,
and each prompt's completion is printed on one line, in prompt order (a newline inside a
completion is printed as \\n). ``--reference`` runs the plain generator (one sequence at a time,
a contiguous cache each) instead: the two must print the same thing for greedy decoding.

The shipped model was trained on one task, counting down ("count down from 42:"), so that its
answers can be checked; any printable ASCII prompt is accepted, but elsewhere it babbles.
``--model DIR`` runs a local Hugging Face Llama, Qwen2 or Qwen3 checkpoint (hf.py) through the
same engine, ``--chat`` in its chat template, with a pool of ``--kv-cache-gb`` GiB (pool.py).
"""

from __future__ import annotations

import argparse
import sys
import time

EXAMPLES = """\
examples:
  minipaged generate "count down from 42:"
  minipaged generate "count down from 9:" "count down from 23:" --block-size 4 --show-blocks
  minipaged generate "count down from 20:" --n 3 --temperature 0.8 --seed 1
  minipaged generate "count down from 12:" --beam-width 4
  minipaged generate "count down from 30:" "count down from 33:" --num-blocks 30 \\
      --block-size 4 --preemption swap      (a pool too small for both: watch the preemptions)
  minipaged generate --model ~/models/SmolLM2-135M-Instruct --chat "What is a KV cache?"
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "generate", help="complete prompts with the tiny trained model through the paged cache",
        description=__doc__, epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("prompts", nargs="+", metavar="PROMPT", help="printable ASCII prompt(s)")
    p.add_argument("--max-tokens", type=int, default=80, help="new tokens at most (default 80)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy (default); > 0 samples from softmax(logits / T)")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k likeliest (0 = all)")
    p.add_argument("--n", type=int, default=1,
                   help="parallel samples per prompt (they share the prompt's blocks)")
    p.add_argument("--beam-width", type=int, default=1, help="> 1: beam search, that many beams")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--num-blocks", type=int, help="KV pool size in blocks (default 256, or "
                   "what --kv-cache-gb holds)")
    p.add_argument("--kv-cache-gb", type=float, metavar="GB",
                   help="KV budget in GiB without --num-blocks (default 1 with --model)")
    p.add_argument("--model", metavar="DIR", help="a Hugging Face model directory (Llama, Qwen)")
    p.add_argument("--chat", action="store_true", help="with --model: apply its chat template")
    p.add_argument("--max-model-len", type=int, help="with --model: positions to keep")
    p.add_argument("--block-size", type=int, default=16, help="token slots per block")
    p.add_argument("--prefix-caching", action="store_true",
                   help="share full prompt blocks across requests by hash (vLLM v1)")
    p.add_argument("--preemption", choices=("recompute", "swap"), default="recompute",
                   help="what to do when the pool runs out (default recompute)")
    p.add_argument("--chunked-prefill", type=int, default=0, metavar="TOKENS",
                   help="split prompts over steps of at most TOKENS tokens (0: off, except for "
                        "models of more than 8192 positions, chunked by 512)")
    p.add_argument("--reference", action="store_true",
                   help="use the plain reference generator (contiguous cache, no batching)")
    p.add_argument("--show-blocks", action="store_true",
                   help="draw the block tables after every step that changes them")
    p.add_argument("--backend", choices=("numpy", "cuda-cpu", "cupy"), default="numpy",
                   help="attention and cache kernels: NumPy (default), the CUDA kernels under "
                        "their CPU emulation (cuda-cpu: needs g++), or the same kernels on a GPU "
                        "through CuPy (cupy: needs a CUDA GPU and pip install 'minipaged[gpu]')")
    p.add_argument("--checkpoint", default=None, help="a checkpoint other than the shipped one")
    p.set_defaults(func=run)


def escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _block_drawer(console, block_size):
    from rich.text import Text

    last: dict = {}

    def draw(stats):
        tables = stats.block_tables
        if tables == last.get("tables") and not stats.copies and not stats.preempted:
            return
        last["tables"] = {k: list(v) for k, v in tables.items()}
        head = Text(f"step {stats.step:3d}  prefill {stats.num_prefill_tokens:3d} tok  "
                    f"decode {stats.num_decodes:2d}  free blocks {stats.num_free_blocks}",
                    style="bold")
        if stats.copies:
            head.append(f"  copy-on-write {stats.copies}", style="magenta")
        if stats.preempted:
            head.append(f"  preempted {stats.preempted}", style="red")
        if stats.swapped_in:
            head.append(f"  swapped in {stats.swapped_in} blocks", style="yellow")
        console.print(head)
        for sid, table in sorted(tables.items()):
            line = Text(f"  seq {sid:3d} ")
            for b in table:
                line.append(f"[{b:3d}]", style=f"color({16 + (b * 37) % 200})")
            console.print(line)

    return draw


def _progress(console, every_s: float = 2.0):
    """Tokens/s over the last interval (as vLLM logs them, vllm/engine/metrics.py)."""
    last = {"t": time.perf_counter(), "pre": 0, "dec": 0}

    def show(stats):
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
    """(model, tokenizer, prompts for the engine): the tiny model, or a model directory."""
    from minipaged.model.checkpoint import load_model
    from minipaged.model.hf import load_hf

    if args.model is None:
        if args.chat or args.max_model_len is not None:
            raise ValueError("--chat and --max-model-len need --model DIR")
        return load_model(args.checkpoint), None, args.prompts
    if args.checkpoint is not None:
        raise ValueError("--checkpoint is the tiny model's; it cannot go with --model")
    try:
        model, tok = load_hf(args.model, max_seq_len=args.max_model_len)
    except ImportError as e:
        raise ValueError(f"--model needs {e.name}: pip install 'minipaged[hf]'") from e
    prompts = args.prompts
    if args.chat:   # the template writes the special tokens itself: encode without adding any
        prompts = [tok.encode(tok.chat_prompt(p), bos=False) for p in prompts]
    return model, tok, prompts


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    err = Console(stderr=True)
    try:
        import torch
    except ImportError:
        err.print("minipaged generate needs torch: pip install 'minipaged[torch]'")
        return 2
    from minipaged.model.runner import BackendUnavailableError
    from minipaged.model.sampling import SamplingParams

    torch.set_num_threads(1)
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature,
                                top_k=args.top_k, n=args.n, beam_width=args.beam_width,
                                seed=args.seed)
        model, tok, prompts = _load(args)
        t0 = time.perf_counter()
        if args.reference:
            from minipaged.model.reference import ReferenceGenerator
            outs = ReferenceGenerator(model, tokenizer=tok).generate(prompts, params)
            summary = "reference generator (contiguous cache per sequence)"
        else:
            from minipaged.model.engine import LLM
            llm = LLM(model, tokenizer=tok, num_blocks=args.num_blocks,
                      block_size=args.block_size, kv_cache_gb=args.kv_cache_gb,
                      enable_prefix_caching=args.prefix_caching, preemption=args.preemption,
                      chunked_prefill=(args.chunked_prefill > 0) or None,
                      max_num_batched_tokens=args.chunked_prefill or None,
                      backend=args.backend)
            err.print(f"[dim]{llm.pool_note}[/dim]")
            show = [_progress(err)]
            if args.show_blocks:
                show.append(_block_drawer(err, args.block_size))
            llm.on_step = lambda stats: [f(stats) for f in show]
            outs = llm.generate(prompts, params)
            summary = (f"paged engine: {llm.num_steps} steps, {llm.num_preemptions} "
                       f"preemptions, {llm.runner.num_blocks_copied} blocks copied on write, "
                       f"{llm.runner.num_blocks_swapped} swapped; pool back to "
                       f"{llm.manager.num_free_blocks}/{llm.num_blocks} free blocks")
    except (ValueError, TypeError, FileNotFoundError, BackendUnavailableError) as e:
        err.print(f"[red]error:[/red] {e}")
        return 2
    dt = time.perf_counter() - t0
    n_tok = 0
    for prompt, o in zip(args.prompts, outs):
        n_tok += sum(len(c.token_ids) for c in o.outputs)
        texts = " || ".join(escape(c.text) for c in o.outputs)
        sys.stdout.write(f"{escape(prompt)} => {texts}\n")
    sys.stdout.flush()
    err.print(f"[dim]{summary}; {n_tok} tokens in {dt:.2f} s[/dim]")
    return 0
