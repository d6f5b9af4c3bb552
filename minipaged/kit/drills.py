"""The interview drills behind ``minipaged quiz``: questions, and answers that measure.

What it teaches: a good answer to a systems question carries numbers, and the numbers come
from a model one can run. Each ``_answer_*`` function below computes its figures now, through
the package (``minipaged.sim`` calculator, cost model and simulator; ``KVCacheManager``; the
attention code); small formulas the package has no function for (vLLM's x-packing, the v2
kernel's grid, a two-level table) are written out here and say so.

The seed (``shared/seeds/``, Q32) is quoted in Chinese; its claims are checked, not repeated
(``minipaged factcheck`` does the same claim by claim). Read before: ``minipaged/quiz.py``.
"""

from __future__ import annotations

import numpy as np

from minipaged.kit.drills_more import (
    _answer_block_size_limits,
    _answer_capacity,
    _answer_cow_vs_prefix,
    _answer_decode_traffic,
    _answer_gqa,
    _answer_last_token,
    _answer_sharing_savings,
    _answer_swap_vs_recompute,
    _answer_table_to_kernel,
    _answer_v1_v2,
    _answer_why_16,
    _answer_x_packing,
)
from minipaged.kit.quiz import Answer, Context, Drill, nbytes, pct

POLICIES = ("orca-max", "orca-pow2", "orca-oracle", "paged")


def _usage(r) -> dict[str, float]:
    return r.kv_usage_saturated or r.kv_usage


# ---- the seed question and its follow-ups ----------------------------------------------------

def _answer_seed(ctx: Context) -> Answer:
    runs = {p: ctx.sim(policy=p) for p in POLICIES}
    tok = {p: _usage(r)["token"] for p, r in runs.items()}
    orca = [tok[p] for p in POLICIES[:3]]
    figures = [(f"{p}: token states (while requests queue, else whole run)", pct(tok[p]))
               for p in POLICIES]
    figures += [(f"{p}: average batch size", f"{runs[p].avg_batch_size:.1f}") for p in POLICIES]
    ratio_max = runs["paged"].throughput_tokens_per_s / runs["orca-max"].throughput_tokens_per_s
    ratio_oracle = (runs["paged"].throughput_tokens_per_s
                    / runs["orca-oracle"].throughput_tokens_per_s)
    figures += [("throughput paged / orca-max", f"{ratio_max:.2f}x"),
                ("throughput paged / orca-oracle", f"{ratio_oracle:.2f}x")]
    lo, hi = min(orca), max(orca)
    return Answer(
        text=(
            "Decode keeps every past token's K and V (the KV cache); a request's cache grows "
            "one token at a time to a length nobody knows in advance. Reserving one contiguous "
            "region per request wastes most of it: slots reserved for later, slots never used "
            "(internal fragmentation), and free gaps too small for a new region (external). "
            "PagedAttention cuts the cache into fixed-size blocks allocated on demand; each "
            "sequence's block table maps logical block -> physical block like an OS page table; "
            "the kernel reads K/V through it (slot = block * BS + offset). Waste is bounded by "
            "one partly filled block per sequence, blocks can be shared (copy-on-write, prefix "
            "caching), and the larger batch that fits is where the throughput comes from."),
        figures=figures,
        commands=[ctx.sim_command(policy=p) for p in POLICIES] + ["minipaged factcheck"],
        verdicts=[
            ("预分配显存利用率通常只有30%-60%", "holds" if lo >= 0.3 and hi <= 0.6 else "off",
             f"measured {pct(lo)}-{pct(hi)} token states for the three Orca policies; the "
             f"paper's Fig. 2 says 20.4%-38.2%."),
            ("显存利用率提升到90%+", "holds" if tok["paged"] >= 0.9 else "off",
             f"measured {pct(tok['paged'])} (paper: about 96%; fewer requests than fill the "
             f"cache leave it partly free, so measure with several hundred)."),
            ("吞吐量提升2-4倍", "holds" if 2 <= ratio_max <= 4 else "off",
             f"measured x{ratio_max:.2f} over orca-max and x{ratio_oracle:.2f} over "
             f"orca-oracle at saturation (the paper's 2-4x compares request rates at equal "
             f"latency)."),
            ("batch size从8提升到32", "unsupported",
             f"the paper gives no such batch sizes; measured average batch "
             f"{runs['orca-max'].avg_batch_size:.1f} (orca-max), "
             f"{runs['orca-oracle'].avg_batch_size:.1f} (orca-oracle), "
             f"{runs['paged'].avg_batch_size:.1f} (paged)."),
        ])


