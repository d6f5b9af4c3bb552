"""More interview drills: the questions a strong interviewer adds to the seed's.

Each ``_answer_*`` computes its figures now through the package (calculator, cost model,
simulator, ``KVCacheManager``); the few formulas the package has no function for (vLLM's
x-packed key layout, the v2 kernel's grid) are small functions here that say so. The list of
drills, in order, is ``DRILLS`` in ``drills.py``. Read before: ``drills.py``.
"""

from __future__ import annotations

import math

import numpy as np

from minipaged.kit.quiz import Answer, Context, nbytes, pct


def _answer_why_16(ctx: Context) -> Answer:
    runs = {bs: ctx.sim(workload="alpaca", block_size=bs) for bs in (16, 128)}
    lens = ctx.final_lens("sharegpt")
    return Answer(
        text=(
            "Large enough that a warp's work per block and the table walk stay cheap, small "
            "enough that the unused tail (BS/2 per sequence on average) stays small next to "
            "short sequences. The paper's Fig. 18b: ShareGPT is fastest anywhere from 16 to "
            "128; Alpaca (short requests) does well at 16-32 and degrades with larger blocks. "
            "vLLM compiles its kernel for 8, 16 and 32 only."),
        figures=[
            ("Alpaca, BS 16: avg batch / tokens per s",
             f"{runs[16].avg_batch_size:.1f} / {runs[16].throughput_tokens_per_s:.0f}"),
            ("Alpaca, BS 128: avg batch / tokens per s",
             f"{runs[128].avg_batch_size:.1f} / {runs[128].throughput_tokens_per_s:.0f}"),
            ("ShareGPT lengths, mean unused slots per sequence at BS 16",
             f"{float(np.mean(-(-lens // 16) * 16 - lens)):.1f}"),
        ],
        commands=[ctx.sim_command(workload="alpaca", block_size=bs) for bs in (16, 128)])


def x_packing(dtype_bytes: int, head_size: int) -> tuple[int, int]:
    """vLLM's key layout [NB, Hkv, D/x, BS, x]: x elements make 16 bytes; returns
    (x, 16-byte loads per key vector). (A formula; the package keeps the plain layout.)"""
    x = 16 // dtype_bytes
    return x, head_size * dtype_bytes // 16


def _answer_x_packing(ctx: Context) -> Answer:
    from minipaged.sim.memory import MODELS

    m = MODELS["opt-13b"]
    figures = []
    for name, b in (("fp32", 4), ("fp16", 2), ("fp8", 1)):
        x, loads = x_packing(b, m.head_size)
        figures.append((f"{name}: x / 16-byte loads per key vector (D={m.head_size})",
                        f"{x} / {loads}"))
    x, _ = x_packing(2, m.head_size)
    figures.append(("OPT-13B fp16 key cache shape per layer",
                    f"[NB, {m.num_kv_heads}, {m.head_size // x}, BS, {x}]"))
    return Answer(
        text=(
            "vLLM stores keys as [NB, Hkv, D/x, BS, x] with x = 16 bytes' worth of elements, so "
            "that the lanes of a thread group, each holding part of one token's key, load "
            "16-byte vectors from adjacent addresses (coalesced, one instruction per load). "
            "Values stay [NB, Hkv, D, BS]. This project keeps the plain [NB, Hkv, BS, D] layout "
            "for both, which is easier to read and to check against the NumPy oracle."),
        figures=figures,
        commands=["less minipaged/cuda/*.cu   (the comments on the cache layout)"])


