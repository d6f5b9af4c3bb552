# requires: torch
# %% [markdown]
# # Lesson 09: a real model generating through the paged cache
#
# Until now the pages held random numbers. Here a tiny trained decoder (3 layers, 4 query heads,
# 2 KV heads, head size 16; `minipaged/model/`) writes its keys and values into the pages with
# `reshape_and_cache` and reads them back with paged attention, and text comes out that we can
# check: the model was trained (by `python -m minipaged.model.train`, on a corpus the package
# generates itself) to count down, `count down from 42:` -> ` 42 41 ... 1 0.`.
#
# The plan: prompt in, pages filled step by step, a forked sample sharing its prompt's blocks
# until it writes (copy-on-write), text out, the same text as a plain generator with a
# contiguous cache, and a memory report. Code: `minipaged/model/engine.py` (the engine),
# `minipaged/model/engine_samples.py` (its samples and forks), `minipaged/model/engine_beams.py`
# (its beam search), `minipaged/model/runner.py` (one packed forward pass per step),
# `minipaged/model/reference.py` (the oracle). Previous: lesson 08. Next: lesson 10 (the
# fact-check).

# %%
from __future__ import annotations

import torch
from rich.console import Console
from rich.table import Table

from minipaged.model import corpus
from minipaged.model.checkpoint import load_model, read_report
from minipaged.model.engine import LLM
from minipaged.model.reference import ReferenceGenerator
from minipaged.model.sampling import SamplingParams

torch.set_num_threads(1)
console = Console()
model = load_model()
cfg = model.cfg
report = read_report()
console.print(f"model: {model.num_parameters():,} parameters, {cfg.n_layers} layers, "
              f"H={cfg.n_heads} query heads, Hkv={cfg.n_kv_heads} KV heads, D={cfg.head_dim}")
console.print(f"KV cache per token: 2 x {cfg.n_layers} layers x {cfg.n_kv_heads} heads x "
              f"{cfg.head_dim} x 4 bytes = {cfg.kv_bytes_per_token()} bytes")
console.print(f"training report: {report['held_out_exact_match']:.0%} exact on "
              f"{report['num_eval']} held-out prompts")

# %% [markdown]
# ## Prompt in, pages filled
# One request, block size 4 so that the table grows visibly: the prompt's 20 tokens (with
# <bos>) take five blocks at the prefill, then one more block every four generated tokens. The
# block table is the same for all layers; each layer has its own K and V arrays [NB, Hkv, BS, D].

# %%
BS = 4
llm = LLM(model, num_blocks=64, block_size=BS)
snapshots = []
llm.on_step = lambda st: snapshots.append((st.step, dict(st.block_tables), st.num_free_blocks))
prompt = "count down from 19:"
out = llm.generate([prompt], SamplingParams(max_tokens=60))[0].outputs[0]
t = Table(title=f"{prompt!r}: its block table as it grows", title_justify="left")
t.add_column("step", justify="right")
t.add_column("tokens", justify="right")
t.add_column("physical blocks")
for step, tables, _free in snapshots[::6] + snapshots[-1:]:
    for table in tables.values():
        t.add_row(str(step), f"<= {len(table) * BS}", " ".join(map(str, table)))
console.print(t)
console.print(f"text out: {out.text!r}  correct: {corpus.check(prompt, out.text)}")
console.print(f"pool after the call: {llm.manager.num_free_blocks}/{llm.num_blocks} blocks free")

# %% [markdown]
# ## The same tokens as a plain generator
# The reference generator keeps one contiguous array per sequence and runs sequences one at a
# time. Greedy decoding must give identical tokens for every request, however the engine
# batches, pages, shares or preempts them; tests/test_engine.py checks it over many
# configurations. Here: four prompts in one batch, a pool so small (20 blocks of 4) that the
# scheduler must preempt: one run preempts by recomputation, the other by swapping.

# %%
prompts = ["count down from 9:", "count down from 23:", "count down from 14:",
           "count down from 11:"]
params = SamplingParams(max_tokens=40)
ref = ReferenceGenerator(model).generate(prompts, params)
for mode in ("recompute", "swap"):
    small = LLM(model, num_blocks=20, block_size=4, preemption=mode)
    outs = small.generate(prompts, params)
    same = all(a.outputs[0].token_ids == b.outputs[0].token_ids for a, b in zip(outs, ref))
    console.print(f"preemption={mode:9s}: {small.num_preemptions} preemptions, "
                  f"{small.runner.num_blocks_swapped} blocks swapped, identical to reference: "
                  f"{same}, pool back to {small.manager.num_free_blocks}/20 free")
for o in ref:
    console.print(f"  {o.prompt!r:22} -> {o.outputs[0].text!r}")

