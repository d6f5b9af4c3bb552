"""The course's vocabulary, in English and Chinese, each term defined once.

What it teaches: the words vLLM and the paper use, so that a learner can read the code, the
paper and a Chinese interview question with the same concepts. Five words must never blur:
token position, logical block, physical block, slot, reference count.
``minipaged quiz --glossary`` prints this table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Term:
    en: str
    zh: str
    meaning: str


GLOSSARY: tuple[Term, ...] = (
    Term("PagedAttention", "分页注意力",
         "attention that reads K/V through block tables from non-contiguous blocks (vLLM)"),
    Term("KV cache", "KV 缓存",
         "the keys and values of past tokens, kept per layer so decode never recomputes them"),
    Term("prefill", "预填充", "the step that processes a prompt's tokens all at once"),
    Term("decode", "解码", "the steps that generate one token per sequence each"),
    Term("token position", "token 位置", "index p of a token in its sequence, 0 .. seq_len-1"),
    Term("block", "块", "block_size token slots of K/V: the unit of allocation"),
    Term("block size", "块大小", "tokens per block (BS); vLLM's default is 16"),
    Term("logical block", "逻辑块", "block i of a sequence: token positions i*BS .. i*BS+BS-1"),
    Term("physical block", "物理块", "block id in the K/V pool (minipaged's: [NB, Hkv, BS, D])"),
    Term("block table", "块表",
         "per sequence: logical block -> physical block, one int32 entry per logical block"),
    Term("slot", "槽位", "physical_block * BS + offset: where one token's K/V are stored"),
    Term("slot mapping", "槽位映射", "the slot of every new token, used by reshape_and_cache"),
    Term("reference count", "引用计数", "how many block-table entries point at a physical block"),
    Term("free block queue", "空闲块队列",
         "free blocks, least recently used first; cached ones keep their hash until evicted"),
    Term("copy-on-write", "写时复制",
         "a write to a shared block first copies it to a fresh block (paper section 4.4; "
         "vLLM v0's forks; in v1 none, except in vLLM 0.32 a prefix-cache hit that ends inside a "
         "block, which only hybrid models allow, vllm/v1/core/single_type_kv_cache_manager.py)"),
    Term("fork", "分叉", "a new sequence sharing all blocks of its parent (counts + 1)"),
    Term("parallel sampling", "并行采样", "n completions of one prompt, sharing its blocks"),
    Term("beam search", "束搜索", "keep the k best candidates each step; beams share prefixes"),
    Term("sequence group", "序列组",
         "one request's samples or beams, scheduled and preempted together (paper, vLLM v0)"),
    Term("prefix caching", "前缀缓存",
         "reuse full blocks of earlier requests found by a chained hash (vLLM v0 and v1)"),
    Term("block hash", "块哈希",
         "hash(parent block's hash, this block's token ids, extra keys such as a LoRA id)"),
    Term("eviction", "驱逐", "dropping a cached free block's hash when its memory is reused"),
    Term("continuous batching", "连续批处理",
         "iteration-level scheduling: requests join and leave the batch every step"),
    Term("preemption", "抢占", "taking a running group's blocks away when memory runs out"),
    Term("swap", "换出/换入", "preemption by copying blocks to a CPU block pool and back (the "
         "paper, vLLM v0; vLLM v1 only recomputes)"),
    Term("recompute", "重计算", "preemption by dropping blocks and re-running the prefill later"),
    Term("watermark", "水位线",
         "free blocks kept back at admission against instant preemption (vLLM v0: 1% of the "
         "GPU blocks, vllm/core/block_manager.py; 0.32: off by default, vllm/config/scheduler.py)"),
    Term("token states", "token 状态", "slots that hold K/V of existing tokens (paper Fig. 2)"),
    Term("reserved", "预留", "slots set aside for tokens a request will produce later"),
    Term("internal fragmentation", "内部碎片", "slots reserved that will never hold a token"),
    Term("external fragmentation", "外部碎片",
         "free slots that cannot serve a request because they are not contiguous"),
    Term("buddy allocator", "伙伴分配器",
         "power-of-two contiguous allocator (the paper assumes Orca places regions with one, "
         "section 6.1)"),
    Term("GQA (grouped-query attention)", "分组查询注意力",
         "H query heads share Hkv < H KV heads: the KV cache shrinks by H / Hkv"),
    Term("online softmax", "在线 softmax",
         "softmax over tiles with a running max and sum (FlashAttention; vLLM's v2 reduce merges "
         "its partitions this way, while its paged kernel keeps the logits in shared memory)"),
    Term("thread block", "线程块",
         "CUDA's unit of work on one SM; vLLM's paged kernel and minipaged's v1 run one per "
         "(query head, sequence), minipaged's v3 one per (KV head, sequence) for up to 8 of "
         "its query heads; the v2 and v4 kernels one per partition of those"),
    Term("warp", "线程束",
         "32 threads issued together (in lockstep until their branches diverge); in vLLM's "
         "legacy paged kernel (v1 and v2) the warps take KV blocks in turn"),
    Term("shared memory", "共享内存", "fast per-thread-block memory; holds the logits"),
    Term("partition (v2 kernel)", "分区",
         "512-token slice of a long context, reduced afterwards (paged_attention_v2)"),
    Term("page table (OS)", "页表", "the operating-system idea block tables borrow"),
    Term("CSR page table", "CSR 页表", "FlashInfer's kv_indptr / kv_indices / kv_last_page_len"),
    Term("two-level block table", "两级块表",
         "a directory of leaves of block-table entries: memory only for used leaves"),
    Term("throughput", "吞吐量", "generated tokens (or requests) per second"),
    Term("normalized latency", "归一化延迟", "end-to-end latency / output length (s/token)"),
)


def lookup(word: str) -> Term:
    """The term whose English or Chinese name is ``word`` (case-insensitive), or KeyError."""
    w = word.strip().lower()
    for t in GLOSSARY:
        if w in (t.en.lower(), t.zh.lower()):
            return t
    raise KeyError(f"{word!r} is not in the glossary")


def glossary_table():
    """A rich Table of every term: English, Chinese, meaning."""
    from rich.table import Table

    table = Table(title="glossary / 术语表", show_lines=False)
    table.add_column("English")
    table.add_column("中文")
    table.add_column("meaning", overflow="fold")
    for t in GLOSSARY:
        table.add_row(t.en, t.zh, t.meaning)
    return table
