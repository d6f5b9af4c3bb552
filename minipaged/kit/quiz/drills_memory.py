"""Interviewer drills on memory: block size, capacity, GQA, decode traffic, preemption.

Each answer computes its figures as it prints, through the calculator (``sim/memory.py``),
the cost model (``sim/cost.py``) and the simulator. Read before: ``drills_answer.py``.
"""

from __future__ import annotations

import numpy as np

from minipaged._checks import cdiv
from minipaged.kit.quiz.context import PRESSURE_RUN, Answer, Context, drill, nbytes
from minipaged.sim import memory
from minipaged.sim.cost import CostModel


def opt_13b() -> tuple[memory.MemoryPreset, CostModel]:
    """The paper's model on an A100-40GB (Table 1), and the cost model of that pair."""
    p = memory.preset("opt-13b")
    return p, CostModel.for_preset(p)


def swap_ms(tokens: int, block_size: int) -> str:
    """The cost model's time to swap a sequence of ``tokens`` out, one copy per block."""
    p, cost = opt_13b()
    t = cost.step_time(0, 0, blocks_swapped=cdiv(tokens, block_size),
                       block_bytes=p.model.kv_bytes_per_token * block_size)
    return f"{1e3 * t:.1f} ms"


@drill("why-16", "为什么默认块大小是16？", "Why is the default block size 16?")
def why_16(ctx: Context) -> Answer:
    sweep = ctx.block_sweep()["alpaca"]
    return Answer(
        "Large enough that a warp's work per block and the table walk stay cheap, small enough "
        "that the unused tail ((BS-1)/2, about BS/2, per sequence on average) stays small next to "
        "short sequences. "
        "The paper (Fig. 18b, section 7.2): ShareGPT is fastest anywhere from 16 to 128; Alpaca "
        "(short requests) does well at 16-32 and degrades with larger blocks; vLLM defaults to 16 "
        "as good on most workloads. vLLM's legacy CUDA kernel is a template instantiated for 8, 16 "
        "and 32 only, to cut compile time (csrc/attention/); the v1 engine accepts more (its "
        "FlashAttention backend: any multiple of 16, vllm/v1/attention/backends/flash_attn.py).",
        figures=[
            *((f"Alpaca, BS {bs}: avg batch / tokens per s",
               f"{sweep[bs]['avg_batch_size']:.1f} / {sweep[bs]['throughput_tokens_per_s']:.0f}")
              for bs in (16, 32, 128)),
            ("Alpaca: block size with the highest throughput", str(sweep["best_block_size"])),
            ("ShareGPT lengths, mean unused slots per sequence at BS 16",
             f"{float(np.mean(ctx.unused_slots(16))):.1f}"),
        ],
        commands=[f"minipaged experiment 4 --num-requests {ctx.num_requests} --seed {ctx.seed}"])


@drill("block-size-limits", "GPU上是什么限制了块大小的选择？",
       "What limits the block size on GPUs, in both directions?")
