"""Preemption: swap a sequence group's blocks to a CPU block pool, or drop them to recompute.

What this teaches: what vLLM does when the GPU runs out of blocks mid-generation (paper section
4.5). It preempts whole *sequence groups* (all samples or beams of one request: they share
blocks, so evicting only some would free little and strand the rest) and recovers them later in
one of two ways:

    swap        copy the group's blocks to a pool of CPU blocks, free the GPU blocks; later
                allocate GPU blocks again and copy back. Costs PCIe bandwidth, many small copies
                when blocks are small (the paper's Fig. 19).
    recompute   free the GPU blocks and remember the tokens; later re-run them as one prefill.
                Costs compute, independent of the block size. Recent vLLM defaults to this.

``SwapMixin`` gives ``KVCacheManager`` the block-id side (``swap_out``, ``swap_in``,
``preempt_by_recompute``); ``CPUBlockPool`` holds the real host arrays, in the same
[NB, Hkv, BS, D] layout, and moves the data with ``cache_ops.swap_blocks``. The scheduler
(issue 4) decides *when*; apply a step's data movement in this order: swap-outs, swap-ins,
copy-on-write copies (``take_copies``), then the step's new K/V. Swap-outs must read their blocks
before a swap-in in the same step may reuse them.

Read before: ``kv_cache.py``. Read next: ``sharing.py``.

Invariants: a sequence is either on the GPU (a block table of GPU blocks) or swapped out (a table
of CPU blocks), never both; CPU reference counts equal the CPU table entries pointing at them;
a swap moves a group all or nothing (OutOfBlocksError leaves every table as it was).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable

import numpy as np

from minipaged.paged.block_allocator import BlockAllocator, OutOfBlocksError, check_int
from minipaged.paged.cache_ops import swap_blocks


class SwapMixin:
    """Swap and recompute for ``KVCacheManager`` (which defines ``_tables``, ``_tokens``,
    ``_alloc``, ``_copies``, ``_release_table``)."""

    def __init__(self, num_cpu_blocks: int = 0) -> None:
        n = check_int("num_cpu_blocks", num_cpu_blocks, low=0)
        self._cpu: BlockAllocator | None = BlockAllocator(n) if n else None
        self._swapped: dict[Hashable, list[int]] = {}   # seq -> CPU block per logical block

    @property
    def num_free_cpu_blocks(self) -> int:
        return 0 if self._cpu is None else self._cpu.num_free_blocks

    @property
    def swapped_seq_ids(self) -> list[Hashable]:
        return list(self._swapped)

    def is_swapped(self, seq_id: Hashable) -> bool:
        return seq_id in self._swapped

    def cpu_block_table(self, seq_id: Hashable) -> list[int]:
        if seq_id not in self._swapped:
            raise KeyError(f"seq_id={seq_id!r} is not swapped out")
        return list(self._swapped[seq_id])

    def _distinct(self, seq_ids: Iterable[Hashable], where: str) -> list[Hashable]:
        ids = list(seq_ids)
        if not ids:
            raise ValueError(f"{where}: seq_ids is empty")
        if len(set(ids)) != len(ids):
            raise ValueError(f"{where}: seq_ids={ids!r} has duplicates")
        return ids

    def can_swap_out(self, seq_ids: Iterable[Hashable]) -> bool:
        blocks = {b for s in seq_ids for b in self._seq(s)}  # type: ignore[attr-defined]
        return len(blocks) <= self.num_free_cpu_blocks

    def can_swap_in(self, seq_ids: Iterable[Hashable]) -> bool:
        blocks = {b for s in seq_ids for b in self.cpu_block_table(s)}
        return len(blocks) <= self._alloc.num_free_blocks  # type: ignore[attr-defined]

    def swap_out(self, seq_ids: Iterable[Hashable]) -> list[tuple[int, int]]:
        """Move a group's blocks to the CPU pool. Returns the (gpu_block, cpu_block) pairs the
        caller copies (``CPUBlockPool.copy_out``); a block shared inside the group moves once."""
        ids = self._distinct(seq_ids, "swap_out")
        tables = [self._seq(s) for s in ids]  # type: ignore[attr-defined]
        if self._cpu is None:
            raise ValueError("swap_out needs a CPU block pool: KVCacheManager(num_cpu_blocks=0)")
        pending = set(self._copies)  # type: ignore[attr-defined]
        mapping: dict[int, int] = {}
        for s, table in zip(ids, tables):
            if pending.intersection(table):
                raise ValueError(f"seq_id={s!r} has a copy-on-write copy not yet applied; "
                                 "call take_copies() and copy_blocks first")
            for b in table:
                mapping.setdefault(b, -1)
        if len(mapping) > self._cpu.num_free_blocks:
            raise OutOfBlocksError(len(mapping), self._cpu.num_free_blocks,
                                   f"in the CPU pool to swap out seq_ids={ids!r}")
        for b in mapping:
            mapping[b] = self._cpu.allocate()
        cpu_tables = [[mapping[b] for b in table] for table in tables]
        self._incref_shared(self._cpu, cpu_tables)
        for s, cpu_table in zip(ids, cpu_tables):
            self._swapped[s] = cpu_table
            self._release_table(self._tables.pop(s))  # type: ignore[attr-defined]
        return list(mapping.items())

    def swap_in(self, seq_ids: Iterable[Hashable]) -> list[tuple[int, int]]:
        """Bring a swapped group back onto fresh GPU blocks. Returns the (cpu_block, gpu_block)
        pairs to copy (``CPUBlockPool.copy_in``). OutOfBlocksError, state unchanged, when the
        GPU lacks room for the whole group."""
        ids = self._distinct(seq_ids, "swap_in")
        cpu_tables = [self.cpu_block_table(s) for s in ids]
        mapping: dict[int, int] = {}
        for table in cpu_tables:
            for c in table:
                mapping.setdefault(c, -1)
        alloc = self._alloc  # type: ignore[attr-defined]
        if len(mapping) > alloc.num_free_blocks:
            raise OutOfBlocksError(len(mapping), alloc.num_free_blocks,
                                   f"to swap in seq_ids={ids!r}")
        for c in mapping:
            mapping[c] = alloc.allocate()
        tables = [[mapping[c] for c in cpu_table] for cpu_table in cpu_tables]
        self._incref_shared(alloc, tables)
        for s, table in zip(ids, tables):
            self._tables[s] = table  # type: ignore[attr-defined]
            for c in self._swapped.pop(s):
                self._cpu.free(c)  # type: ignore[union-attr]
            self._reregister(s, table)
        return list(mapping.items())

    @staticmethod
    def _incref_shared(alloc: BlockAllocator, tables: list[list[int]]) -> None:
        """Each block came from ``allocate`` with count 1, for its first table entry; every
        further entry pointing at it, in any table of the group, is one more user."""
        seen: set[int] = set()
        for table in tables:
            for b in table:
                if b in seen:
                    alloc.incref(b)
                seen.add(b)

    def _reregister(self, seq_id: Hashable, table: list[int]) -> None:
        """With prefix caching, a swapped-in full block becomes findable again by its hash."""
        from minipaged.sharing.prefix_cache import PrefixCachingBlockAllocator

        alloc = self._alloc  # type: ignore[attr-defined]
        if isinstance(alloc, PrefixCachingBlockAllocator):
            hashes = self._hashes[seq_id]  # type: ignore[attr-defined]
            tokens = self._tokens[seq_id]  # type: ignore[attr-defined]
            bs = self.block_size  # type: ignore[attr-defined]
            chunks = [tuple(tokens[i * bs:(i + 1) * bs]) for i in range(len(hashes))]
            self._serials[seq_id] = alloc.register_run(  # type: ignore[attr-defined]
                table, hashes, chunks, start=0)

    def preempt_by_recompute(self, seq_ids: Iterable[Hashable]) -> dict[Hashable, list[int]]:
        """Free a group's blocks and forget the sequences; returns each one's token ids (prompt
        plus generated) to re-prefill later with ``allocate``. With prefix caching most of them
        may still be cached then, so the recompute can be nearly free."""
        ids = self._distinct(seq_ids, "preempt_by_recompute")
        for s in ids:
            self._seq(s)  # type: ignore[attr-defined]
        out = {s: self.token_ids(s) for s in ids}  # type: ignore[attr-defined]
        for s in ids:
            self.free(s)  # type: ignore[attr-defined]
        return out

    def _free_swapped(self, seq_id: Hashable) -> None:
        for c in self._swapped.pop(seq_id):
            self._cpu.free(c)  # type: ignore[union-attr]

    def _check_swap_invariants(self) -> None:
        assert not set(self._swapped) & set(self._tables), "a sequence both swapped and on GPU"  # type: ignore[attr-defined]
        if self._cpu is None:
            assert not self._swapped
            return
        self._cpu.check_invariants()
        refs = [0] * self._cpu.num_blocks
        for table in self._swapped.values():
            for c in table:
                refs[c] += 1
        assert refs == self._cpu._ref, "CPU reference counts != CPU table entries"


class CPUBlockPool:
    """Host memory for swapped-out blocks: key/value [NCPU, Hkv, BS, D], the GPU cache's layout,
    so one block is one contiguous copy each way."""

    def __init__(self, num_blocks: int, num_kv_heads: int, block_size: int, head_size: int,
                 dtype: np.dtype | type = np.float32) -> None:
        shape = (check_int("num_blocks", num_blocks, low=1),
                 check_int("num_kv_heads", num_kv_heads, low=1),
                 check_int("block_size", block_size, low=1),
                 check_int("head_size", head_size, low=1))
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
