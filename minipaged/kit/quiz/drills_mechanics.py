"""Interviewer drills on the mechanics: the kernel's layout and grid, the block table's trip to
the GPU, copy-on-write against prefix caching, and what sharing saves.

Each answer computes its figures as it prints (``KVCacheManager``, the simulator); the few
formulas the package has no function for (vLLM's x-packed key layout, the v2 kernel's grid)
are small functions here that say so. Read before: ``drills_memory.py``.
"""

from __future__ import annotations

import math

import numpy as np

from minipaged import KVCacheManager
from minipaged._checks import cdiv
from minipaged.kit.quiz.context import Answer, Context, drill, nbytes, pct
from minipaged.sim import memory


def x_packing(dtype_bytes: int, head_size: int) -> tuple[int, int]:
    """vLLM's key layout [NB, Hkv, D/x, BS, x]: x elements make 16 bytes; returns
    (x, 16-byte loads per key vector). (A formula; the package keeps the plain layout.)"""
    return 16 // dtype_bytes, head_size * dtype_bytes // 16


@drill("x-packing", "vLLM的key cache布局里的x是做什么的？",
       "What is the x in vLLM's key cache layout [NB, Hkv, D/x, BS, x] for?")
def x_packing_answer(ctx: Context) -> Answer:
    m = memory.MODELS["opt-13b"]
    figures = [(f"{name}: x / 16-byte loads per key vector (D={m.head_size})",
                "{} / {}".format(*x_packing(b, m.head_size)))
               for name, b in (("fp32", 4), ("fp16", 2), ("fp8", 1))]
    x = x_packing(2, m.head_size)[0]
    figures.append(("OPT-13B fp16 key cache shape per layer",
                    f"[NB, {m.num_kv_heads}, {m.head_size // x}, BS, {x}]"))
    return Answer(
        "vLLM stores keys as [NB, Hkv, D/x, BS, x] with x = 16 bytes' worth of elements. In its "
        "kernel a thread group (max(32 / BS, 1) lanes) holds one token's key, and the group loads "
        "16 bytes of it at a time, each lane 16 / THREAD_GROUP_SIZE bytes from adjacent addresses, "
        "so a group's load is one 16-byte vector (csrc/attention/attention_kernels.cuh: "
        "THREAD_GROUP_SIZE, VEC_SIZE). Values stay [NB, Hkv, D, BS]. This project keeps the plain "
        "[NB, Hkv, BS, D] layout for both, which is easier to read and to check against the NumPy "
        "oracle.",
        figures=figures,
        commands=["less minipaged/cuda/paged_attention.cu   (the comments on the layout)"])


def v2_grid(num_seqs: int, num_heads: int, context_len: int) -> dict:
    """Thread blocks launched by the v1 and v2 decode kernels (vLLM's grids, v2's partitions of
    512 tokens; a formula)."""
    parts = cdiv(context_len, 512)
    return {"v1": num_heads * num_seqs, "v2": num_heads * num_seqs * parts, "partitions": parts}


@drill("v1-v2", "paged_attention v1和v2内核有什么区别？什么时候用v2？",
       "What is the difference between the v1 and v2 paged attention kernels? When v2?")
