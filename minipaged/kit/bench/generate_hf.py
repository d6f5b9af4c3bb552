"""``minipaged bench generate --model DIR``: the paged engine against transformers' generate.

The same requests go to both, in the same process, one CPU thread each (torch.set_num_threads
(1); run with OPENBLAS_NUM_THREADS=1 so that NumPy's attention is single-threaded too):
``--requests`` prompts of random token ids, lengths drawn from [--min-prompt, --max-prompt], each
with its own output length drawn from [--min-new, --max-new], end of sequence ignored, greedy.

* minipaged: ``LLM(model=DIR).generate`` with one SamplingParams per prompt: continuous
  batching, so a request leaves the batch when its own length is reached and the batch shrinks.
* transformers: one batched ``model.generate`` over the prompts, left-padded to the longest,
  for max(output lengths) new tokens: a static batch, the way a batch is usually run with it;
  each row's first output-length tokens are kept, the rest of its work is waste (the paper's
  argument for iteration-level scheduling, section 2.3 and Orca, Yu et al. OSDI 2022).

Both run once (the tiny model's --repeats and --max-tokens are refused here) and report useful
tokens (the sum of the output lengths) per second of wall time, and the mean time to first
token. Then the tokens are compared request by request; where they differ the report gives the
logit margin at the first difference (a near-tie that rounding decides, or not).

``--write-random-model DIR`` first writes a random-weight model with SmolLM2-135M's config
(HuggingFaceTB/SmolLM2-135M config.json: hidden 576, 30 layers, 9 heads, 3 KV heads,
intermediate 1536, vocabulary 49152, tied embeddings, rope theta 100000, 8192 positions) and a
small byte-level tokenizer into DIR, so the benchmark needs no download.
"""

from __future__ import annotations

import os
import time

import numpy as np
from rich.console import Console

from minipaged._install import HF_EXTRA
from minipaged.kit.bench import fill_unset, flag_value
from minipaged.kit.cli.common import need_torch, table
from minipaged.model.sampling import SamplingParams

SMOLLM2_135M = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                    tie_word_embeddings=True, rope_theta=100000.0, max_position_embeddings=8192,
                    rms_norm_eps=1e-5, initializer_range=0.041666666666666664, bos_token_id=0,
                    eos_token_id=0)


# The workload's options when not given (they go with --model or --write-random-model only).
DEFAULTS = dict(min_prompt=20, max_prompt=300, min_new=16, max_new=256, seed=0)


