"""Fork and copy-on-write: sequences of one request sharing physical blocks.

What this teaches (lesson 04; vLLM paper, section 4.4): ``fork`` gives a child every block of its
parent, raising their reference counts: nothing is copied. Full blocks are never written again;
when ``append_slot`` writes into a shared partly filled last block, the writer first gets its own
block and a pending copy (src, dst) to apply (``take_copies()``, then ``cache_ops.copy_blocks``);
the last writer writes in place, so k writers of a block k tables hold make k - 1 copies. A copy
whose destination is freed is dropped.

Invariants (tests/invariants.py, after every step of tests/test_sharing_stateful.py):
    1. a block's reference count = the table entries pointing at it + the pending copies that
       read it: a source freed in the same step stays allocated (not handed out, overwritten)
       until its copies are taken;
    2. a pending copy's destination is in use (in some table) and is the source of no copy;
    3. a sequence writes only into a block that no other table holds (copy-on-write first);
    4. OutOfBlocksError, or any other error, leaves every table and count as it was.

Read before: ``paged/block_manager.py``. Read next: ``sharing/sequence.py``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from minipaged._checks import check_id_list
from minipaged.paged.block_manager import BlockManager, SeqId


class CowBlockManager(BlockManager):
    """``BlockManager`` plus ``fork`` and copy-on-write of the shared partial last block."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self._copies: dict[int, int] = {}  # pending copy-on-write copies: dst -> src
        self._reads: Counter[int] = Counter()  # src -> pending copies reading it

    def fork(self, parent_seq_id: SeqId, child_seq_id: SeqId) -> None:
        """The child shares every block of the parent; nothing is copied (vLLM section 4.4)."""
        table = self._table(parent_seq_id)
        child = self._check_new("child_seq_id", child_seq_id)
        self.allocator.share_blocks(table)
        self._tables[child] = list(table)
        self._tokens[child] = list(self._tokens[parent_seq_id])

    def _before_write(self, table: list[int]) -> None:
        """Copy-on-write: a shared partly filled last block is swapped for a new one + a copy."""
        shared = table[-1]
        if self._table_users(shared) == 1:
            return  # ours alone: written in place
        new = self.allocator.allocate()  # raises before anything changed
        # A shared block that is itself a pending copy: copy from *its* source (the same K/V).
        src = self._copies.get(shared, shared)
        self.allocator.share_blocks([src])  # the pending copy reads src (invariant 1)
        self._copies[new] = src
        self._reads[src] += 1
        self.allocator.release_blocks([shared])  # this table leaves the shared block
        table[-1] = new

    def _table_users(self, block: int) -> int:
        """Table entries pointing at ``block``: its reference count minus pending reads."""
        return self.allocator._ref[block] - self._reads.get(block, 0)

    @property
    def pending_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) copies recorded and not yet taken (a read-only view)."""
        return [(src, dst) for dst, src in self._copies.items()]

    def take_copies(self) -> list[tuple[int, int]]:
        """The pending (src, dst) pairs, cleared: apply them before writing the step's K/V and
        before the next allocation (a source may be free)."""
        pairs = self.pending_copies
        self._copies.clear()
        self._reads.clear()
        # Handed over: a copy no longer holds its source.
        self.allocator.release_blocks([src for src, _ in pairs])
        return pairs

    def _release(self, table: list[int]) -> None:
        super()._release(table)
        for dst in [d for d in self._copies if self.allocator.ref_count(d) == 0]:
            src = self._copies.pop(dst)  # nobody will read this copy: drop it
            self._reads[src] -= 1
            if self._reads[src] == 0:
                del self._reads[src]
            self.allocator.release_blocks([src])

    # ---- room for a decode step ------------------------------------------------------------
    def blocks_needed_to_append(self, seq_ids: Iterable[SeqId]) -> int:
        """New blocks one ``append_slot`` on each of ``seq_ids`` takes: one per full last block,
        one per copy (k writers of a block u tables hold copy k times if k < u, else k - 1)."""
        need, writers = 0, {}
        for s in check_id_list("seq_ids", seq_ids):
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