def v2_grid(num_seqs: int, num_heads: int, context_len: int, partition: int = 512) -> dict:
    """Thread blocks launched by the v1 and v2 decode kernels (vLLM's grids; a formula)."""
    parts = -(-context_len // partition)
    return {"v1": num_heads * num_seqs, "v2": num_heads * num_seqs * parts, "partitions": parts}


def _answer_v1_v2(ctx: Context) -> Answer:
    g = v2_grid(1, 32, 16384)
    g8 = v2_grid(64, 32, 1024)
    rng = np.random.default_rng(ctx.seed)
    logits = rng.standard_normal(16384) * 4
    v = rng.standard_normal((16384, 8))
    p = np.exp(logits - logits.max())
    whole = p @ v / p.sum()
    ms, ls, os_ = [], [], []
    for i in range(0, 16384, 512):             # what each v2 partition writes
        lg = logits[i:i + 512]
        mi = lg.max()
        e = np.exp(lg - mi)
        ms.append(mi)
        ls.append(e.sum())
        os_.append(e @ v[i:i + 512] / e.sum())
    gm = max(ms)                                # the reduce kernel
    w = np.array([li * math.exp(mi - gm) for mi, li in zip(ms, ls)])
    reduced = (w[:, None] * np.array(os_)).sum(0) / w.sum()
    return Answer(
        text=(
            "v1 launches one thread block per (head, sequence) and walks the whole context. "
            "With few long sequences that is too few blocks to fill a GPU (an H100 has 132 "
            "SMs). v2 cuts the context into 512-token partitions, one block each, writing a "
            "local max, sum and partial output; a reduce kernel rescales by exp(m_i - m) and "
            "combines them: the same online softmax. vLLM uses v1 when the context is short or "
            "the batch already fills the GPU, v2 otherwise."),
        figures=[
            ("1 sequence x 32 heads, 16K context: v1 / v2 thread blocks",
             f"{g['v1']} / {g['v2']} ({g['partitions']} partitions)"),
            ("64 sequences x 32 heads, 1K context: v1 / v2", f"{g8['v1']} / {g8['v2']}"),
            ("max |v2 reduce - one softmax|, 16K tokens, fp64",
             f"{float(np.abs(reduced - whole).max()):.1e}"),
        ],
        commands=["python lessons/08_*.py", "minipaged check 7"])


def _answer_cow_vs_prefix(ctx: Context) -> Answer:
    from minipaged.serving.swap import KVCacheManager

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
    need = n * -(-(len(prompt) + gen) // bs)
    used_cow = cow.num_blocks - cow.num_free_blocks
    used_v1 = v1.num_blocks - v1.num_free_blocks
    return Answer(
        text=(
            "Copy-on-write (vLLM v0, paper 4.4) shares blocks between sequences of one request "
            "(fork) and copies the shared partial last block on the first write. Prefix "
            "caching (vLLM v1) shares full blocks between any requests through a hash of the "
            "whole prefix, and never shares a partial block, so there is nothing to copy. v1 "
            "runs parallel sampling as n requests with one cached prompt: it gives up at most "
            "one block per sample, and gains sharing across requests."),
        figures=[
            (f"n={n} samples, {len(prompt)}-token prompt, {gen} tokens each, BS {bs}: no sharing",
             f"{need} blocks"),
            ("  copy-on-write (fork)", f"{used_cow} blocks"),
            ("  prefix caching (n requests)", f"{used_v1} blocks"),
        ],
        commands=["python lessons/05_*.py", "minipaged demo fork", "minipaged demo prefix"])


def _answer_swap_vs_recompute(ctx: Context) -> Answer:
    from minipaged.sim.cost import CostModel
    from minipaged.sim.memory import preset

    runs = {mode: ctx.sim(kv_cache_gb=2, preemption_mode=mode) for mode in ("swap", "recompute")}
    p = preset("opt-13b")
    cost = CostModel.for_preset(p)
    tokens = 1000
    figures = []
    for bs in (1, 16, 256):
        blocks = -(-tokens // bs)
        t = cost.step_time(0, 0, blocks_swapped=blocks,
                           block_bytes=p.model.kv_bytes_per_token * bs)
        figures.append((f"swap out a {tokens}-token sequence, BS {bs}", f"{1e3 * t:.1f} ms"))
    figures.append((f"recompute {tokens} tokens (one prefill step)",
                    f"{1e3 * cost.step_time(tokens, tokens):.1f} ms"))
    for mode, r in runs.items():
        figures.append((f"2 GiB KV, {mode}: preemptions / normalized latency",
                        f"{r.num_preemptions} / {r.normalized_latency_s_per_token:.3f} s/token"))
    return Answer(
        text=(
            "Swap copies a preempted group's blocks to a CPU pool over PCIe and back; "
            "recompute drops them and re-runs prompt + generated tokens as one prefill later. "
            "Swapping pays per block copied (small blocks: many small copies), recomputation "
            "pays compute that does not depend on the block size. The paper (Fig. 19) finds "
            "them comparable for blocks of 16-64; recent vLLM defaults to recompute."),
        figures=figures,
        commands=[ctx.sim_command(kv_cache_gb=2, preemption_mode=m)
                  for m in ("swap", "recompute")] + ["minipaged check 11"])


def _answer_table_to_kernel(ctx: Context) -> Answer:
    from minipaged.serving.swap import KVCacheManager
    from minipaged.sim.memory import block_table_bytes, preset

    m = KVCacheManager(32, 4)
    for sid, n in (("a", 9), ("b", 3), ("c", 6)):
        m.allocate(sid, list(range(n)))
    tables = m.block_tables(["a", "b", "c"])
    p = preset("llama-3-8b")
    bs, ctxlen = 16, 2048
    s = min(128, p.num_token_slots // ctxlen)      # a batch that fits in the KV budget
    table_bytes = s * block_table_bytes(ctxlen, bs)
    kv_read = s * ctxlen * p.model.kv_bytes_per_token
    return Answer(
        text=(
            "Each step the scheduler builds one int32 array block_tables [S, MB] (padded with "
            "-1 to the longest sequence of the batch), plus seq_lens [S] and slot_mapping "
            "[T] for the new tokens, and copies them to the GPU with the step's inputs. The "
            "kernel reads row s, entry i for KV block i; it never reads past seq_len, so the "
            "padding value does not matter. The copy is tiny next to the KV the step reads."),
        figures=[
            ("block_tables for lengths 9, 3, 6 at BS 4", np.array2string(tables)),
            (f"block_tables for S={s}, context {ctxlen}, BS {bs}", nbytes(table_bytes)),
            ("KV read by that decode step (Llama-3-8B)", nbytes(kv_read)),
        ],
        commands=["python lessons/03_paging.py", "minipaged check 4"])


def _answer_gqa(ctx: Context) -> Answer:
    from minipaged.sim.memory import MODELS, preset

    m = MODELS["llama-3-8b"]
    p = preset("llama-3-8b")
    mha = 2 * m.num_layers * m.num_heads * m.head_size * m.dtype_bytes
    return Answer(
        text=(
            "The cache stores K and V per KV head, so GQA divides it by H / Hkv (4 for "
            "Llama-3-8B: 32 query heads share 8 KV heads). Four times the tokens fit, so four "
            "times the batch, or four times the context. The kernel maps query head h to KV "
            "head h // (H / Hkv); several query heads reuse each loaded K/V block."),
        figures=[
            ("Llama-3-8B KV per token (8 KV heads)", nbytes(m.kv_bytes_per_token)),
            ("  the same model with 32 KV heads (MHA)", nbytes(mha)),
            (f"token slots in {nbytes(p.kv_cache_bytes)} of KV cache: GQA / MHA",
             f"{p.num_token_slots:,} / {p.kv_cache_bytes // mha:,}"),
        ],
        commands=["minipaged kv-calc --model llama-3-8b",
                  "minipaged kv-calc --model llama-3-8b --kv-heads 32"])


def _answer_block_size_limits(ctx: Context) -> Answer:
    from minipaged.sim.cost import CostModel
    from minipaged.sim.memory import preset

    p = preset("opt-13b")
    cost = CostModel.for_preset(p)
    figures = []
    for bs in (8, 16, 32):
        figures.append((f"BS {bs}: lanes per token (thread group = max(32 / BS, 1))",
                        str(max(32 // bs, 1))))
    for bs in (1, 16, 256):
        t = cost.step_time(0, 0, blocks_swapped=-(-2048 // bs),
                           block_bytes=p.model.kv_bytes_per_token * bs)
        figures.append((f"BS {bs}: swap a 2048-token sequence out", f"{1e3 * t:.1f} ms"))
    return Answer(
        text=(
            "Small blocks: each block costs a table lookup and a scattered read, a warp "
            "processes one block at a time, and swapping makes one small copy per block. Large "
            "blocks: the unused tail grows, fewer prefixes are shareable (only full blocks "
            "are cached), and in vLLM's kernel a warp's lanes split a block's tokens into "
            "thread groups, so the block size is fixed at compile time (8, 16, 32). "
            "FlashAttention's upstream paged path even requires multiples of 256."),
        figures=figures,
        commands=["minipaged bench kernel --help", ctx.sim_command(block_size=256)])


def _answer_capacity(ctx: Context) -> Answer:
    from minipaged.sim.memory import kv_calc, preset

    r = kv_calc(preset("opt-13b"), context_len=2048)
    lens = ctx.final_lens("sharegpt")
    return Answer(
        text=(
            "OPT-13B on an A100-40GB keeps about 12 GiB for the KV cache after 26 GB of "
            "weights (the paper's Table 1). At 800 KiB per token that is about 15.7K token "
            "slots: only a handful of requests if each reserves the maximum length, several "
            "times more if each holds only what it uses."),
        figures=[
            ("KV bytes per token", nbytes(r["kv_bytes_per_token"])),
            ("token slots in 12 GiB", f"{r['token_slots']:,}"),
            ("requests reserving 2048 slots each", f"{r['requests_that_fit']:,}"),
            ("requests of mean ShareGPT-like length (prompt + output)",
             f"{r['token_slots'] // int(lens.mean()):,} (mean {lens.mean():.0f} tokens)"),
        ],
        commands=["minipaged kv-calc --model opt-13b --context-len 2048"])


def _answer_decode_traffic(ctx: Context) -> Answer:
    from minipaged.sim.cost import CostModel
    from minipaged.sim.memory import preset

    p = preset("opt-13b")
    cost = CostModel.for_preset(p)
    figures = [("weights read per step", nbytes(p.model.weight_bytes))]
    for batch in (8, 32):
        kv = batch * 1000 * p.model.kv_bytes_per_token
        t = cost.step_time(batch, batch * 1000)
        figures.append((f"batch {batch} x 1000-token contexts: KV read / step time / tok/s",
                        f"{nbytes(kv)} / {1e3 * t:.1f} ms / {batch / t:.0f}"))
    return Answer(
        text=(
            "A decode step reads every weight once whatever the batch, plus every running "
            "sequence's KV. Both are memory-bound, so a step of 32 sequences costs far less "
            "than 4 steps of 8: throughput grows with the batch, and the batch is limited by "
            "KV memory. That is the whole case for wasting less of it."),
        figures=figures,
        commands=[ctx.sim_command(policy="orca-max"), ctx.sim_command(policy="paged")])


def _answer_last_token(ctx: Context) -> Answer:
    from minipaged.serving.swap import KVCacheManager

    out = []
    for n in (33, 32, 16):
        m = KVCacheManager(16, 16, enable_prefix_caching=True)
        m.allocate("warm", list(range(n)))
        m.free("warm")
        out.append((n, m.allocate("again", list(range(n)))))
    return Answer(
        text=(
            "Hashes are chained (hash of the parent's hash and the block's tokens), so a hit "
            "means the whole prefix is equal; the token ids are checked too. Only full blocks "
            "are cached, and the last prompt token is always recomputed: the model needs its "
            "logits to sample the first output token. So a fully cached prompt whose length is "
            "a multiple of BS still recomputes its last block."),
        figures=[(f"{n}-token prompt seen before (BS 16): tokens reused", str(hit))
                 for n, hit in out],
        commands=["python lessons/05_*.py", "minipaged check 10"])


def _answer_sharing_savings(ctx: Context) -> Answer:
    figures = []
    for label, kw in (("parallel sampling n=4", dict(n=4)),
                      ("beam search width 4", dict(beam_width=4))):
        r = ctx.sim(workload="alpaca", **kw)
        saving = "n/a" if r.memory_saving is None else pct(r.memory_saving)
        figures.append((f"Alpaca, {label}: memory saved", saving))
    return Answer(
        text=(
            "Parallel samples share only the prompt, and their outputs soon dominate: small "
            "savings. Beams share most of their history, since beams keep forking from each "
            "other: large savings. The paper (Fig. 15, Alpaca): 6.1%-9.8% for sampling, "
            "37.6%-55.2% for beam search (saving = blocks saved / blocks without sharing)."),
        figures=figures,
        commands=[ctx.sim_command(workload="alpaca", n=4),
                  ctx.sim_command(workload="alpaca", beam_width=4), "minipaged check 9"])
