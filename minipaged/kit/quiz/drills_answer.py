"""Drills on the interview answer itself: its question, follow-ups, pitfalls and two claims.

What it teaches: a good answer to a systems question carries numbers, and the numbers come
from a model one can run. Each answer below computes its figures as it prints, through the
package (the calculator, the simulator, ``KVCacheManager``, the attention code); where it
covers a claim of the interview answer it shows the fact-check's verdict on that claim
(``Context.verdicts``), so the quiz and ``minipaged factcheck`` never disagree.
Read before: ``answer.py``, ``factcheck.py``.
"""

from __future__ import annotations

import numpy as np

from minipaged import dense_attention, paged_attention
from minipaged._checks import cdiv
from minipaged.kit.quiz.answer import FOLLOW_UPS, PITFALLS, QUESTION
from minipaged.kit.quiz.context import PRESSURE_RUN, Answer, Context, drill, nbytes, pct
from minipaged.kit.quiz.factcheck import one_sequence_waste
from minipaged.paged.paged_attention import gather_kv
from minipaged.sim import memory

POLICIES = ("orca-max", "orca-pow2", "orca-oracle", "paged")


@drill("question", *QUESTION, source="the interview question")
def question(ctx: Context) -> Answer:
    f2, rates = ctx.fig2(), ctx.rates()
    figures = [(f"{p}: token states while requests queue / average batch",
                f"{pct(f2[p]['usage']['token'])} / {f2[p]['avg_batch_size']:.1f}")
               for p in POLICIES]
    figures += [(f"highest sustainable request rate, paged / {p}",
                 f"{rates[p]['paged_speedup']:.2f}x") for p in POLICIES[:3]]
    return Answer(
        "Decode keeps every past token's K and V (the KV cache); a request's cache grows one token "
        "at a time to a length nobody knows in advance. Reserving one contiguous region per "
        "request wastes most of it: slots reserved for later, slots never used (internal "
        "fragmentation), and free gaps too small for a new region (external). PagedAttention cuts "
        "the cache into fixed-size blocks allocated on demand; each sequence's block table maps "
        "logical block -> physical block like an OS page table; the kernel reads K/V through it "
        "(slot = block * BS + offset). Waste is bounded by one partly filled block per sequence, "
        "blocks can be shared (copy-on-write, prefix caching), and the larger batch that fits is "
        "where the throughput comes from.",
        figures=figures,
        commands=[f"minipaged experiment 1 --num-requests {ctx.num_requests}",
                  f"minipaged experiment 3 --num-requests {ctx.num_requests}",
                  "minipaged factcheck"],
        verdicts=ctx.verdicts("utilization-before", "utilization-after", "throughput-2-4x",
                              "batch-8-to-32"))


def two_level_bytes(seq_len: int, max_context: int, block_size: int, leaf_size: int) -> int:
    """Directory (covers max_context) + the leaves a sequence uses (exercise 13's formula; the
    package itself keeps flat tables, so this small function lives here)."""
    mb = cdiv(max_context, block_size)
    used = cdiv(seq_len, block_size)
    return (cdiv(mb, leaf_size) + cdiv(used, leaf_size) * leaf_size) * 4   # int32 entries


@drill("follow-up-1", *FOLLOW_UPS[0], source="follow-up 1")
def follow_up_1(ctx: Context) -> Answer:
    t128 = memory.block_table_bytes(131072, 16)
    t32 = memory.block_table_bytes(32768, 16)
    kv128 = memory.MODELS["llama-3-8b"].kv_bytes_per_token * 131072
    return Answer(
        "One int32 entry per logical block: ceil(128K / 16) = 8192 entries. No status bits are "
        "needed (how full the last block is follows from seq_len). Next to the KV cache itself the "
        "table is negligible, which is why engines keep it flat: vLLM v1 holds one persistent, "
        "zero-filled int32 table [max_num_reqs, cdiv(max_model_len, BS)], the width rounded up to "
        "whole 128-token groups of blocks in vLLM 0.32 (vllm/v1/worker/block_table.py, "
        "get_block_table_width). Optimisations if it ever mattered: int16 entries while "
        "NB < 32768 (half the bytes), larger blocks, or a two-level table, which saves memory only "
        "for short sequences in a table sized for the longest context.",
        figures=[
            ("block table, 128K tokens, BS 16, int32", nbytes(t128)),
            ("  the same with 8-byte entries (the answer's assumption)",
             nbytes(memory.block_table_bytes(131072, 16, entry_bytes=8))),
            ("  x 1000 requests", nbytes(t128 * 1000)),
            ("block table, 32K tokens, x 1000 requests", nbytes(t32 * 1000)),
            ("KV cache of one 128K-token request, Llama-3-8B fp16", nbytes(kv128)),
            ("table / KV cache", f"{t128 / kv128:.1e}"),
            ("2K-token request in a 128K-wide table: flat", nbytes(t128)),
            ("  two-level (leaves of 256 entries)",
             nbytes(two_level_bytes(2048, 131072, 16, 256))),
        ],
        commands=["minipaged kv-calc --model llama-3-8b --context-len 131072 --num-requests 1000",
                  "minipaged kv-calc --context-len 32768 --num-requests 1000",
                  "minipaged check 13   (the two-level table exercise)"],
        verdicts=ctx.verdicts("block-table-128k", "block-table-32k"))


