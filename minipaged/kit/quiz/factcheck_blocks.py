"""The fact-check's claims about the block: its size, its table and the kernels that read it.

What this teaches: the block-size claims of the interview answer (the default of 16, the "sweet
spot", the block table's bytes at 32K and 128K tokens, the 33-token example) measured with the
simulator's block-size sweep and ``kv-calc``'s arithmetic, and what FlashAttention, FlashInfer
and other systems take as a paged cache, from their sources. Each check registers itself in
``factcheck.CHECKS``, which puts every claim in the answer's order.
Read before: ``factcheck.py``. Read next: ``drills_answer.py``.
"""

from __future__ import annotations

from minipaged import ContiguousKVCache
from minipaged.kit.quiz.context import Context, Finding, finding, pct
from minipaged.kit.quiz.factcheck import check, one_sequence_waste, sourced
from minipaged.sim import memory

sourced(
    "default-block-16", "minipaged's simulator and vLLM both default to block_size=16",
    "holds", "vLLM: CacheConfig.DEFAULT_BLOCK_SIZE = 16 (vllm/config/cache.py), chosen as "
    "large enough for the GPU and small enough for little fragmentation (paper section "
    "7.2). Its legacy paged-attention CUDA kernel is a template instantiated for 8, 16 and "
    "32 only, to cut compile time (csrc/attention/); the v1 engine's FlashAttention "
    "backend takes any multiple of 16 (vllm/v1/attention/backends/flash_attn.py)")


@check
def sweet_spot_16(ctx: Context) -> Finding:
    best = {w: r["best_block_size"] for w, r in ctx.block_sweep().items()}
    return finding(
        "sweet-spot-16", "highest simulated throughput at block size "
        + ", ".join(f"{w}: {b}" for w, b in best.items()),
        "off", "the paper finds a range, not a point: ShareGPT is fastest from 16 to 128, "
        "Alpaca at 16-32 (Fig. 18b, section 7.2); 16 is the default because it is good on "
        "most workloads, not because it is the optimum", best=best)


@check
def block_table_32k(ctx: Context) -> Finding:
    per = memory.block_table_bytes(32 * 1024, 16)
    kv = 32 * 1024 * memory.MODELS["opt-13b"].kv_bytes_per_token  # the K/V the table points at
    return finding(
        "block-table-32k", f"32768 tokens / 16 = 2048 int32 entries = {per} B per request, "
        f"{per * 1000 / 2**20:.1f} MiB per 1000 requests",
        "off", f"about {per * 1000 / 2**20:.0f} MiB per 1000 requests, "
        f"{0.5e9 / (per * 1000):.0f}x less than the 0.5 GB claimed (the KV itself would be "
        f"{kv / 2**30:.0f} GiB per request for OPT-13B)",
        bytes_per_request=per, bytes_per_1000=per * 1000)


sourced(
    "int32-compression", "block tables are int32 [S, MB] in minipaged, as in vLLM "
    "(vllm/v1/worker/block_table.py) and FlashAttention (flash_attn_with_kvcache)",
    "unsupported", "int32 is simply the table's type in vLLM, not a mitigation of its "
    "size, and no source says otherwise; the table is small anyway (see the 32K claim)")


@check
def block_table_128k(ctx: Context) -> Finding:
    blocks = 128 * 1024 // 16
    b4 = memory.block_table_bytes(128 * 1024, 16)
    b8 = memory.block_table_bytes(128 * 1024, 16, entry_bytes=8)
    return finding(
        "block-table-128k", f"{blocks} blocks (holds); int32 entries: {b4 // 1024} KiB per "
        f"request, {b4 * 1000 / 2**20:.1f} MiB per 1000; with 8 B entries {b8 // 1024} KiB",
        "off", "8192 blocks is right, but vLLM's entries are 4 bytes (int32, no status bits; "
        "vllm/v1/worker/block_table.py): 32 KiB per request, about 31 MiB per 1000; 64 KiB "
        "only with 8-byte entries",
        blocks=blocks, bytes_int32=b4, bytes_8=b8)


@check
def block_size_tradeoff(ctx: Context) -> Finding:
    sweep = ctx.block_sweep()["sharegpt"]
    t16, t32 = (sweep[b]["block_table_bytes_per_request"] for b in (16, 32))
    w16, w32 = (sweep[b]["waste_share_of_used"] for b in (16, 32))
    return finding(
        "block-size-tradeoff", f"ShareGPT: table {t16:.0f} -> {t32:.0f} B per request, waste "
        f"{pct(w16)} -> {pct(w32)} of used memory (block 16 -> 32)",
        "holds", "both directions measured; the table halves up to rounding",
        table_16=t16, table_32=t32, waste_16=w16, waste_32=w32)


@check
def block_32_example(ctx: Context) -> Finding:
    c = ContiguousKVCache(64, 1, 1, policy="max", max_seq_len=64, store_kv=False)
    c.reserve("r", 33, 33)
    c.advance("r", 33)
    contig = c.usage().internal_fragmentation / 64
    waste = {}
    for bs in (16, 32):
        unused, allocated = one_sequence_waste(33, bs)
        waste[bs] = unused / allocated
    return finding(
        "block-32-example", f"contiguous max-64: {pct(contig)} wasted; paged block 32: "
        f"{pct(waste[32])}; paged block 16: {pct(waste[16])} (unused slots / slots allocated)",
        "off", "the same 31 unused slots are divided by two denominators: 31/64 = 48% of the "
        "slots allocated, 31/33 = 94% of the tokens held; with one denominator block 32 "
        "wastes what a contiguous 64-slot region does, and block 16 wastes 15/48 = 31%",
        contiguous=contig, paged_32=waste[32], paged_16=waste[16])


sourced(
    "flashattention-compatible", "FlashAttention's flash_attn_with_kvcache takes a "
    "block_table int32 [batch, max_blocks] and a paged cache [num_blocks, page_size, Hkv, D]",
    "holds", "upstream requires page_size to be a multiple of 256 (flash_attn's "
    "flash_attn_with_kvcache docstring); vLLM's fork (vllm-project/flash-attention) "
    "relaxes it to 16, and vLLM v1's FlashAttention backend, its first choice on NVIDIA GPUs "
    "but those of compute capability 10.x (B200: FlashInfer first; vllm/platforms/cuda.py, "
    "_get_backend_priorities), reads the paged cache directly "
    "(vllm/v1/attention/backends/flash_attn.py); FlashInfer takes a CSR page table")


sourced(
    "others-page-too", "documented: TensorRT-LLM pages its KV cache in blocks (its docs, "
    "'KV cache' / paged KV cache); SGLang keeps a radix tree over tokens, page size 1 by "
    "default (RadixAttention, Zheng et al. 2024); FlashInfer takes page tables (its docs, "
    "'KV-Cache Layout')", "holds", "paging the KV cache is now the common design")