def v1_v2(ctx: Context) -> Answer:
    g, g64 = v2_grid(1, 32, 16384), v2_grid(64, 32, 1024)
    rng = np.random.default_rng(ctx.seed)
    logits = rng.standard_normal(16384) * 4
    v = rng.standard_normal((16384, 8))
    p = np.exp(logits - logits.max())
    whole = p @ v / p.sum()
    parts = []                                  # what each v2 partition writes: (m, l, out)
    for i in range(0, 16384, 512):
        e = np.exp(logits[i:i + 512] - logits[i:i + 512].max())
        parts.append((logits[i:i + 512].max(), e.sum(), e @ v[i:i + 512] / e.sum()))
    gm = max(m for m, _, _ in parts)            # the reduce kernel
    w = np.array([li * math.exp(mi - gm) for mi, li, _ in parts])
    reduced = (w[:, None] * np.array([o for _, _, o in parts])).sum(0) / w.sum()
    return Answer(
        "v1 launches one thread block per (head, sequence) and walks the whole context. With few "
        "long sequences that is too few blocks to fill a GPU (an H100 SXM has 132 SMs). v2 cuts "
        "the context into 512-token partitions, one block each, writing a local max, sum and "
        "partial output; a reduce kernel rescales by exp(m_i - m) and combines them: the same "
        "online softmax. vLLM's legacy paged path (v0 engine) chose v1 when max_seq_len <= 8192 "
        "and (one partition only, or num_seqs * num_heads > 512), v2 otherwise, so always v2 above "
        "8192 tokens (vllm/attention/ops/paged_attn.py in the v0 releases). minipaged's kernel has "
        "both versions, and v3/v4, their grouped forms for H > Hkv (cuda/paged_attention.cu).",
        figures=[
            ("1 sequence x 32 heads, 16K context: v1 / v2 thread blocks",
             f"{g['v1']} / {g['v2']} ({g['partitions']} partitions)"),
            ("64 sequences x 32 heads, 1K context: v1 / v2", f"{g64['v1']} / {g64['v2']}"),
            ("max |v2 reduce - one softmax|, 16K tokens, fp64",
             f"{float(np.abs(reduced - whole).max()):.1e}"),
        ],
        commands=["python lessons/08_gpu_kernel.py", "minipaged check 7"])


@drill("table-to-kernel", "块表是怎么传到kernel里的？",
       "How does the block table reach the kernel?")