@drill("follow-up-2", *FOLLOW_UPS[1], source="follow-up 2")
def follow_up_2(ctx: Context) -> Answer:
    waste = {bs: one_sequence_waste(33, bs) for bs in (32, 16)}
    return Answer(
        "Doubling the block size halves the block table and the number of blocks a decode step "
        "walks, and doubles the worst-case unused tail (up to BS-1 slots per sequence; (BS-1)/2, "
        "about BS/2, on average). The paper (Fig. 18b) finds ShareGPT fastest anywhere from 16 "
        "to 128 and Alpaca's "
        "short sequences slower with large blocks. In the answer's 33-token example, 48% and 94% "
        "are the same 31 unused slots over two denominators (slots allocated, tokens held): "
        "nothing rises from one to the other.",
        figures=[(f"33 tokens, BS {bs}: unused / allocated slots", f"{w}/{a} = {pct(w / a)}")
                 for bs, (w, a) in waste.items()]
        + [(f"ShareGPT-like lengths: mean unused slots per sequence, BS {bs}",
            f"{float(np.mean(ctx.unused_slots(bs))):.1f}") for bs in (16, 32)],
        commands=[ctx.sim_command(block_size=16), ctx.sim_command(block_size=32),
                  "minipaged check 2   (paged_breakdown)"],
        verdicts=ctx.verdicts("block-32-example", "block-size-tradeoff"))


@drill("follow-up-3", *FOLLOW_UPS[2], source="follow-up 3")
def follow_up_3(ctx: Context) -> Answer:
    rng = np.random.default_rng(ctx.seed)
    bs, nb, hkv, h, d, n = 16, 12, 2, 8, 64, 150
    kc = rng.standard_normal((nb, hkv, bs, d)).astype(np.float32)        # [NB, Hkv, BS, D]
    vc = rng.standard_normal((nb, hkv, bs, d)).astype(np.float32)
    table = rng.permutation(nb)[: cdiv(n, bs)].astype(np.int32)[None]    # [1, MB]
    q = rng.standard_normal((1, h, d)).astype(np.float32)                # [1, H, D]
    out = paged_attention(q, kc, vc, table, np.array([n], np.int32), method="online")
    k, v = gather_kv(kc, vc, table[0], n)                                # [T, Hkv, D]
    return Answer(
        "Yes, they compose: FlashAttention already walks K/V tile by tile with an online softmax, "
        "and a page is just a tile whose address comes from the block table. The frictions are "
        "practical: upstream flash_attn_with_kvcache takes block_table [batch, max_blocks] but "
        "requires page_size to be a multiple of 256 (its docstring; vLLM's fork, "
        "vllm-project/flash-attention, relaxes it to 16), and cache layouts differ ([NB, BS, Hkv, "
        "D] there, [NB, Hkv, BS, D] in minipaged). vLLM v1 uses exactly this: its FlashAttention "
        "backend reads the paged cache through the block table "
        "(vllm/v1/attention/backends/flash_attn.py). FlashInfer takes the table as CSR (kv_indptr, "
        "kv_indices, kv_last_page_len; its docs, 'KV-Cache Layout'). Below: minipaged's "
        "block-by-block paged computation equals tiled dense attention exactly, and plain "
        "attention to rounding.",
        figures=[("max |paged online - dense(tile=16)|, 150 tokens, fp32",
                  f"{float(np.abs(out - dense_attention(q, k, v, tile=bs)).max()):.1e}"),
                 ("max |paged online - plain softmax|",
                  f"{float(np.abs(out - dense_attention(q, k, v)).max()):.1e}")],
        commands=["python lessons/03_paging.py", "minipaged check 7", "minipaged check 12"],
        verdicts=ctx.verdicts("flashattention-compatible"))


@drill("pitfall-concept", *PITFALLS[0], source="pitfall 1")
def pitfall_concept(ctx: Context) -> Answer:
    f = ctx.finding("copy-on-write").figures
    return Answer(
        "\"Pages for the KV cache\" is only the headline. Say how the mapping works (block table: "
        "logical block -> physical block; slot = block * BS + offset, which the kernel and "
        "reshape_and_cache use) and when copy-on-write triggers: when a sequence writes into a "
        "block whose reference count is above 1. Only the last, partly filled block of a shared "
        "prompt is ever copied; full blocks stay shared.",
        figures=[
            ("20-token prompt, BS 16, forked: child's table / ref counts",
             f"{f['table']} / {f['ref_counts']}"),
            ("child appends a token: slot, new table", f"{f['child_slot']}, {f['child_table']}"),
            ("copies recorded (src, dst)", str(f["copies"])),
            ("parent appends next: slot (in place, no copy)", str(f["parent_slot"])),
        ],
        commands=["minipaged demo fork", "python lessons/04_copy_on_write.py",
                  "minipaged check 8"],
        verdicts=ctx.verdicts("copy-on-write"))