def two_level_bytes(seq_len: int, max_context: int, block_size: int, leaf_size: int,
                    entry_bytes: int = 4) -> int:
    """Directory (covers max_context) + the leaves a sequence uses (exercise 13's formula; the
    package itself keeps flat tables, so this small function lives here)."""
    mb = -(-max_context // block_size)
    used = -(-seq_len // block_size)
    return (-(-mb // leaf_size) + -(-used // leaf_size) * leaf_size) * entry_bytes


def _answer_follow_up_1(ctx: Context) -> Answer:
    from minipaged.sim.memory import MODELS, block_table_bytes

    t128 = block_table_bytes(131072, 16)
    t128_8 = block_table_bytes(131072, 16, entry_bytes=8)
    t32 = block_table_bytes(32768, 16)
    kv128 = MODELS["llama-3-8b"].kv_bytes_per_token * 131072
    flat_short = block_table_bytes(131072, 16)
    two_short = two_level_bytes(2048, 131072, 16, 256)
    return Answer(
        text=(
            "One int32 entry per logical block: ceil(128K / 16) = 8192 entries. No status bits "
            "are needed (how full the last block is follows from seq_len). Next to the KV cache "
            "itself the table is negligible. Optimisations: int16 entries while NB < 32768 "
            "(halves it), larger blocks, and a two-level table, which only helps when tables "
            "are padded to the maximum context while most sequences are short; vLLM pads only "
            "to the longest sequence of the batch, so it keeps a flat table."),
        figures=[
            ("block table, 128K tokens, BS 16, int32", nbytes(t128)),
            ("  the same with 8-byte entries (the seed's assumption)", nbytes(t128_8)),
            ("  x 1000 requests", nbytes(t128 * 1000)),
            ("block table, 32K tokens, x 1000 requests", nbytes(t32 * 1000)),
            ("KV cache of one 128K-token request, Llama-3-8B fp16", nbytes(kv128)),
            ("table / KV cache", f"{t128 / kv128:.1e}"),
            ("2K-token request padded to 128K: flat table", nbytes(flat_short)),
            ("  two-level (leaves of 256 entries)", nbytes(two_short)),
        ],
        commands=["minipaged kv-calc --model llama-3-8b --context-len 131072 --num-requests 1000",
                  "minipaged kv-calc --context-len 32768 --num-requests 1000",
                  "minipaged check 13   (the two-level table exercise)"],
        verdicts=[
            ("8192*8=64KB/请求", "off",
             f"with vLLM's int32 entries it is {nbytes(t128)}; 64 KiB needs 8-byte entries."),
            ("约0.5GB/1000请求 (32K token)", "off",
             f"measured {nbytes(t32 * 1000)} for 1000 requests of 32K tokens."),
        ])


def _paged_waste(n: int, bs: int) -> tuple[int, int]:
    """(internal fragmentation slots, allocated slots) of one finished n-token sequence, read
    from a real KVCacheManager."""
    from minipaged.serving.swap import KVCacheManager

    m = KVCacheManager(-(-n // bs) + 1, bs)
    m.allocate("r", list(range(n)))
    u = m.usage({"r": n})
    return u.internal_fragmentation, u.token + u.reserved + u.internal_fragmentation


def _answer_follow_up_2(ctx: Context) -> Answer:
    w32, a32 = _paged_waste(33, 32)
    w16, a16 = _paged_waste(33, 16)
    lens = ctx.final_lens("sharegpt")
    mean = {bs: float(np.mean(-(-lens // bs) * bs - lens)) for bs in (16, 32)}
    return Answer(
        text=(
            "Doubling the block size halves the block table and the number of blocks a decode "
            "step walks, and doubles the worst-case unused tail (up to BS-1 slots per "
            "sequence; BS/2 on average). The paper (Fig. 18b) finds ShareGPT equally fast from "
            "16 to 128 and Alpaca's short sequences slower with large blocks. For the seed's "
            "33-token example the arithmetic is below: 48% does not become 94%."),
        figures=[
            ("33 tokens, BS 32: unused / allocated slots", f"{w32}/{a32} = {pct(w32 / a32)}"),
            ("33 tokens, BS 16: unused / allocated slots", f"{w16}/{a16} = {pct(w16 / a16)}"),
            ("ShareGPT-like lengths: mean unused slots per sequence, BS 16",
             f"{mean[16]:.1f}"),
            ("  BS 32", f"{mean[32]:.1f}"),
        ],
        commands=[ctx.sim_command(block_size=16), ctx.sim_command(block_size=32),
                  "minipaged check 2   (paged_breakdown)"],
        verdicts=[("碎片率从48%升到94%", "off",
                   f"33 tokens waste {pct(w32 / a32)} at BS 32 and {pct(w16 / a16)} at BS 16; "
                   f"nothing gives 94%.")])


def _answer_follow_up_3(ctx: Context) -> Answer:
    figures: list[tuple[str, str]] = []
    try:
        from minipaged.attention import dense_attention
        from minipaged.paged.paged_attention import paged_attention
    except ImportError:
        figures.append(("online paged attention vs dense (tile = BS)",
                        "attention modules not installed in this checkout"))
    else:
        rng = np.random.default_rng(ctx.seed)
        bs, nb, hkv, h, d, n = 16, 12, 2, 8, 64, 150
        kc = rng.standard_normal((nb, hkv, bs, d)).astype(np.float32)
        vc = rng.standard_normal((nb, hkv, bs, d)).astype(np.float32)
        table = rng.permutation(nb)[: -(-n // bs)].astype(np.int32)[None]
        q = rng.standard_normal((1, h, d)).astype(np.float32)
        lens = np.array([n], np.int32)
        out = paged_attention(q, kc, vc, table, lens, method="online")
        k = kc[table[0]].transpose(0, 2, 1, 3).reshape(-1, hkv, d)[:n]
        v = vc[table[0]].transpose(0, 2, 1, 3).reshape(-1, hkv, d)[:n]
        tiled = dense_attention(q, k, v, tile=bs)
        plain = dense_attention(q, k, v)
        figures += [("max |paged online - dense(tile=16)|, 150 tokens, fp32",
                     f"{float(np.abs(out - tiled).max()):.1e}"),
                    ("max |paged online - plain softmax|",
                     f"{float(np.abs(out - plain).max()):.1e}")]
    return Answer(
        text=(
            "Yes, they compose: FlashAttention already walks K/V tile by tile with an online "
            "softmax, and a page is just a tile whose address comes from the block table. The "
            "frictions are practical: upstream flash_attn_with_kvcache takes block_table "
            "[batch, max_blocks] but requires page_size to be a multiple of 256 (vLLM's fork "
            "relaxes it to 16), and cache layouts differ ([NB, BS, Hkv, D] there, [NB, Hkv, BS, "
            "D] here). FlashInfer takes the table as CSR (kv_indptr, kv_indices, "
            "kv_last_page_len). Below: the block-by-block paged computation equals tiled dense "
            "attention exactly, and plain attention to rounding."),
        figures=figures,
        commands=["python lessons/03_paging.py", "minipaged check 7", "minipaged check 12"])


def _answer_pitfall_concept(ctx: Context) -> Answer:
    from minipaged.serving.swap import KVCacheManager

    m = KVCacheManager(8, 16)
    m.allocate("parent", list(range(20)))           # 1 full block + 4 tokens in the second
    m.fork("parent", "child")
    before = m.block_table("child")
    counts = [m.ref_count(b) for b in before]
    slot = m.append_slot("child", 7)
    copies = m.take_copies()
    after = m.block_table("child")
    slot_parent = m.append_slot("parent", 8)
    return Answer(
        text=(
            "\"Pages for the KV cache\" is only the headline. Say how the mapping works (block "
            "table: logical block -> physical block; slot = block * BS + offset, which the "
            "kernel and reshape_and_cache use) and when copy-on-write triggers: when a sequence "
            "writes into a block whose reference count is above 1. Only the last, partly "
            "filled block of a shared prompt is ever copied; full blocks stay shared."),
        figures=[
            ("20-token prompt, BS 16, forked: child's table / ref counts",
             f"{before} / {counts}"),
            ("child appends a token: slot, new table", f"{slot}, {after}"),
            ("copies recorded (src, dst)", str(copies)),
            ("parent appends next: slot (in place, no copy)", str(slot_parent)),
        ],
        commands=["minipaged demo fork", "python lessons/04_*.py", "minipaged check 8"])


def _answer_pitfall_block_size(ctx: Context) -> Answer:
    from minipaged.sim.memory import block_table_bytes

    lens = ctx.final_lens("sharegpt")
    figures = []
    for bs in (1, 8, 16, 32, 64, 128, 256):
        waste = float(np.mean(-(-lens // bs) * bs - lens))
        share = float(np.sum(-(-lens // bs) * bs - lens) / np.sum(-(-lens // bs) * bs))
        figures.append((f"BS {bs:>3}: unused slots per sequence / share / table for 2K",
                        f"{waste:6.1f} / {pct(share)} / {nbytes(block_table_bytes(2048, bs))}"))
    return Answer(
        text=(
            "Bigger is not better: the table shrinks, but every sequence's last block wastes "
            "BS/2 slots on average, blocks are the granularity of sharing (prefix caching "
            "shares only full blocks) and of swapping, and the kernel's work split depends on "
            "it. 16 balances these on the paper's workloads; the table's size never matters "
            "(kilobytes next to gigabytes of KV)."),
        figures=figures,
        commands=[ctx.sim_command(block_size=bs) for bs in (16, 128)])


def _answer_pitfall_vllm_only(ctx: Context) -> Answer:
    return Answer(
        text=(
            "The idea is general. TensorRT-LLM pages its KV cache in blocks; FlashAttention's "
            "flash_attn_with_kvcache takes a block_table; FlashInfer stores the page table as "
            "CSR (kv_indptr, kv_indices, kv_last_page_len); SGLang's RadixAttention keeps a "
            "radix tree over token ids with page size 1 and LRU eviction. Exercise 12 converts "
            "between vLLM's padded table and FlashInfer's CSR."),
        commands=["minipaged check 12"])


def _answer_refcount_cap(ctx: Context) -> Answer:
    from minipaged.serving.swap import KVCacheManager

    m = KVCacheManager(4, 16)
    m.allocate("p", list(range(16)))
    for i in range(100):
        m.fork("p", f"c{i}")
    return Answer(
        text=(
            "There is no cap. The paper's copy-on-write (section 4.4) and vLLM's RefCounter "
            "only require the count to stay >= 0; 16 is the default block size, not a "
            "reference limit. What limits sharing is memory for the copies, and vLLM v1 "
            "dropped copy-on-write altogether for prefix caching."),
        figures=[("reference count of a block after 100 forks", str(m.ref_count(0)))],
        commands=["python lessons/04_*.py"],
        verdicts=[("限制共享块的最大引用计数（默认16）", "off",
                   f"100 forks give ref_count {m.ref_count(0)}; vLLM has no such cap.")])


def _answer_no_replacement(ctx: Context) -> Answer:
    from minipaged.serving.swap import KVCacheManager

    r = ctx.sim(kv_cache_gb=2, preemption_mode="recompute")
    m = KVCacheManager(4, 4, enable_prefix_caching=True)
    prompts = [[a] * 9 for a in (1, 2, 3)]
    m.allocate("a", prompts[0])
    m.free("a")
    hit_before = m.allocate("a2", prompts[0])
    m.free("a2")
    m.allocate("b", prompts[1])
    m.free("b")
    m.allocate("c", prompts[2])
    m.free("c")
    hit_after = m.allocate("a3", prompts[0])
    return Answer(
        text=(
            "Wrong on both counts. When blocks run out vLLM preempts whole sequence groups, "
            "most recently arrived first, and either swaps their blocks to CPU memory or drops "
            "them to recompute later (paper section 4.5): that is page replacement with "
            "a victim policy. And the prefix cache keeps freed blocks and evicts the least "
            "recently used one when it needs memory."),
        figures=[
            ("preemptions, 2 GiB of KV cache (recompute)", str(r.num_preemptions)),
            ("prefix hit of a 9-token prompt, BS 4, pool of 4, before eviction",
             f"{hit_before} tokens"),
            ("  after two other prompts evicted it (LRU)", f"{hit_after} tokens"),
        ],
        commands=[ctx.sim_command(kv_cache_gb=2, preemption_mode="recompute"),
                  "minipaged demo preempt", "minipaged demo prefix"],
        verdicts=[("不需要LRU等替换策略", "off",
                   f"{r.num_preemptions} preemptions in that run; prefix-cache hits fall from "
                   f"{hit_before} to {hit_after} tokens after LRU eviction.")])


SEED_Q = "Q32：vLLM PagedAttention 原理"
DRILLS: tuple[Drill, ...] = (
    Drill("seed", "seed question", SEED_Q,
          "Explain vLLM's PagedAttention: what problem it solves and how.", _answer_seed),
    Drill("follow-up-1", "seed follow-up 1",
          "追问 1：PagedAttention的Block Table在长序列（如128K token）下会占用多少显存？怎么优化？",
          "How much memory does the block table take for long sequences (128K tokens)? "
          "How would you reduce it?", _answer_follow_up_1),
    Drill("follow-up-2", "seed follow-up 2",
          "追问 2：如果块大小改成32 token，对性能有什么影响？",
          "What changes if the block size becomes 32 tokens?", _answer_follow_up_2),
    Drill("follow-up-3", "seed follow-up 3",
          "追问 3：PagedAttention和FlashAttention能一起用吗？有什么冲突？",
          "Can PagedAttention and FlashAttention be used together? Any conflicts?",
          _answer_follow_up_3),
    Drill("pitfall-concept", "seed pitfall 1",
          "避坑：只说“PagedAttention就是分页存储KV Cache，减少显存浪费”够吗？",
          "Is \"it stores the KV cache in pages to save memory\" enough? What must you add?",
          _answer_pitfall_concept),
    Drill("pitfall-block-size", "seed pitfall 2",
          "避坑：“块大小越大越好，因为减少表开销”对吗？",
          "\"Bigger blocks are better because the table shrinks\": right?",
          _answer_pitfall_block_size),
    Drill("pitfall-vllm-only", "seed pitfall 3",
          "避坑：“PagedAttention只适用于vLLM”对吗？",
          "\"PagedAttention only applies to vLLM\": right?", _answer_pitfall_vllm_only),
    Drill("refcount-cap", "seed claim",
          "vLLM是否限制共享块的最大引用计数（默认16）？",
          "Does vLLM cap a shared block's reference count (at 16)?", _answer_refcount_cap),
    Drill("no-replacement", "seed claim",
          "KV Cache访问是顺序的，所以不需要LRU等替换策略？",
          "KV access is sequential, so no page replacement (LRU etc.) is needed?",
          _answer_no_replacement),
    Drill("why-16", "interviewer", "为什么默认块大小是16？",
          "Why is the default block size 16?", _answer_why_16),
    Drill("x-packing", "interviewer", "vLLM的key cache布局里的x是做什么的？",
          "What is the x in vLLM's key cache layout [NB, Hkv, D/x, BS, x] for?",
          _answer_x_packing),
    Drill("v1-v2", "interviewer", "paged_attention v1和v2内核有什么区别？什么时候用v2？",
          "What is the difference between the v1 and v2 paged attention kernels? When v2?",
          _answer_v1_v2),
    Drill("cow-vs-prefix", "interviewer",
          "写时复制和前缀缓存有什么区别？vLLM v1为什么放弃了写时复制？",
          "Copy-on-write versus prefix caching: what differs, and why did vLLM v1 drop CoW?",
          _answer_cow_vs_prefix),
    Drill("swap-vs-recompute", "interviewer", "抢占时换出和重计算怎么选？",
          "Preemption: swap or recompute, and what does each cost?",
          _answer_swap_vs_recompute),
    Drill("table-to-kernel", "interviewer", "块表是怎么传到kernel里的？",
          "How does the block table reach the kernel?", _answer_table_to_kernel),
    Drill("gqa", "interviewer", "GQA对KV Cache有什么影响？",
          "What does GQA do to the KV cache?", _answer_gqa),
    Drill("block-size-limits", "interviewer", "GPU上是什么限制了块大小的选择？",
          "What limits the block size on GPUs, in both directions?",
          _answer_block_size_limits),
    Drill("capacity", "interviewer", "一张A100-40GB跑OPT-13B能放下多少token、多少请求？",
          "How many tokens and requests fit for OPT-13B on one A100-40GB?", _answer_capacity),
    Drill("decode-traffic", "interviewer", "为什么批越大吞吐越高？decode一步读了多少数据？",
          "Why does a bigger batch give more throughput? What does a decode step read?",
          _answer_decode_traffic),
    Drill("last-token", "interviewer", "前缀缓存命中时，为什么最后一个token总要重算？",
          "With prefix caching, why is the last prompt token always recomputed?",
          _answer_last_token),
    Drill("sharing-savings", "interviewer", "并行采样和束搜索分别能省多少显存？为什么差这么多？",
          "How much memory do parallel sampling and beam search save, and why so different?",
          _answer_sharing_savings),
)