def table_to_kernel(ctx: Context) -> Answer:
    m = KVCacheManager(32, 4)
    for sid, n in (("a", 9), ("b", 3), ("c", 6)):
        m.allocate(sid, list(range(n)))
    p = memory.preset("llama-3-8b")
    bs, ctxlen = 16, 2048
    s = min(128, p.num_token_slots // ctxlen)      # a batch that fits in the KV budget
    return Answer(
        "With each step's inputs go an int32 block table [S, MB], seq_lens [S] and slot_mapping "
        "[T] for the new tokens. minipaged builds the table per step, padded with -1 to the "
        "batch's longest table (KVCacheManager.block_tables); vLLM v1 keeps one persistent, "
        "zero-filled int32 table [max_num_reqs, cdiv(max_model_len, BS)] in its model runner and "
        "updates rows in place (vllm/v1/worker/block_table.py; vLLM 0.32 rounds the width up to "
        "whole 128-token groups of blocks, get_block_table_width); v0 padded with 0, to a fixed "
        "width under CUDA graphs (vllm/worker/model_runner.py). The table stays flat because it is "
        "small, not because of how it is padded: the kernel reads row s, entry i for KV block i "
        "and never past seq_len, so the padding value does not matter, and the copy is tiny next "
        "to the KV the step reads.",
        figures=[
            ("block_tables for lengths 9, 3, 6 at BS 4",
             np.array2string(m.block_tables(["a", "b", "c"]))),
            (f"block_tables for S={s}, context {ctxlen}, BS {bs}",
             nbytes(s * memory.block_table_bytes(ctxlen, bs))),
            ("KV read by that decode step (Llama-3-8B)",
             nbytes(s * ctxlen * p.model.kv_bytes_per_token)),
        ],
        commands=["python lessons/03_paging.py", "minipaged check 4"])


@drill("cow-vs-prefix", "写时复制和前缀缓存有什么区别？vLLM v1为什么放弃了写时复制？",
       "Copy-on-write versus prefix caching: what differs, and why did vLLM v1 drop CoW?")
def cow_vs_prefix(ctx: Context) -> Answer:
    n, prompt, gen, bs = 4, list(range(100)), 30, 16
    cow = KVCacheManager(256, bs)
    cow.allocate(0, prompt)
    for i in range(1, n):
        cow.fork(0, i)
    v1 = KVCacheManager(256, bs, enable_prefix_caching=True)
    for i in range(n):
        v1.allocate(i, prompt)
    for mgr in (cow, v1):
        for t in range(gen):
            for i in range(n):
                mgr.append_slot(i, 1000 + t)
        mgr.take_copies()
    return Answer(
        "Copy-on-write (paper section 4.4) shares blocks between the sequences of one request "
        "(fork) and copies the shared partial last block on the first write. Prefix caching shares "
        "full blocks between any requests through a hash of the whole prefix, and (in minipaged "
        "and for one-group models in vLLM) never shares a partial block, so there is nothing to "
        "copy. vLLM v0 had both (automatic prefix caching, "
        "vllm/core/block/prefix_caching_block.py, beside copy-on-write); the v1 engine has no "
        "forks and runs parallel sampling as n requests with one cached prompt "
        "(vllm/v1/engine/parallel_sampling.py): it gives up at most one block per sample. In vLLM "
        "0.32 it copies a block only when a prefix-cache hit ends inside it, which only hybrid "
        "models' finer hashes allow (vllm/v1/core/single_type_kv_cache_manager.py, _apply_cow; "
        "vllm/v1/core/kv_cache_utils.py). minipaged's KVCacheManager does both, as v0 could.",
        figures=[
            (f"n={n} samples, {len(prompt)}-token prompt, {gen} tokens each, BS {bs}: no sharing",
             f"{n * cdiv(len(prompt) + gen, bs)} blocks"),
            ("  copy-on-write (fork)", f"{cow.num_blocks - cow.num_free_blocks} blocks"),
            ("  prefix caching (n requests)", f"{v1.num_blocks - v1.num_free_blocks} blocks"),
        ],
        commands=["python lessons/05_prefix_caching.py", "minipaged demo fork",
                  "minipaged demo prefix"])


@drill("last-token", "前缀缓存命中时，为什么最后一个token总要重算？",
       "With prefix caching, why is the last prompt token always recomputed?")
def last_token(ctx: Context) -> Answer:
    figures = []
    for n in (33, 32, 16):
        m = KVCacheManager(16, 16, enable_prefix_caching=True)
        m.allocate("warm", list(range(n)))
        m.free("warm")
        figures.append((f"{n}-token prompt seen before (BS 16): tokens reused",
                        str(m.allocate("again", list(range(n))))))
    return Answer(
        "Hashes are chained (the parent's hash, the block's tokens and extra keys such as a LoRA "
        "id), so equal hashes mean equal prefixes under equal extra keys, up to a hash collision. "
        "vLLM v1 looks a hit up by hash alone (vllm/v1/core/block_pool.py, get_cached_block); "
        "nano-vllm also compares the block's token ids (nanovllm/engine/block_manager.py); "
        "sharing/prefix_cache.py says what minipaged does. Only full blocks are cached, and the "
        "last prompt token is always recomputed: the model needs its logits to sample the first "
        "output token. So a fully cached prompt whose length is a multiple of BS still recomputes "
        "its last block.",
        figures=figures,
        commands=["python lessons/05_prefix_caching.py", "minipaged check 10"])


@drill("sharing-savings", "并行采样和束搜索分别能省多少显存？为什么差这么多？",
       "How much memory do parallel sampling and beam search save, and why so different?")
def sharing_savings(ctx: Context) -> Answer:
    saved = ctx.sharing()           # experiment 2 on Alpaca: the canonical figures
    figures = [(f"Alpaca, {label} {k}: memory saved", pct(saved[kind][k]))
               for kind, label in (("parallel", "parallel sampling n ="),
                                   ("beam", "beam search width")) for k in (2, 4, 6)]
    return Answer(
        "Parallel samples share only the prompt, and their outputs soon dominate: small savings. "
        "Beams share most of their history, since beams keep forking from each other: large "
        "savings. The paper (Fig. 15, Alpaca, OPT-13B): 6.1%-9.8% for sampling, 37.6%-55.2% for "
        "beam search (saving = blocks saved / blocks without sharing). The simulator has no "
        "language model: which beams survive a step follows one stated rule (sim/executor.py, "
        "SimExecutor.beam_step), so its beam figures are a model.",
        figures=figures,
        commands=[f"minipaged experiment 2 --num-requests {ctx.num_requests} --seed {ctx.seed}",
                  "minipaged check 9"])


DRILLS = (x_packing_answer, v1_v2, table_to_kernel, cow_vs_prefix, last_token, sharing_savings)