@drill("pitfall-block-size", *PITFALLS[1], source="pitfall 2")
def pitfall_block_size(ctx: Context) -> Answer:
    lens = ctx.final_lens("sharegpt")
    figures = []
    for bs in (1, 8, 16, 32, 64, 128, 256):
        unused = ctx.unused_slots(bs)
        figures.append((f"BS {bs:>3}: unused slots per sequence / share / table for 2K",
                        f"{float(np.mean(unused)):6.1f} / "
                        f"{pct(float(np.sum(unused) / np.sum(lens + unused)))} / "
                        f"{nbytes(memory.block_table_bytes(2048, bs))}"))
    return Answer(
        "Bigger is not better: the table shrinks, but every sequence's last block wastes about "
        "BS/2 slots ((BS-1)/2) on average, blocks are the granularity of sharing (prefix "
        "caching shares only full blocks) and of swapping, and the kernel's work split depends "
        "on it. 16 balances these on the paper's workloads (section 7.2, Fig. 18b); the table's "
        "size never matters (kilobytes next to gigabytes of KV).",
        figures=figures,
        commands=[ctx.sim_command(block_size=bs) for bs in (16, 128)],
        verdicts=ctx.verdicts("sweet-spot-16"))


@drill("pitfall-vllm-only", *PITFALLS[2], source="pitfall 3")
def pitfall_vllm_only(ctx: Context) -> Answer:
    return Answer(
        "The idea is general. TensorRT-LLM pages its KV cache in blocks (its docs on the paged KV "
        "cache); FlashAttention's flash_attn_with_kvcache takes a block_table; FlashInfer stores "
        "the page table as CSR (kv_indptr, kv_indices, kv_last_page_len); SGLang's RadixAttention "
        "keeps a radix tree over token ids, page size 1 by default, with LRU eviction (Zheng et "
        "al., SGLang, 2024). Exercise 12 converts between a padded [S, MB] table (minipaged's) and "
        "FlashInfer's CSR.",
        commands=["minipaged check 12"],
        verdicts=ctx.verdicts("others-page-too"))


@drill("refcount-cap", "vLLM是否限制共享块的最大引用计数（默认16）？",
       "Does vLLM cap a shared block's reference count (at 16)?", source="the answer's claim")
def refcount_cap(ctx: Context) -> Answer:
    f = ctx.finding("refcount-cap")
    return Answer(
        "There is no cap. The paper's copy-on-write (section 4.4) and vLLM v0's RefCounter "
        "(vllm/core/block/common.py) only require the count to stay >= 0; v1's blocks count users "
        "the same way (ref_cnt, vllm/v1/core/kv_cache_utils.py). 16 is the default block size, not "
        "a reference limit. What limits sharing is memory for the copies.",
        figures=[("reference count of a block after 100 forks", str(f.figures["ref_count"]))],
        commands=["python lessons/04_copy_on_write.py"],
        verdicts=ctx.verdicts("refcount-cap"))


@drill("no-replacement", "KV Cache访问是顺序的，所以不需要LRU等替换策略？",
       "KV access is sequential, so no page replacement (LRU etc.) is needed?",
       source="the answer's claim")
def no_replacement(ctx: Context) -> Answer:
    f = ctx.finding("no-page-replacement").figures
    return Answer(
        "Wrong on both counts. When blocks run out vLLM preempts whole sequence groups, most "
        "recently arrived first, and either swaps their blocks to CPU memory or drops them to "
        "recompute later (paper section 4.5; the v1 engine only recomputes): that is page "
        "replacement with a victim policy. And vLLM's prefix cache keeps freed blocks and evicts "
        "the least recently used one when it needs memory (vllm/v1/core/block_pool.py); "
        "minipaged's does the same (sharing/prefix_cache.py).",
        figures=[
            ("preemptions, ShareGPT, 2 GiB of KV cache, 2 requests/s (recompute)",
             str(f["preemptions"])),
            ("prefix hit of a 9-token prompt, BS 4, pool of 4, before eviction",
             f"{f['hit_before']} tokens"),
            ("  after two other prompts evicted it (LRU)", f"{f['hit_after']} tokens"),
        ],
        commands=[ctx.sim_command(**PRESSURE_RUN),
                  "minipaged demo preempt", "minipaged demo prefix"],
        verdicts=ctx.verdicts("no-page-replacement"))


DRILLS = (question, follow_up_1, follow_up_2, follow_up_3, pitfall_concept, pitfall_block_size,
          pitfall_vllm_only, refcount_cap, no_replacement)
