"""minipaged: vLLM's PagedAttention from scratch, one lesson per file.

The course map (read the modules in this order; each one's docstring says what comes next):

    attention.py        dense attention, the oracle everything else is checked against
    usage.py            the four categories of KV cache memory (the paper's Fig. 2)
    buddy.py            a buddy allocator: how contiguous regions are placed
    contiguous.py       a contiguous KV cache with Orca-style reservations, and its waste
    block_allocator.py  physical blocks, a free list and reference counts
    kv_cache.py         block tables, slot mapping, KVCacheManager (allocate / append / free)
    cache_ops.py        reshape_and_cache and copy_blocks: writing K/V into the pages
    paged_attention.py  attention that reads K/V through block tables, equal to dense bit for bit
    sharing.py          sequence groups: parallel sampling and beam search over fork / free
    prefix_cache.py     prefix caching: hash chains of full blocks and an LRU free queue
    swap.py             the CPU block pool: swapping a sequence group out and back in
    memory_policy.py    the scheduler's view of memory: paged blocks or Orca-style regions
    sequence.py         sequences and sequence groups: the units the scheduler moves
    scheduler.py        continuous batching: FCFS admission, preemption by swap or recompute
    sim/                workloads, memory presets, a cost model, the simulator, the experiments
    factcheck.py        the seed interview answer's claims, each one measured
    viz/, demo.py       the classroom demo, drawn from the managers' real state
    cuda/               the CUDA kernels, run by CuPy on a GPU or by a CPU emulation harness
    model/              a tiny trained torch model generating through the paged cache (LLM)
    grader/, quiz.py, present.py   the teaching kit: exercise grader, drills, terminal slides

Symbols used in shape comments everywhere: S sequences, H query heads, Hkv KV heads, D head size,
NB physical blocks, BS block size, MB max blocks per sequence, T tokens.
"""

from __future__ import annotations

from minipaged.attention import dense_attention
from minipaged.contiguous.buddy import BuddyAllocator
from minipaged.contiguous.cache import ContiguousKVCache
from minipaged.contiguous.usage import KVUsage
from minipaged.paged.block_allocator import BlockAllocator, OutOfBlocksError
from minipaged.paged.cache_ops import copy_blocks, reshape_and_cache, swap_blocks
from minipaged.paged.paged_attention import paged_attention, paged_prefill_attention
from minipaged.serving.swap import KVCacheManager

__version__ = "0.1.0"

__all__ = ["BlockAllocator", "KVCacheManager", "OutOfBlocksError", "copy_blocks",
           "reshape_and_cache", "swap_blocks", "BuddyAllocator", "ContiguousKVCache", "KVUsage",
           "dense_attention",
           "paged_attention", "paged_prefill_attention", "__version__"]
