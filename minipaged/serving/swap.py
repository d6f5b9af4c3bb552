"""Preemption: swap a sequence group's blocks to a CPU block pool, or drop them to recompute.

What this teaches (lesson 06; vLLM paper, section 4.5): out of GPU blocks mid-generation, vLLM
preempts whole groups and recovers them by **swap** (copy the blocks to a CPU pool and free them;
later copy them back into fresh GPU blocks: PCIe copies, many small ones when blocks are small,
Fig. 19) or **recompute** (free them, keep the tokens, re-run them as one prefill: the only way
vLLM v1 preempts, ``vllm/v1/core/sched/scheduler.py``). ``KVCacheManager`` keeps the block ids,
a plain ``BlockAllocator`` the CPU ones, ``CPUBlockPool`` the host arrays. Swap-outs are copied
before swap-ins, which may reuse the blocks they read.

Invariants (tests/invariants.py): a sequence is on the GPU or swapped, never both; CPU reference
counts equal the CPU table entries; a swap moves a group all or nothing. With prefix caching a
swapped sequence keeps its hashes, and its full blocks are cached again when it comes back.

Read before: ``sharing/prefix_cache.py``. Read next: ``serving/memory_policy.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable

import numpy as np

from minipaged._checks import SIZE_LIMIT, check_dtype, check_id_list, check_int, check_seq_id
from minipaged.paged.block_allocator import BlockAllocator
from minipaged.paged.cache_ops import swap_blocks
from minipaged.sharing.prefix_cache import HashFn, PrefixCachingBlockManager

__all__ = ["CPUBlockPool", "KVCacheManager"]


class KVCacheManager(PrefixCachingBlockManager):
    """The complete block manager: paging, fork and copy-on-write, prefix caching (switchable),
    and preemption by swapping to ``num_cpu_blocks`` CPU blocks or by recomputation."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False,
                 num_cpu_blocks: int = 0, hash_fn: HashFn | None = None) -> None:
        n = check_int("num_cpu_blocks", num_cpu_blocks, low=0, high=SIZE_LIMIT)
        super().__init__(num_blocks, block_size, enable_prefix_caching=enable_prefix_caching,
                         hash_fn=hash_fn)
        self.cpu_allocator = BlockAllocator(n) if n else None
        self._swapped: dict[Hashable, list[int]] = {}  # seq -> CPU block per logical block

    @property
    def num_free_cpu_blocks(self) -> int:
        return 0 if self.cpu_allocator is None else self.cpu_allocator.num_free_blocks

    @property
    def swapped_seq_ids(self) -> list[Hashable]:
        return list(self._swapped)

    def is_swapped(self, seq_id: Hashable) -> bool:
        return check_seq_id("seq_id", seq_id) in self._swapped

    def cpu_block_table(self, seq_id: Hashable) -> list[int]:
        if not self.is_swapped(seq_id):
            raise KeyError(f"seq_id={seq_id!r} is not swapped out")
        return list(self._swapped[seq_id])

    def _no_table_error(self, seq_id: Hashable) -> Exception:
        if seq_id in self._swapped:
            return ValueError(f"seq_id={seq_id!r} is swapped out; swap_in it first")
        return super()._no_table_error(seq_id)

    def _group(self, seq_ids: Iterable[Hashable], where: str) -> list[Hashable]:
        ids = [check_seq_id(f"seq_ids[{i}]", s)
               for i, s in enumerate(check_id_list(f"{where}: seq_ids", seq_ids))]
        if not ids:
            raise ValueError(f"{where}: seq_ids is empty")
        if len(set(ids)) != len(ids):
            raise ValueError(f"{where}: seq_ids={ids!r} has duplicates")
        return ids

    def can_swap_out(self, seq_ids: Iterable[Hashable]) -> bool:
        blocks = {b for s in self._group(seq_ids, "can_swap_out") for b in self._table(s)}
        return len(blocks) <= self.num_free_cpu_blocks

    def can_swap_in(self, seq_ids: Iterable[Hashable]) -> bool:
        blocks = {c for s in self._group(seq_ids, "can_swap_in") for c in self.cpu_block_table(s)}
        return len(blocks) <= self.num_free_blocks

    def swap_out(self, seq_ids: Iterable[Hashable]) -> list[tuple[int, int]]:
        """Move a group's blocks to the CPU pool, all or nothing. Returns the (gpu_block,
        cpu_block) pairs to copy (``CPUBlockPool.copy_out``)."""
        ids = self._group(seq_ids, "swap_out")
        tables = [self._table(s) for s in ids]
        if self.cpu_allocator is None:
            raise ValueError("swap_out needs a CPU block pool: KVCacheManager(num_cpu_blocks=0)")
        for s, table in zip(ids, tables):
            if set(table) & set(self._copies):
                raise ValueError(f"seq_id={s!r} has a copy-on-write copy not yet applied; "
                                 "call take_copies() and copy_blocks first")
        mapping, cpu_tables = _copy_tables(tables, self.cpu_allocator,
                                           f"in the CPU pool to swap out seq_ids={ids!r}")
        for s, table, cpu_table in zip(ids, tables, cpu_tables):
            self._swapped[s] = cpu_table
            del self._tables[s]
            self._release(table)
        return mapping

    def swap_in(self, seq_ids: Iterable[Hashable]) -> list[tuple[int, int]]:
        """Bring a swapped group back onto fresh GPU blocks, all or nothing. Returns the
        (cpu_block, gpu_block) pairs to copy (``CPUBlockPool.copy_in``)."""
        ids = self._group(seq_ids, "swap_in")
        cpu_tables = [self.cpu_block_table(s) for s in ids]
        mapping, tables = _copy_tables(cpu_tables, self.allocator, f"to swap in seq_ids={ids!r}")
        for s, table, cpu_table in zip(ids, tables, cpu_tables):
            self._tables[s] = table
            del self._swapped[s]
            self.cpu_allocator.free_many(cpu_table)
            self.cache_blocks(s, 0)  # prefix caching: findable by their hashes again
        return mapping

    def preempt_by_recompute(self, seq_ids: Iterable[Hashable]) -> dict[Hashable, list[int]]:
        """Free a group's blocks and forget it; returns each sequence's token ids to re-prefill
        later with ``allocate`` (with prefix caching, perhaps nearly all hits)."""
        ids = self._group(seq_ids, "preempt_by_recompute")
        for s in ids:
            self._table(s)  # every one on the GPU, or nothing changes
        out = {s: self.token_ids(s) for s in ids}
        for s in ids:
            self.free(s)
        return out

    def free(self, seq_id: Hashable) -> None:
        if self.is_swapped(seq_id):
            self.cpu_allocator.free_many(self._swapped.pop(seq_id))
            self._tables[seq_id] = []  # no GPU blocks left: the common path forgets the rest
        super().free(seq_id)


