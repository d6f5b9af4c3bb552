"""Prefix caching: full blocks found again by a hash of everything before them (vLLM v1 style).

What this teaches (lesson 05; paper section 4.4, shared prefix): every full block gets a hash
chained from its parent's, ``h_i = hash_fn(h_{i-1}, tokens of block i)`` from ``ROOT_HASH``, so
equal hashes mean the same *whole prefix*, and a table maps hash -> block. A prompt reuses the
longest run of cached blocks from its start, at most (n - 1) // BS: the last token is recomputed
for its logits (vllm/v1/core/kv_cache_manager.py get_computed_blocks). Freed blocks keep K/V and
hash in ONE free queue in eviction order, as vLLM's FreeKVCacheBlockQueue
(vllm/v1/core/kv_cache_utils.py): ``allocate`` pops the head and only then evicts its hash
(block_pool.py get_new_blocks); ``free`` puts hashed blocks at the tail (LRU), a table's tail
first, and unhashed ones at the head (block_pool.py free_blocks, vLLM 0.32); a hit takes a block
out of the middle (block_pool.py touch).

A hit also compares token ids, as nano-vllm does (nanovllm/engine/block_manager.py); vLLM trusts
its hash, sha256 by default (block_pool.py get_cached_block; vllm/config/cache.py). With a weak
``hash_fn`` (the default is Python's tuple hash) a collision then costs a hit, not wrong K/V. A
block filled under a hash already cached is cached too (block_pool.py BlockHashToBlockMap: "we
don't de-duplicate"); lookups take the oldest. Fork and copy-on-write work too, as in vLLM v0.
A block with a hash is never written: after a ``rollback`` cut into one it stays findable (its
K/V are intact) until the next write evicts it (one user) or copies it (shared).

Invariants (tests/invariants.py, in the stateful tests with fork and copy-on-write):
    1. the free queue holds every free block once, unhashed ones first, then hashed ones least
       recently used first: allocation evicts only when nothing else is free;
    2. the table maps each hash to the blocks carrying it, each with its cached token ids;
    3. a live table's full blocks with K/V written (``cache_blocks``) carry the chain hash of
       their position; the ones still to be computed (chunked prefill) carry none.

Read before: ``sharing/sampling.py``. Read next: ``serving/swap.py``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable

from minipaged._checks import (
    OutOfBlocksError,
    cdiv,
    check_bool,
    check_callable,
    check_int,
    check_token_ids,
)
from minipaged.paged.block_allocator import BlockAllocator
from minipaged.paged.block_manager import SeqId
from minipaged.sharing.cow import CowBlockManager

ROOT_HASH = 0  # the "parent hash" of a sequence's first block
HashFn = Callable[[Hashable, tuple[int, ...]], Hashable]


def default_block_hash(parent_hash: Hashable, token_ids: tuple[int, ...]) -> int:
    """Python's hash of a tuple of ints: 64-bit and deterministic (ints are not salted)."""
    return hash((parent_hash, token_ids))


class PrefixCachingBlockAllocator(BlockAllocator):
    """A ``BlockAllocator`` with the hash table and one eviction-order free queue."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks)
        self._free = OrderedDict.fromkeys(range(self.num_blocks))  # head: allocated next
        self._hash: list[Hashable | None] = [None] * self.num_blocks
        self._block_tokens: list[tuple[int, ...] | None] = [None] * self.num_blocks
        self._cached: dict[Hashable, list[int]] = {}  # hash -> blocks carrying it, oldest first
        self.hits = 0       # prompt blocks reused from the cache
        self.queries = 0    # full prompt blocks looked up
        self.evictions = 0  # cached blocks whose hash was dropped to reuse the block

    def _take_free(self) -> int:
        block, _ = self._free.popitem(last=False)
        if self._hash[block] is not None:
            self.evict(block)
        return block

    def _put_free(self, blocks: list[int]) -> None:
        for b in blocks:
            if self._hash[b] is not None:
                self._free[b] = None  # the tail: evicted last
        for b in reversed([b for b in blocks if self._hash[b] is None]):
            self._free[b] = None
            self._free.move_to_end(b, last=False)  # the head, in the order given

    def evict(self, block: int) -> None:
        """Drop a block's hash, to reuse the block: no lookup finds it any more."""
        h = self._hash[block]
        self._cached[h].remove(block)
        if not self._cached[h]:
            del self._cached[h]
        self._hash[block] = self._block_tokens[block] = None
        self.evictions += 1

    def lookup(self, block_hash: Hashable, token_ids: tuple[int, ...]) -> int | None:
        """The earliest cached block with this hash and these token ids, or None."""
        for b in self._cached.get(block_hash, ()):
            if self._block_tokens[b] == token_ids:
                return b
        return None

    def touch(self, blocks: Iterable[int]) -> None:
        """One more user of each (cached) block; a free one leaves the queue's middle."""
        for b in blocks:
            if self._ref[b] == 0:
                del self._free[b]
            self._ref[b] += 1

    def cache_block(self, block: int, block_hash: Hashable, token_ids: Iterable[int]) -> None:
        """Record that ``block`` (in use, full, not cached) holds ``token_ids`` after the prefix
        ``block_hash`` stands for."""
        b = self._check_block(block)
        if self._ref[b] == 0 or self._hash[b] is not None:
            raise ValueError(f"block={b} must be in use and not cached yet to be cached "
                             f"(reference count {self._ref[b]}, hash {self._hash[b]!r})")
        self._hash[b], self._block_tokens[b] = block_hash, tuple(token_ids)
        self._cached.setdefault(block_hash, []).append(b)

    # ---- inspection (lessons, the demo, tests) ---------------------------------------------
    def cached_blocks(self) -> dict[Hashable, int]:
        """A copy of the table: hash -> the block a lookup returns."""
        return {h: blocks[0] for h, blocks in self._cached.items()}

    def block_hash(self, block: int) -> Hashable | None:
        return self._hash[self._check_block(block)]

    def block_token_ids(self, block: int) -> tuple[int, ...] | None:
        return self._block_tokens[self._check_block(block)]

    def free_queue(self) -> list[int]:
        """Every free block, next allocated first."""
        return list(self._free)

    def lru_blocks(self) -> list[int]:
        """The free blocks that carry a hash, next evicted first."""
        return [b for b in self._free if self._hash[b] is not None]

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self.lru_blocks())


