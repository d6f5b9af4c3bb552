"""The interview answer, as data: its question, follow-ups, pitfalls and checkable claims.

"The interview answer" is a model answer, written in Chinese and circulated among candidates,
to the interview question "explain vLLM's PagedAttention" (numbered Q32 in its collection); the
course checks each of its claims against the paper and the package's own measurements
(``minipaged factcheck``, lesson 10) and drills its questions (``minipaged quiz``). Its claims
are restated below in this project's words, one per checkable statement; the answer's text is
not part of the project.
"""

from __future__ import annotations

# The questions, as an interviewer asks them (Chinese, then English).
QUESTION = ("Q32：vLLM PagedAttention 原理",
            "Explain vLLM's PagedAttention: what problem it solves and how.")
FOLLOW_UPS = (
    ("追问 1：PagedAttention的Block Table在长序列（如128K token）下会占用多少显存？怎么优化？",
     "How much memory does the block table take for long sequences (128K tokens)? How would "
     "you reduce it?"),
    ("追问 2：如果块大小改成32 token，对性能有什么影响？",
     "What changes if the block size becomes 32 tokens?"),
    ("追问 3：PagedAttention和FlashAttention能一起用吗？有什么冲突？",
     "Can PagedAttention and FlashAttention be used together? Any conflicts?"),
)
# Answers the interview answer warns against.
PITFALLS = (
    ("避坑：只说“PagedAttention就是分页存储KV Cache，减少显存浪费”够吗？",
     "Is \"it stores the KV cache in pages to save memory\" enough? What must you add?"),
    ("避坑：“块大小越大越好，因为减少表开销”对吗？",
     "\"Bigger blocks are better because the table shrinks\": right?"),
    ("避坑：“PagedAttention只适用于vLLM”对吗？",
     "\"PagedAttention only applies to vLLM\": right?"),
)

# claim id -> (the claim in Chinese, the claim in English), in the answer's order.
CLAIMS: dict[str, tuple[str, str]] = {
    "max-reservation-internal": (
        "按最大长度（如2048）为每个请求预留KV Cache会造成内部碎片",
        "reserving the maximum length (e.g. 2048) for every request causes internal "
        "fragmentation"),
    "contiguous-external": (
        "连续存储造成外部碎片：总显存够，却找不到足够大的连续空间",
        "contiguous storage causes external fragmentation: enough memory in total, no region "
        "large enough"),
    "utilization-before": (
        "预分配时只有30%-60%的KV显存被用上（称出自vLLM论文）",
        "with pre-allocation only 30%-60% of KV memory is used (the vLLM paper's data, it "
        "says)"),
    "default-block-16": ("块默认容纳16个token", "blocks hold 16 tokens by default"),
    "no-external-fragmentation": (
        "新token最多需要一个新块，已有数据不移动，因此没有外部碎片",
        "a new token needs at most one new block and no data moves: no external "
        "fragmentation"),
    "copy-on-write": ("共享块只在有序列写入时才被复制",
                      "a shared block is copied only when a sequence writes into it"),
    "refcount-cap": ("vLLM把共享块的引用计数上限设为16（默认）",
                     "vLLM caps a shared block's reference count at 16 (by default)"),
    "sweet-spot-16": ("16是块大小的经验最优值", "16 tokens per block is the empirical optimum"),
    "no-page-replacement": (
        "KV Cache按顺序访问，不需要LRU之类的替换策略，按需分配即可",
        "KV cache access is sequential, so no page replacement (like LRU) is needed: "
        "allocate on demand"),
    "utilization-after": ("分页后显存利用率升到90%以上", "paging raises utilization to 90%+"),
    "throughput-2-4x": ("吞吐量提升2到4倍", "throughput improves 2-4x"),
    "batch-8-to-32": ("在A100上批大小从8升到32", "on an A100 the batch size went from 8 to 32"),
    "block-table-32k": ("32K token时块表约占0.5GB/1000个请求",
                        "at 32K tokens, block tables take about 0.5 GB per 1000 requests"),
    "int32-compression": ("vLLM用int32表项压缩块表来缓解",
                          "vLLM mitigates block-table size by compressing entries to int32"),
    "block-table-128k": (
        "128K token需要8192个块，每项约8字节：每请求64KB，1000个请求64MB",
        "128K tokens need 8192 blocks; 8 B per entry gives 64 KB per request, 64 MB per "
        "1000"),
    "block-size-tradeoff": ("块大小翻倍，块表减半，内部碎片增加",
                            "doubling the block size halves the block table and increases "
                            "internal fragmentation"),
    "block-32-example": (
        "生成33个token：块大小32浪费31个槽位，碎片率从48%升到94%",
        "33 tokens: block size 32 wastes 31 slots and fragmentation rises from 48% to 94%"),
    "flashattention-compatible": ("PagedAttention能和FlashAttention一起用，vLLM已集成",
                                  "PagedAttention and FlashAttention work together; vLLM "
                                  "integrates FlashAttention"),
    "others-page-too": ("其他推理框架也借鉴了分块KV Cache（如TensorRT-LLM）",
                        "other engines page their KV cache too (e.g. TensorRT-LLM)"),
}