def block_size_limits(ctx: Context) -> Answer:
    figures = [(f"BS {bs}: lanes per token (thread group = max(32 / BS, 1))",
                str(max(32 // bs, 1))) for bs in (8, 16, 32)]
    figures += [(f"BS {bs}: swap a 2048-token sequence out", swap_ms(2048, bs))
                for bs in (1, 16, 256)]
    return Answer(
        "Small blocks: each block costs a table lookup and a scattered read, a warp processes one "
        "block at a time, and swapping makes one small copy per block. Large blocks: the unused "
        "tail grows, fewer prefixes are shareable (only full blocks are cached), and in vLLM's "
        "legacy paged kernel (the v0 engine's) a warp's lanes split a block's tokens into thread "
        "groups, so the block size is a template parameter (instantiated for 8, 16, 32; "
        "csrc/attention/paged_attention_v1.cu). FlashAttention's upstream paged path requires "
        "multiples of 256 (flash_attn_with_kvcache); vLLM's fork and its v1 backend take multiples "
        "of 16.",
        figures=figures,
        commands=["minipaged bench kernel --help", ctx.sim_command(block_size=256)])


@drill("capacity", "一张A100-40GB跑OPT-13B能放下多少token、多少请求？",
       "How many tokens and requests fit for OPT-13B on one A100-40GB?")
def capacity(ctx: Context) -> Answer:
    r = memory.kv_calc(memory.preset("opt-13b"), context_len=2048)
    lens = ctx.final_lens("sharegpt")
    return Answer(
        "OPT-13B on an A100-40GB keeps about 12 GiB for the KV cache after 26 GB of weights (the "
        "paper's Table 1). At 800 KiB per token that is about 15.7K token slots: only a handful of "
        "requests if each reserves the maximum length, several times more if each holds only what "
        "it uses.",
        figures=[
            ("KV bytes per token", nbytes(r["kv_bytes_per_token"])),
            ("token slots in 12 GiB", f"{r['token_slots']:,}"),
            ("requests reserving 2048 slots each", f"{r['requests_that_fit']:,}"),
            ("requests of mean ShareGPT-like length (prompt + output)",
             f"{r['token_slots'] // int(lens.mean()):,} (mean {lens.mean():.0f} tokens)"),
        ],
        commands=["minipaged kv-calc --model opt-13b --context-len 2048"])


@drill("gqa", "GQA对KV Cache有什么影响？", "What does GQA do to the KV cache?")
def gqa(ctx: Context) -> Answer:
    m = memory.MODELS["llama-3-8b"]
    p = memory.preset("llama-3-8b")
    mha = 2 * m.num_layers * m.num_heads * m.head_size * m.dtype_bytes
    return Answer(
        "The cache stores K and V per KV head, so GQA divides it by H / Hkv (4 for Llama-3-8B: 32 "
        "query heads share 8 KV heads). Four times the tokens fit, so four times the batch, or "
        "four times the context. Query head h reads KV head h // (H / Hkv). vLLM's legacy paged "
        "kernel runs one thread block per query head (grid (num_heads, num_seqs, partitions), "
        "csrc/attention/attention_kernels.cuh), so each re-reads its KV head (reuse only through "
        "the L2 cache); FlashAttention-2 can, for one-token queries, load a KV head once for its "
        "group (csrc/flash_attn/flash_api.cpp, seqlenq_ngroups_swapped). minipaged's kernels "
        "(cuda/paged_attention.cu) have both: v1/v2 as vLLM's, v3/v4 one thread block per KV "
        "head and up to 8 of its query heads, whenever H > Hkv (cuda/checks.py, choose_version).",
        figures=[
            ("Llama-3-8B KV per token (8 KV heads)", nbytes(m.kv_bytes_per_token)),
            ("  the same model with 32 KV heads (MHA)", nbytes(mha)),
            (f"token slots in {nbytes(p.kv_cache_bytes)} of KV cache (H100-80GB): GQA / MHA",
             f"{p.num_token_slots:,} / {p.kv_cache_bytes // mha:,}"),
        ],
        commands=["minipaged kv-calc --model llama-3-8b",
                  "minipaged kv-calc --model llama-3-8b --kv-heads 32"])


@drill("decode-traffic", "为什么批越大吞吐越高？decode一步读了多少数据？",
       "Why does a bigger batch give more throughput? What does a decode step read?")
def decode_traffic(ctx: Context) -> Answer:
    p, cost = opt_13b()
    ctx_len = p.num_token_slots // 32 // 50 * 50  # contexts that 32 sequences fit in the cache
    figures = [("OPT-13B on an A100-40GB: weights read per step", nbytes(p.model.weight_bytes)),
               ("KV token slots of the cache (batch x context must fit)",
                f"{p.num_token_slots:,}")]
    for batch in (8, 32):
        t = cost.step_time(batch, batch * ctx_len)
        figures.append((f"batch {batch} x {ctx_len}-token contexts: KV read / step time / tok/s",
                        f"{nbytes(batch * ctx_len * p.model.kv_bytes_per_token)} / "
                        f"{1e3 * t:.1f} ms / {batch / t:.0f}"))
    return Answer(
        "A decode step reads every weight once whatever the batch, plus every running sequence's "
        "KV. Both are memory-bound, so a step of 32 sequences costs far less than 4 steps of 8: "
        "throughput grows with the batch, and the batch is limited by KV memory. That is the whole "
        "case for wasting less of it.",
        figures=figures,
        commands=[ctx.sim_command(policy="orca-max"), ctx.sim_command(policy="paged")])


@drill("swap-vs-recompute", "抢占时换出和重计算怎么选？",
       "Preemption: swap or recompute, and what does each cost?")
def swap_vs_recompute(ctx: Context) -> Answer:
    figures = [(f"swap out a 1000-token sequence, BS {bs}", swap_ms(1000, bs))
               for bs in (1, 16, 256)]
    figures.append(("recompute 1000 tokens (one prefill step)",
                    f"{1e3 * opt_13b()[1].step_time(1000, 1000):.1f} ms"))
    for mode in ("swap", "recompute"):
        r = ctx.pressure() if mode == "recompute" else ctx.sim(**PRESSURE_RUN,
                                                               preemption_mode=mode)
        figures.append((f"ShareGPT, 2 GiB KV, 2 req/s, {mode}: preemptions / normalized latency",
                        f"{r.num_preemptions} / {r.normalized_latency_s_per_token:.3f} s/token"))
    return Answer(
        "Swap copies a preempted group's blocks to a CPU pool over PCIe and back; recompute drops "
        "them and re-runs prompt + generated tokens as one prefill later. Swapping pays per block "
        "copied (small blocks: many small copies), recomputation pays compute that does not depend "
        "on the block size. The paper (Fig. 19) finds them comparable for blocks of 16-64. vLLM v0 "
        "by default recomputed single-sequence groups and swapped groups of several sequences "
        "(beam search, n > 1), which it could not recompute (vllm/core/scheduler.py, _preempt); "
        "the v1 engine only recomputes (vllm/v1/core/sched/scheduler.py). minipaged does either, "
        "as configured.",
        figures=figures,
        commands=[ctx.sim_command(**PRESSURE_RUN, preemption_mode=m)
                  for m in ("swap", "recompute")] + ["minipaged check 11"])


DRILLS = (why_16, block_size_limits, capacity, gqa, decode_traffic, swap_vs_recompute)
