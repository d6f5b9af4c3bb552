"""Fork and copy-on-write: sequences of one request sharing physical blocks.

What this teaches: the sharing of vLLM's paper, section 4.4. A block table is only a list of
block ids, so two sequences can point at the same physical block. ``fork`` gives a child every
block of its parent and raises each block's reference count; nothing is copied. A full block is
never written again, so sharing it is free forever. The partly filled *last* block is the one
place a sequence still writes: when ``append_slot`` finds it shared, the writer first gets its
own block and a pending *copy* (src, dst) of the shared one (copy-on-write); the caller applies
a step's copies with ``cache_ops.copy_blocks`` after ``take_copies()``, before it writes the
step's new K/V. The last table to write into a shared block finds itself its only user and
writes in place: k writers of a block held by k tables make k - 1 copies.

The one subtle case is a copy whose source nobody holds any more: the child copies block 7 and
then the parent is freed in the same step. Block 7 must not go back to the free list before the
copy has read it, or the next ``allocate`` could hand it out and a write could land first. So a
pending copy is a *user* of its source: recording it raises the source's reference count, and
``take_copies`` (the copies are handed over) drops it again. If instead the copy's destination
is freed before the copies are taken, nobody will read it: the copy is dropped, and with it the
hold on its source.

Invariants (``check_invariants`` asserts them; tests/test_sharing_stateful.py after every step):
    1. a block's reference count = the table entries pointing at it + the pending copies that
       read it; so a block in no table stays allocated until its copies are taken;
    2. a pending copy's destination is in use (in some table) and is the source of no copy;
    3. a sequence writes only into a block that no other table holds (copy-on-write first);
    4. OutOfBlocksError, or any other error, leaves every table and count as it was.

Read before: ``paged/block_manager.py``. Read next: ``sharing/sequence.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from minipaged.paged.block_manager import BlockManager, SeqId


class CowBlockManager(BlockManager):
    """``BlockManager`` plus ``fork`` and copy-on-write of the shared partial last block."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._copies: dict[int, int] = {}  # pending copy-on-write copies: dst -> src
        self._reads: Counter[int] = Counter()  # src -> pending copies reading it

    # ---- sharing ---------------------------------------------------------------------------
    def fork(self, parent_seq_id: SeqId, child_seq_id: SeqId) -> None:
        """The child shares every block of the parent; nothing is copied (vLLM section 4.4)."""
        table = self._table(parent_seq_id)
        child = self._check_new("child_seq_id", child_seq_id)
        self.allocator.incref_many(table)
        self._tables[child] = list(table)
        self._tokens[child] = list(self._tokens[parent_seq_id])

    def _before_write(self, table: list[int]) -> None:
        """Called by ``append_slot`` before a token goes into the partly filled last block: if
        another table holds that block too, this sequence first gets its own copy."""
        if self._table_users(table[-1]) > 1:
            self._copy_on_write(table)

    def _copy_on_write(self, table: list[int]) -> None:
        shared = table[-1]
        new = self.allocator.allocate()  # raises before anything changed
        # If the shared block is itself a copy still pending, copy from *its* source: nothing
        # is written before the copies are applied, so both hold the same K/V.
        src = self._copies.get(shared, shared)
        self.allocator.incref(src)  # the pending copy reads src (invariant 1)
        self._copies[new] = src
        self._reads[src] += 1
        self.allocator.free(shared)  # this table leaves the shared block
        table[-1] = new

    def _table_users(self, block: int) -> int:
        """Table entries pointing at ``block``: its reference count minus pending reads."""
        return self.allocator.ref_count(block) - self._reads[block]

    @property
    def pending_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) copies recorded and not yet taken (a read-only view)."""
        return [(src, dst) for dst, src in self._copies.items()]

    def take_copies(self) -> list[tuple[int, int]]:
        """The pending copy-on-write (src, dst) pairs, cleared. Call it once a step's blocks are
        allocated; apply the pairs with ``cache_ops.copy_blocks`` before writing the step's new
        K/V, and before the next allocation (a source may now be free)."""
        pairs = self.pending_copies
        self._copies.clear()
        self._reads.clear()
        for src, _ in pairs:
            self.allocator.free(src)  # handed over: the copy no longer holds its source
        return pairs

    def _release(self, table: list[int]) -> None:
        super()._release(table)
        for dst in [d for d in self._copies if self.allocator.ref_count(d) == 0]:
            src = self._copies.pop(dst)  # nobody will read this copy: drop it
            self._reads[src] -= 1
            if self._reads[src] == 0:
                del self._reads[src]
            self.allocator.free(src)

    # ---- room for a decode step ------------------------------------------------------------
    def blocks_needed_to_append(self, seq_ids: Iterable[SeqId]) -> int:
        """New blocks one ``append_slot`` on each of ``seq_ids`` would take: one per sequence
        whose last block is full, plus one per copy-on-write (k writers of a partial block held
        by u tables copy k times if k < u, else k - 1: the last one writes in place)."""
        need, writers = 0, {}
        for s in seq_ids:
            table = self._table(s)
            if len(self._tokens[s]) % self.block_size == 0:
                need += 1
            else:
                writers[table[-1]] = writers.get(table[-1], 0) + 1
        for block, k in writers.items():
            need += k if k < self._table_users(block) else k - 1
        return need

    def can_append_slots(self, seq_ids: Iterable[SeqId]) -> bool:
        return self.blocks_needed_to_append(seq_ids) <= self.num_free_blocks

    # ---- accounting ------------------------------------------------------------------------
    def _held_outside_tables(self) -> int:
        return sum(1 for src in self._reads if self._table_users(src) == 0)

    def _expected_ref_counts(self) -> list[int]:
        refs = super()._expected_ref_counts()
        for src in self._copies.values():
            refs[src] += 1
        return refs

    def check_invariants(self) -> None:
        """Assert invariants 1-2 of the module docstring (and the base's)."""
        super().check_invariants()
        sources = set(self._copies.values())
        assert self._reads == Counter(self._copies.values()), "pending reads per source"
        for dst in self._copies:
            assert self._table_users(dst) >= 1, f"copy destination {dst} is in no table"
            assert dst not in sources, f"block {dst} is both a copy source and destination"
