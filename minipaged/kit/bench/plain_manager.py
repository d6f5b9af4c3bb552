"""The baseline of ``minipaged bench allocator``: a block manager written the obvious way.

``PlainBlockManager`` does what ``KVCacheManager`` does on the benchmark's trace (allocate with
prefix caching, append_slot with copy-on-write of a shared last block, fork, free: the same
counts and the same prefix hits), so the ratio printed is one of data structures, not of work.
Its structures are those of compact engines: a deque of free block ids (a reused block is taken
from the left), a dict hash -> block id, and a ``_Block`` per physical block holding its hash
and tokens. A cache hit on a free block removes it from the deque by value, O(NB), where
KVCacheManager's free queue (an OrderedDict, ``sharing/prefix_cache.py``) drops it in O(1).
Out of blocks it raises ``MemoryError`` (the benchmark treats it as ``OutOfBlocksError``). A
yardstick only: nothing else in the package uses it.

Read before: ``allocator.py`` (the benchmark). Read next: ``../../serving/swap.py``
(``KVCacheManager``, the manager it is measured against).
"""

from __future__ import annotations

from collections import deque


class _Block:
    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id, self.ref_count, self.hash, self.token_ids = block_id, 0, -1, ()


class PlainBlockManager:
    """The baseline: a straightforward block manager with prefix caching and copy-on-write."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool) -> None:
        self.bs, self.prefix = block_size, prefix_caching
        self.blocks = [_Block(i) for i in range(num_blocks)]
        self.free_ids: deque[int] = deque(range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.tables: dict[object, list[int]] = {}
        self.tokens: dict[object, list[int]] = {}
        self.hashes: dict[object, list[int]] = {}

    def _new_block(self) -> int:
        bid = self.free_ids.popleft()
        b = self.blocks[bid]
        if b.hash != -1 and self.hash_to_block.get(b.hash) == bid:
            del self.hash_to_block[b.hash]
        b.ref_count, b.hash, b.token_ids = 1, -1, ()
        return bid

    def _cache(self, bid: int, h: int, toks: tuple) -> None:
        if self.prefix and h not in self.hash_to_block:
            b = self.blocks[bid]
            b.hash, b.token_ids = h, toks
            self.hash_to_block[h] = bid

    def allocate(self, seq, token_ids) -> int:
        bs, toks = self.bs, list(token_ids)
        n_blocks = (len(toks) + bs - 1) // bs
        hits, hashes, h = [], [], 0
        for i in range(len(toks) // bs if self.prefix else 0):
            chunk = tuple(toks[i * bs:(i + 1) * bs])
            h = hash((h, chunk))
            hashes.append(h)
            bid = self.hash_to_block.get(h)
            if (bid is not None and len(hits) == i and i < (len(toks) - 1) // bs
                    and self.blocks[bid].token_ids == chunk):
                hits.append(bid)
        reusable = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        if n_blocks - len(hits) > len(self.free_ids) - reusable:
            raise MemoryError("out of blocks")
        table = []
        for bid in hits:
            b = self.blocks[bid]
            if b.ref_count == 0:
                self.free_ids.remove(bid)  # O(NB): the obvious way
            b.ref_count += 1
            table.append(bid)
        for i in range(len(hits), n_blocks):
            bid = self._new_block()
            table.append(bid)
            if i < len(hashes):
                self._cache(bid, hashes[i], tuple(toks[i * bs:(i + 1) * bs]))
        self.tables[seq], self.tokens[seq], self.hashes[seq] = table, toks, hashes
        return len(hits) * bs

    def append_slot(self, seq, token_id: int) -> int:
        table, toks, bs = self.tables[seq], self.tokens[seq], self.bs
        n = len(toks)
        if n % bs == 0:
            if not self.free_ids:
                raise MemoryError("out of blocks")
            table.append(self._new_block())
        elif self.blocks[table[-1]].ref_count > 1:  # copy-on-write
            if not self.free_ids:
                raise MemoryError("out of blocks")
            self.blocks[table[-1]].ref_count -= 1
            table[-1] = self._new_block()
        toks.append(token_id)
        if (n + 1) % bs == 0:
            hashes = self.hashes[seq]
            h = hash((hashes[-1] if hashes else 0, tuple(toks[-bs:])))
            hashes.append(h)
            self._cache(table[-1], h, tuple(toks[-bs:]))
        return table[-1] * bs + n % bs

    def fork(self, parent, child) -> None:
        for bid in self.tables[parent]:
            self.blocks[bid].ref_count += 1
        self.tables[child] = list(self.tables[parent])
        self.tokens[child] = list(self.tokens[parent])
        self.hashes[child] = list(self.hashes[parent])

    def free(self, seq) -> None:
        for bid in reversed(self.tables.pop(seq)):
            b = self.blocks[bid]
            b.ref_count -= 1
            if b.ref_count == 0:
                self.free_ids.append(bid)
        del self.tokens[seq], self.hashes[seq]
