"""SPOILER: reference solution of exercise 08.

Try the exercise first: exercises/08_copy_on_write.py, graded by `minipaged check 8`.

Exercise 08: fork a sequence and append with copy-on-write (vLLM paper section 4.4).

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

    # --- solution ----------------------------------------------------------------------
    def allocate(self, seq_id: int, num_tokens: int) -> None:
        if seq_id in self.tables:
            raise ValueError(f"seq_id={seq_id} already exists")
        if num_tokens < 1:
            raise ValueError(f"num_tokens={num_tokens} must be >= 1")
        need = -(-num_tokens // self.block_size)
        if need > len(self.free_blocks):
            raise RuntimeError(f"out of blocks: needed {need}, {len(self.free_blocks)} free")
        self.tables[seq_id] = [self._new_block() for _ in range(need)]
        self.seq_lens[seq_id] = num_tokens

    def fork(self, parent_id: int, child_id: int) -> None:
        if parent_id not in self.tables:
            raise KeyError(f"parent_id={parent_id} is not a live sequence")
        if child_id in self.tables:
            raise ValueError(f"child_id={child_id} already exists")
        table = list(self.tables[parent_id])
        for b in table:
            self.ref_counts[b] += 1
        self.tables[child_id] = table
        self.seq_lens[child_id] = self.seq_lens[parent_id]

    def append_slot(self, seq_id: int) -> int:
        table = self.tables[seq_id]
        pos = self.seq_lens[seq_id]
        offset = pos % self.block_size
        if offset == 0:                       # last block full (or none): a fresh block
            table.append(self._new_block())
        elif self.ref_counts[table[-1]] > 1:  # shared partial block: copy-on-write
            old = table[-1]
            new = self._new_block()
            self.copies.append((old, new))
            self.ref_counts[old] -= 1
            table[-1] = new
        self.seq_lens[seq_id] = pos + 1
        return table[-1] * self.block_size + offset

    def take_copies(self) -> list[tuple[int, int]]:
        copies, self.copies = self.copies, []
        return copies

    def free(self, seq_id: int) -> None:
        for b in self.tables.pop(seq_id):
            self.ref_counts[b] -= 1
            if self.ref_counts[b] == 0:
                self.free_blocks.append(b)
        del self.seq_lens[seq_id]