# %% [markdown]
# ## A forked sample: copy-on-write
# Three samples of one prompt (seed 3; temperature 2.5 among the top 5 tokens, because the
# model is so sure of its counting that milder sampling repeats the same answer). The prompt
# has 19 tokens with <bos>: four full blocks and a fifth holding 3. After the prefill the engine
# samples three first tokens from the same logits and the scheduler *forks* the sequence twice:
# the children share every prompt block (reference count 3). The prompt's last block is only
# partly filled, so at the first decode the first two writers, sample 0 (the forked sequence)
# and the first child, each copy it (vLLM section 4.4); the last writer, the second child, owns
# the original. The samples equal the reference generator's, which runs each sample with a
# private copy of everything.

# %%
share = LLM(model, num_blocks=64, block_size=BS)
peak = {}


def watch(st):
    peak.setdefault("copies", []).extend(st.copies)
    used = share.num_blocks - st.num_free_blocks
    if used > peak.get("used", 0):
        peak["used"], peak["usage"] = used, share.manager.usage()


share.on_step = watch
sp = SamplingParams(max_tokens=30, temperature=2.5, top_k=5, n=3, seed=3)
forked = share.generate(["count down from 7:"], sp)[0]
plain = ReferenceGenerator(model).generate(["count down from 7:"], sp)[0]
for a, b in zip(forked.outputs, plain.outputs):
    console.print(f"  sample {a.index}: {a.text!r}  (same as reference: "
                  f"{a.token_ids == b.token_ids})")
console.print(f"copy-on-write copies (src -> dst): {peak['copies']}")
no_share = sum(-(-(len(forked.prompt_token_ids) + len(o.token_ids)) // BS)
               for o in forked.outputs)
console.print(f"peak blocks in use: {peak['used']} with sharing; three private copies of the "
              f"final sequences would take {no_share}")

# %% [markdown]
# ## Memory report
# At the peak of the forked run, the paged pool's slots by category (the paper's Fig. 2): the
# only waste is the unfilled tail of each sequence's last block. The reference generator, by
# contrast, reserves max_seq_len rows per sequence up front.

# %%
u = peak["usage"]
console.print(f"paged, at peak: {u.token} token slots in use, {u.internal_fragmentation} "
              f"unfilled slots in last blocks, {u.free} free (block size {BS})")
lens = [len(forked.prompt_token_ids) + len(o.token_ids) for o in forked.outputs]
console.print(f"contiguous reference: {len(lens)} x {cfg.max_seq_len} = "
              f"{len(lens) * cfg.max_seq_len} rows "
              f"reserved for sequences of {', '.join(map(str, lens))} tokens "
              f"({sum(lens) / (len(lens) * cfg.max_seq_len):.0%} of them ever used)")

# %% [markdown]
# ## Optional: a Hugging Face checkpoint through the same pages
# `LLM(model=DIR)` loads a local Llama, Qwen2 or Qwen3 checkpoint (`minipaged/model/hf.py`: an
# explicit name map from the checkpoint's tensors to this decoder, every shape checked) and runs
# it through the same scheduler, block manager and paged attention. Point `MINIPAGED_MODEL_DIR`
# at a downloaded model (README, "Real models") to see real text. Without one, and with
# transformers installed, a tiny random Llama is written to a temporary folder: its text is
# noise, but the paged engine must still produce the reference generator's tokens exactly.
# The pool is sized from a KV budget with lesson 01's arithmetic (`minipaged/model/pool.py`).

# %%
import importlib.util  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402

model_dir = os.environ.get("MINIPAGED_MODEL_DIR")
if model_dir is None and all(importlib.util.find_spec(m) for m in ("transformers", "tokenizers")):
    from minipaged.kit.bench.generate_hf import write_random_model

    model_dir = tempfile.mkdtemp()
    write_random_model(model_dir, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=128, vocab_size=300)
if model_dir is None:
    console.print("no model directory and no transformers: skipped (python -m pip install -e "
                  "'.[hf]' and set MINIPAGED_MODEL_DIR to a downloaded model)")
else:
    from minipaged.model.hf import load_hf

    hf_model, hf_tok = load_hf(model_dir)
    real = LLM(hf_model, tokenizer=hf_tok, block_size=16, kv_cache_gb=0.25)
    console.print(real.pool_note)
    questions = ["The key and value cache of a transformer", "Paging splits memory into"]
    sp = SamplingParams(max_tokens=20)
    got = real.generate(questions, sp)
    want = ReferenceGenerator(hf_model, tokenizer=hf_tok).generate(questions, sp)
    for a, b in zip(got, want):
        console.print(f"  {a.prompt!r} -> {a.outputs[0].text!r}  (same tokens as the "
                      f"reference: {a.outputs[0].token_ids == b.outputs[0].token_ids})")