def _copy_tables(tables: list[list[int]], allocator: BlockAllocator,
                 what: str) -> tuple[list[tuple[int, int]], list[list[int]]]:
    """One new block from ``allocator`` per distinct block of the tables (a block shared inside
    the group moves once), all or nothing: the (old, new) pairs and the tables rewritten."""
    old = list(dict.fromkeys(b for table in tables for b in table))  # distinct, in order
    mapping = dict(zip(old, allocator.allocate_many(len(old), what)))
    new = [[mapping[b] for b in table] for table in tables]
    # A new block has count 1, for its first entry; every further entry is one more user.
    entries = Counter(b for table in new for b in table)
    allocator.incref_many(b for b, k in entries.items() for _ in range(k - 1))
    return list(mapping.items()), new


class CPUBlockPool:
    """Host memory for swapped-out blocks: key/value [NCPU, Hkv, BS, D], the GPU cache's layout,
    so one block is one contiguous copy each way."""

    def __init__(self, num_blocks: int, num_kv_heads: int, block_size: int, head_size: int,
                 dtype: np.dtype | type = np.float32) -> None:
        shape = (check_int("num_blocks", num_blocks, low=1, high=SIZE_LIMIT),
                 check_int("num_kv_heads", num_kv_heads, low=1),
                 check_int("block_size", block_size, low=1),
                 check_int("head_size", head_size, low=1))
        dtype = check_dtype("dtype", dtype)
        self.key_cache = np.zeros(shape, dtype=dtype)    # [NCPU, Hkv, BS, D]
        self.value_cache = np.zeros(shape, dtype=dtype)  # [NCPU, Hkv, BS, D]

    def copy_out(self, key_cache: np.ndarray, value_cache: np.ndarray,
                 mapping: list[tuple[int, int]]) -> None:
        """GPU -> CPU for the (gpu_block, cpu_block) pairs ``swap_out`` returned."""
        swap_blocks(key_cache, value_cache, self.key_cache, self.value_cache, mapping)

    def copy_in(self, key_cache: np.ndarray, value_cache: np.ndarray,
                mapping: list[tuple[int, int]]) -> None:
        """CPU -> GPU for the (cpu_block, gpu_block) pairs ``swap_in`` returned."""
        swap_blocks(self.key_cache, self.value_cache, key_cache, value_cache, mapping)
