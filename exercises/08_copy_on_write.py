"""Exercise 08: fork a sequence and append with copy-on-write (vLLM paper section 4.4).

Lesson: lessons/04_*.py (copy-on-write, parallel sampling, beam search).  Check: minipaged check 8

Parallel sampling asks for n completions of one prompt. Instead of n copies of the prompt's
K/V, fork() gives the child the parent's block table: the same physical blocks, each block's
reference count raised by one. Nothing is copied yet.

When a sequence appends a token and its last block is shared (reference count > 1), writing
there would change the other sequence's K/V. So append_slot():
  1. takes a fresh block, 2. records the copy (old block -> fresh block), 3. drops the old
  block's count by one, 4. puts the fresh block in its table and returns a slot in it.
The caller applies all recorded copies (take_copies(), one copy_blocks launch) BEFORE it writes
this step's new K/V. The other sequence, now the old block's only owner, writes in place.

Invariants (checked by the grader after every step, with K/V actually written):
- ref_count(b) == the number of block-table entries, over all live sequences, equal to b;
- a block with ref_count > 1 is never written;
- len(block_table(s)) == ceil(seq_len(s) / block_size);
- every live sequence reads back exactly the tokens written for it;
- freeing every sequence returns every block.
"""

from __future__ import annotations

EXERCISE = "08_copy_on_write"


class CowBlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        # Given: the state. You write the methods marked TODO below.
        self.block_size = block_size
        self.free_blocks = list(range(num_blocks - 1, -1, -1))  # pop() gives 0, 1, 2, ...
        self.ref_counts = [0] * num_blocks
        self.tables: dict[int, list[int]] = {}       # seq_id -> physical block ids
        self.seq_lens: dict[int, int] = {}           # seq_id -> tokens held
        self.copies: list[tuple[int, int]] = []      # pending (src, dst) copies

    # --- given helpers -------------------------------------------------------------------
    def _new_block(self) -> int:
        if not self.free_blocks:
            raise RuntimeError("out of blocks: needed 1, 0 free")
        b = self.free_blocks.pop()
        self.ref_counts[b] = 1
        return b

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    def block_table(self, seq_id: int) -> list[int]:
        return list(self.tables[seq_id])

    def ref_count(self, block: int) -> int:
        return self.ref_counts[block]

    # --- TODO ----------------------------------------------------------------------------
    def allocate(self, seq_id: int, num_tokens: int) -> None:
        """Give a new sequence ceil(num_tokens / block_size) fresh blocks (num_tokens >= 1).

        Errors: ValueError if seq_id already exists; RuntimeError if not enough blocks are free,
        and then nothing changes (check before taking any block).
        """
        raise NotImplementedError

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares all of the parent's blocks (counts rise by one); copies nothing.

        Errors: KeyError (or ValueError) for an unknown parent; ValueError if child_id exists.
        """
        raise NotImplementedError

    def append_slot(self, seq_id: int) -> int:
        """Room for one more token: return its slot (block * block_size + offset).

        A new block when the last one is full; copy-on-write when the last one is shared;
        otherwise the next offset of the last block.
        Errors: RuntimeError (from _new_block) when a block is needed and none is free; then
        nothing changes.
        Hint: the new token's position is seq_lens[seq_id]; its offset is position % block_size.
        """
        raise NotImplementedError

    def take_copies(self) -> list[tuple[int, int]]:
        """Return the pending (src, dst) copies in the order recorded, and clear them."""
        raise NotImplementedError

    def free(self, seq_id: int) -> None:
        """Drop the sequence: decrement each of its blocks; a block at 0 is free again."""
        raise NotImplementedError