def write_random_model(path, seed: int = 0, **overrides) -> None:
    """A random LlamaForCausalLM with SmolLM2-135M's config (``overrides`` replace entries) and
    a tiny byte-level tokenizer, saved in ``path``."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**{**SMOLLM2_135M, **overrides})
    model = transformers.LlamaForCausalLM(config)
    shown = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # one shard: no bar in a lesson's output
    try:
        model.save_pretrained(path)
    finally:
        if shown:
            transformers.utils.logging.enable_progress_bar()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["random weights, real shapes: the paged cache does not care"],
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel
                                                .alphabet(), show_progress=False))
    tok.save(os.path.join(path, "tokenizer.json"))


def _requests(args, vocab: int):
    rng = np.random.default_rng(args.seed)
    lens = rng.integers(args.min_prompt, args.max_prompt + 1, args.requests)
    prompts = [rng.integers(0, vocab, n).tolist() for n in lens]
    return prompts, rng.integers(args.min_new, args.max_new + 1, args.requests).tolist()


def _run_transformers(model_dir, prompts, out_lens):
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    gen = hf.generation_config
    gen.eos_token_id, gen.pad_token_id = None, 0          # end of sequence ignored
    gen.do_sample = False
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])      # left padding
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    first = []

    class FirstToken(transformers.LogitsProcessor):
        def __call__(self, input_ids, scores):
            if not first:
                first.append(time.perf_counter())
            return scores

    with torch.no_grad():
        gen.max_new_tokens = 2
        hf.generate(ids[:1, -8:], attention_mask=mask[:1, -8:], generation_config=gen)  # warm-up
        gen.max_new_tokens = max(out_lens)
        t0 = time.perf_counter()
        out = hf.generate(ids, attention_mask=mask, generation_config=gen,
                          logits_processor=transformers.LogitsProcessorList([FirstToken()]))
        dt = time.perf_counter() - t0
    tokens = [out[i, width:width + n].tolist() for i, n in enumerate(out_lens)]
    return hf, tokens, dt, first[0] - t0


def _run_paged(model_dir, prompts, out_lens, block_size):
    from minipaged.model.engine import LLM

    llm = LLM(model=model_dir, block_size=block_size)
    llm.generate([prompts[0][:8]], SamplingParams(max_tokens=2))             # warm-up
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in out_lens]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    ttft = sum(o.first_token_time - t0 for o in outs) / len(outs)
    return llm, [o.outputs[0].token_ids for o in outs], dt, ttft


def _margin(hf, prompt, ours, theirs) -> str:
    """Where two greedy streams first differ: the logit gap between the two candidates."""
    import torch

    k = next(i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b)
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + ours[:k]])).logits[0, -1]
    gap = abs(float(logits[ours[k]] - logits[theirs[k]]))
    return f"token {k}: logit gap {gap:.2e} between the two choices"


def run(args) -> int:
    fill_unset(args, DEFAULTS, {})
    for name in ("prompt", "new"):
        low, high = getattr(args, f"min_{name}"), getattr(args, f"max_{name}")
        if low > high:
            raise ValueError(f"{flag_value(args, f'min_{name}')} is above "
                             f"{flag_value(args, f'max_{name}')}; expected --min-{name} <= "
                             f"--max-{name}")
    need_torch()
    try:
        import torch
        import transformers  # noqa: F401 - the baseline, and --write-random-model
    except ImportError as e:
        raise ValueError(f"--model needs {e.name}: from a checkout, {HF_EXTRA}") from None
    console = Console(width=110)
    if args.write_random_model:
        write_random_model(args.write_random_model, args.seed)
        args.model = args.write_random_model      # never with --model (generate.run refuses)
    torch.set_num_threads(1)
    if os.environ.get("OPENBLAS_NUM_THREADS") != "1":
        console.print("[yellow]note: OPENBLAS_NUM_THREADS is not 1, so NumPy's BLAS (the paged "
                      "attention) may use more than one thread[/yellow]")
    from minipaged.model.hf_tokenizer import HFTokenizer

    prompts, out_lens = _requests(args, HFTokenizer(args.model).vocab_size)
    llm, ours, t_paged, ttft_paged = _run_paged(args.model, prompts, out_lens, args.block_size)
    console.print(f"[dim]{llm.pool_note}; {llm.num_steps} steps, {llm.num_preemptions} "
                  f"preemptions[/dim]")
    del llm
    hf, theirs, t_hf, ttft_hf = _run_transformers(args.model, prompts, out_lens)
    n = sum(out_lens)
    t = table(f"{args.requests} requests, prompts {min(map(len, prompts))}-"
              f"{max(map(len, prompts))} tokens, outputs {min(out_lens)}-{max(out_lens)} tokens "
              "(greedy, fp32, 1 torch thread)", ("generator", "useful tokens", "seconds",
                                                "tokens/s", "mean TTFT s"), left=("generator",))
    t.add_row("transformers generate (static batch)", str(n), f"{t_hf:.1f}", f"{n / t_hf:.1f}",
              f"{ttft_hf:.2f}")
    t.add_row(f"minipaged LLM (paged, block {args.block_size}, continuous)", str(n),
              f"{t_paged:.1f}", f"{n / t_paged:.1f}", f"{ttft_paged:.2f}")
    console.print(t)
    console.print(f"paged / transformers throughput: {t_hf / t_paged:.2f}x")
    same = [a == b for a, b in zip(ours, theirs)]
    console.print(f"identical greedy tokens: {sum(same)}/{len(same)} requests")
    for i in (i for i, ok in enumerate(same) if not ok):
        console.print(f"  request {i}: differs at {_margin(hf, prompts[i], ours[i], theirs[i])}")
    return 0
