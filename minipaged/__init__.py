"""minipaged: vLLM's PagedAttention from scratch, one lesson per file.

The map (the one reading order: each module's docstring ends its lesson with "Read next"; the
lessons in ``lessons/`` follow the same stages):

    attention.py                 stage 1  dense attention: the oracle everything is checked against
    contiguous/usage.py          stage 2  the five categories of KV cache memory (after Fig. 2)
    contiguous/buddy.py                   a buddy allocator: how contiguous regions are placed
    contiguous/cache.py                   a contiguous KV cache with Orca-style reservations
    paged/block_allocator.py     stage 3  physical blocks, a free list, reference counts
    paged/block_manager.py                block tables and slot mapping (allocate / append / free)
    paged/cache_ops.py                    reshape_and_cache, copy_blocks: writing K/V into pages
    paged/paged_attention.py              attention through block tables, equal to dense
    sharing/cow.py               stage 4  fork and copy-on-write
    sharing/sequence.py                   sequences and sequence groups
    sharing/sampling.py                   parallel sampling and beam search over shared blocks
    sharing/prefix_cache.py               prefix caching: a hash chain and an LRU free queue
    serving/swap.py              stage 5  preemption: swap to a CPU pool, or recompute
    serving/memory_policy.py              the scheduler's view of memory: blocks or regions
    serving/queues.py                     requests in, sequences out: the scheduler's queues
    serving/scheduler.py                  continuous batching: FCFS, preemption, chunked prefill

After the core: ``sim/`` (workloads, a cost model, the simulator and the paper's experiments),
``cuda/`` (stage 6: the CUDA kernels, run by CuPy on a GPU or by the CPU emulation harness in
``cuda/emu/``), ``model/`` (stage 7: a tiny torch model generating through the paged cache).
Beside it all, ``kit/``: the command line, the classroom demo, the grader, the quiz, the slides
presenter and the benchmarks. ``_checks.py`` holds the argument checks every stage shares.

A later stage imports an earlier one, never the reverse (tests/test_layout.py checks it).
``KVCacheManager`` is the complete manager the lessons build one subclass at a time.

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

__version__ = "0.2.0"

#: The core in reading order (paths under minipaged/): the single source of the map above.
READING_ORDER = (
    "attention.py",
    "contiguous/usage.py", "contiguous/buddy.py", "contiguous/cache.py",
    "paged/block_allocator.py", "paged/block_manager.py", "paged/cache_ops.py",
    "paged/paged_attention.py",
    "sharing/cow.py", "sharing/sequence.py", "sharing/sampling.py", "sharing/prefix_cache.py",
    "serving/swap.py", "serving/memory_policy.py", "serving/queues.py", "serving/scheduler.py",
)
#: Where the last core module's "Read next" points.
READ_AFTER_CORE = "sim/simulator.py"

__all__ = ["BlockAllocator", "KVCacheManager", "OutOfBlocksError", "copy_blocks",
           "reshape_and_cache", "swap_blocks", "BuddyAllocator", "ContiguousKVCache", "KVUsage",
           "dense_attention",
           "paged_attention", "paged_prefill_attention", "__version__"]