class PrefixCachingBlockManager(CowBlockManager):
    """``CowBlockManager`` plus prefix caching; with ``enable_prefix_caching=False`` it is
    exactly a ``CowBlockManager`` (a plain allocator, nothing hashed)."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False,
                 hash_fn: HashFn | None = None) -> None:
        super().__init__(num_blocks, block_size)
        self.hash_fn: HashFn = default_block_hash if hash_fn is None else check_callable(
            "hash_fn", hash_fn)
        self.enable_prefix_caching = check_bool("enable_prefix_caching", enable_prefix_caching)
        if self.enable_prefix_caching:
            self.allocator = PrefixCachingBlockAllocator(num_blocks)
        self._hashes: dict[SeqId, list[Hashable]] = {}  # seq -> chain hash of its full blocks
        self._computed: dict[SeqId, int] = {}  # seq -> its leading tokens with K/V written

    def _hash_block(self, parent: Hashable, token_ids: tuple[int, ...]) -> Hashable:
        h = self.hash_fn(parent, token_ids)
        try:
            hash(h)
        except TypeError:
            raise TypeError(f"hash_fn returned {h!r:.60}, which is not hashable") from None
        return h

    def _plan(self, tokens: list[int]) -> tuple[list[Hashable], list[int]]:
        """The chain hash of every full block of ``tokens`` and the run of hits from the start;
        changes nothing."""
        bs = self.block_size
        max_hits = (len(tokens) - 1) // bs  # the last prompt token is always recomputed
        hashes, hits, parent = [], [], ROOT_HASH
        for i in range(len(tokens) // bs):
            chunk = tuple(tokens[i * bs:(i + 1) * bs])
            parent = self._hash_block(parent, chunk)
            hashes.append(parent)
            if len(hits) == i and i < max_hits:  # the run of hits is unbroken so far
                block = self.allocator.lookup(parent, chunk)
                if block is not None:
                    hits.append(block)
        return hashes, hits

    def _taken(self, hits: list[int], num_tokens: int) -> tuple[int, int]:
        """(new blocks, hits in the free queue: counted as free, but ours to take, not spare)."""
        free_hits = len({b for b in hits if self.allocator.ref_count(b) == 0})
        return cdiv(num_tokens, self.block_size) - len(hits), free_hits

    def blocks_to_allocate(self, token_ids: Iterable[int]) -> int:
        """Free blocks ``allocate(token_ids)`` would take now (new ones and free hits): it
        succeeds exactly when this is at most ``num_free_blocks``."""
        tokens = check_token_ids("token_ids", token_ids)
        if not self.enable_prefix_caching:
            return cdiv(len(tokens), self.block_size)
        return sum(self._taken(self._plan(tokens)[1], len(tokens)))

    def allocate(self, seq_id: SeqId, token_ids: Iterable[int], *, cache: bool = True) -> int:
        """Blocks for a prompt; returns the prompt tokens that already have K/V (the hits, a
        multiple of BS). All or nothing, also when hash_fn raises. ``cache=False`` (chunked
        prefill): no block is findable before ``cache_blocks`` says its K/V are written (vLLM
        caches computed blocks only: vllm/v1/core/kv_cache_manager.py allocate_slots)."""
        check_bool("cache", cache)
        if not self.enable_prefix_caching:
            return super().allocate(seq_id, token_ids)
        seq_id = self._check_new("seq_id", seq_id)
        tokens = check_token_ids("token_ids", token_ids)
        hashes, hits = self._plan(tokens)
        need, free_hits = self._taken(hits, len(tokens))
        spare = self.num_free_blocks - free_hits
        if need > spare:
            raise OutOfBlocksError(need, spare,
                                   f"for the prompt of seq_id={seq_id!r} ({len(tokens)} tokens)")
        self.allocator.touch(hits)  # out of the queue *before* allocating, which may evict
        self._tables[seq_id] = hits + self.allocator.allocate_many(need)
        self._tokens[seq_id], self._hashes[seq_id] = tokens, hashes
        self._computed[seq_id] = len(hits) * self.block_size
        if cache:
            self.cache_blocks(seq_id, len(tokens))
        self.allocator.hits += len(hits)
        self.allocator.queries += len(hashes)
        return len(hits) * self.block_size

    def append_slot(self, seq_id: SeqId, token_id: int) -> int:
        """As ``CowBlockManager.append_slot``; a block this token fills is hashed (first, so a
        hash_fn that raises changes nothing) and cached."""
        if not self.enable_prefix_caching:
            return super().append_slot(seq_id, token_id)
        table = self._table(seq_id)
        token_id = check_int("token_id", token_id, low=0)
        self._check_computed("append_slot", seq_id)
        tokens, hashes, bs = self._tokens[seq_id], self._hashes[seq_id], self.block_size
        fills = (len(tokens) + 1) % bs == 0
        if fills:
            chunk = tuple(tokens[len(tokens) + 1 - bs:]) + (token_id,)
            h = self._hash_block(hashes[-1] if hashes else ROOT_HASH, chunk)
        # A block with a hash is never written: its only user evicts it first (a sharer copies).
        if len(tokens) % bs and self._table_users(table[-1]) == 1:
            if self.allocator.block_hash(table[-1]) is not None:
                self.allocator.evict(table[-1])
        slot = super().append_slot(seq_id, token_id)  # raises with nothing changed
        self._computed[seq_id] = len(tokens)  # a decode: this step writes the new token's K/V
        if fills:
            hashes.append(h)
            self.allocator.cache_block(slot // bs, h, chunk)
        return slot

    def _check_computed(self, doing: str, seq_id: SeqId) -> None:
        # A block is cached once full: every token in it must have K/V first (chunked prefill).
        done, n = self._computed.get(seq_id, 0), len(self._tokens.get(seq_id, ()))
        if done < n:
            raise ValueError(f"{doing}: seq_id={seq_id!r} has K/V for {done} of its {n} tokens; "
                             f"call cache_blocks(seq_id, {n}) once they are written")

    def cache_blocks(self, seq_id: SeqId, num_computed_tokens: int) -> None:
        """The first ``num_computed_tokens`` tokens have K/V (written this step or before): the
        full blocks among them become findable by hash."""
        table, tokens, bs = self._table(seq_id), self._tokens[seq_id], self.block_size
        n = check_int("num_computed_tokens", num_computed_tokens, low=0, high=len(tokens) + 1)
        if not self.enable_prefix_caching:
            return
        n = self._computed[seq_id] = max(self._computed[seq_id], n)
        for i, (block, h) in enumerate(zip(table[:n // bs], self._hashes[seq_id])):
            if self.allocator.block_hash(block) is None:  # a full block not yet cached
                self.allocator.cache_block(block, h, tokens[i * bs:(i + 1) * bs])

    def rollback(self, seq_id: SeqId, n: int) -> None:
        super().rollback(seq_id, n)
        if self.enable_prefix_caching:
            del self._hashes[seq_id][self.seq_len(seq_id) // self.block_size:]
            self._computed[seq_id] = min(self._computed[seq_id], self.seq_len(seq_id))

    def fork(self, parent_seq_id: SeqId, child_seq_id: SeqId) -> None:
        if self.enable_prefix_caching:
            self._check_computed("fork", parent_seq_id)
        super().fork(parent_seq_id, child_seq_id)
        if self.enable_prefix_caching:
            self._hashes[child_seq_id] = list(self._hashes[parent_seq_id])
            self._computed[child_seq_id] = self._computed[parent_seq_id]

    def free(self, seq_id: SeqId) -> None:
        super().free(seq_id)
        self._hashes.pop(seq_id, None)
        self._computed.pop(seq_id, None)
