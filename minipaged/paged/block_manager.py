"""Block tables, slot mapping and the KV cache manager (allocate / append_slot / free / fork).

What this teaches: how a sequence's tokens are mapped onto physical blocks. Token position p of
a sequence lives in *logical block* p // BS at *offset* p % BS; the sequence's *block table* maps
logical block i to a *physical block* (any free one), and the cache slot that holds the token's
K/V is ``slot = block_table[p // BS] * BS + p % BS`` (the *slot mapping* that
``cache_ops.reshape_and_cache`` scatters into). Blocks are taken one at a time, only when the
last one is full, so a sequence never holds more than BS - 1 unused slots: that bound is the
whole memory win of paging (vLLM section 4.2, 4.3; the paper measured ~96% of the cache holding
token states against 20-38% for contiguous reservations).

Sharing (vLLM section 4.4): ``fork`` gives a child every block of its parent by raising reference
counts; ``append_slot`` on a sequence whose last block is shared performs *copy-on-write*: a new
block for the writer, a recorded (src, dst) copy that the caller applies with
``cache_ops.copy_blocks`` after ``take_copies()``, before it writes the step's new K/V. With
``enable_prefix_caching=True`` the allocator is ``prefix_cache.PrefixCachingBlockAllocator`` and
full blocks are shared between requests by hash instead (vLLM v1; no fork, tables append-only).
Preemption (section 4.5): ``swap_out`` / ``swap_in`` / ``preempt_by_recompute`` in ``swap.py``.

Read before: ``block_allocator.py``. Read next: ``cache_ops.py`` then ``paged_attention.py``.

Invariants (stated here, asserted by tests/test_kv_cache_stateful.py and test_sharing_stateful.py):
    1. each live sequence's table has exactly ceil(len / BS) entries;
    2. a block's reference count = number of table entries pointing at it (+1 while it waits,
       already dropped by its owners, as the source of a copy not yet taken);
    3. without sharing no physical block is in two tables; a block with ref > 1 is never handed
       out as a slot to write;
    4. free + used = total, and freeing every sequence returns the pool to full.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

from minipaged.contiguous.usage import KVUsage
from minipaged.paged.block_allocator import BlockAllocator, OutOfBlocksError, check_int
from minipaged.serving.swap import SwapMixin
from minipaged.sharing.prefix_cache import HashFn, PrefixCachingBlockAllocator

SeqId = Hashable


def check_token_ids(name: str, token_ids: Iterable[int]) -> list[int]:
    """A fresh list of int token ids; TypeError naming ``name`` for anything else."""
    tokens = list(token_ids)
    try:  # fast path, one C loop: a float, str or None anywhere makes the sum a non-int
        fast = type(sum(tokens)) is int
    except TypeError:
        fast = False
    if not fast:  # numpy integers, or bad input: convert one by one (and name the culprit)
        try:
            tokens = [operator.index(t) for t in tokens]
        except TypeError:
            raise TypeError(f"{name} must be a sequence of integer token ids, "
                            f"got {tokens!r:.80}") from None
    if not tokens:
        raise ValueError(f"{name} is empty: a sequence needs at least one token")
    return tokens


class KVCacheManager(SwapMixin):
    """Which physical blocks hold which sequence's tokens. Block ids only; the K/V arrays belong
    to the caller (``cache_ops`` writes them), exactly like vLLM's block manager and workers."""

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = False,
                 num_cpu_blocks: int = 0, hash_fn: HashFn | None = None) -> None:
        self.block_size = check_int("block_size", block_size, low=1)
        self.enable_prefix_caching = bool(enable_prefix_caching)
        self._prefix: PrefixCachingBlockAllocator | None = None
        if self.enable_prefix_caching:
            self._prefix = PrefixCachingBlockAllocator(num_blocks, hash_fn)
            self._alloc: BlockAllocator = self._prefix
        else:
            self._alloc = BlockAllocator(num_blocks)
        self._ref = self._alloc._ref  # the allocator's counts, read on every append (hot path)
        self._tables: dict[SeqId, list[int]] = {}      # seq -> physical block per logical block
        self._tokens: dict[SeqId, list[int]] = {}      # seq -> token ids so far
        self._hashes: dict[SeqId, list[int]] = {}      # seq -> chain hash of each full block
        self._serials: dict[SeqId, list[int]] = {}     # seq -> serial standing for prefix 0..i
        self._copies: dict[int, int] = {}              # pending copy-on-write: dst -> src
        self._src_pairs: dict[int, int] = {}           # src -> number of pending copies from it
        self._deferred: set[int] = set()               # pending sources nobody else holds
        SwapMixin.__init__(self, num_cpu_blocks)

    # ---- queries ---------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return self._alloc.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self._alloc.num_free_blocks

    @property
    def allocator(self) -> BlockAllocator:
        return self._alloc

    @property
    def seq_ids(self) -> list[SeqId]:
        """Every sequence the manager holds, on the GPU or swapped out (see ``is_swapped``)."""
        return list(self._tokens)

    def ref_count(self, block: int) -> int:
        return self._alloc.ref_count(block)

    def _seq(self, seq_id: SeqId) -> list[int]:
        table = self._tables.get(seq_id)
        if table is None:
            raise self._seq_error(seq_id)
        return table

    def _seq_error(self, seq_id: SeqId) -> Exception:
        if seq_id in self._tokens:
            return ValueError(f"seq_id={seq_id!r} is swapped out; swap_in it first")
        return KeyError(f"seq_id={seq_id!r} is not allocated (known: {self.seq_ids[:8]})")

    def seq_len(self, seq_id: SeqId) -> int:
        if seq_id not in self._tokens:
            raise KeyError(f"seq_id={seq_id!r} is not allocated")
        return len(self._tokens[seq_id])

    def token_ids(self, seq_id: SeqId) -> list[int]:
        self.seq_len(seq_id)
        return list(self._tokens[seq_id])

    def block_table(self, seq_id: SeqId) -> list[int]:
        return list(self._seq(seq_id))

    def block_tables(self, seq_ids: Sequence[SeqId], pad: int = -1) -> np.ndarray:
        """int32 [S, MB] with MB the longest table; entries past a table's end are ``pad``."""
        tables = [self._seq(s) for s in seq_ids]
        mb = max((len(t) for t in tables), default=0)
        out = np.full((len(tables), mb), pad, dtype=np.int32)  # [S, MB]
        for i, t in enumerate(tables):
            out[i, :len(t)] = t
        return out

    def slot_mapping(self, seq_id: SeqId, start: int, end: int) -> np.ndarray:
        """int64 [end - start]: the cache slot of each token position in [start, end)."""
        table, n = self._seq(seq_id), len(self._tokens[seq_id])
        start = check_int("start", start, low=0, high=n + 1)
        end = check_int("end", end, low=start, high=n + 1)
        pos = np.arange(start, end, dtype=np.int64)
        bs = self.block_size
        return np.asarray(table, dtype=np.int64)[pos // bs] * bs + pos % bs

    def can_allocate(self, num_tokens: int) -> bool:
        """Room for a prompt of ``num_tokens`` with no prefix-cache hit (hits only help: with
        prefix caching, ``allocate`` may still succeed when this says False)."""
        n = check_int("num_tokens", num_tokens, low=1)
        return -(-n // self.block_size) <= self.num_free_blocks

    def blocks_needed_to_append(self, seq_ids: Iterable[SeqId]) -> int:
        """New blocks one ``append_slot`` on each of ``seq_ids`` would take: one per sequence
        whose last block is full, plus one per copy-on-write (a shared last block costs a copy
        for each writer but the last one, who then owns it alone)."""
        need, writers = 0, {}
        for s in seq_ids:
            table = self._seq(s)
            if len(self._tokens[s]) % self.block_size == 0:
                need += 1
            else:
                writers[table[-1]] = writers.get(table[-1], 0) + 1
        for block, k in writers.items():
            ref = self._alloc.ref_count(block)
            need += k if k < ref else k - 1
        return need

    def can_append_slots(self, seq_ids: Iterable[SeqId]) -> bool:
        return self.blocks_needed_to_append(seq_ids) <= self.num_free_blocks

    # ---- allocate / append / free ----------------------------------------------------------
    def allocate(self, seq_id: SeqId, token_ids: Iterable[int]) -> int:
        """Blocks for a new sequence's prompt. Returns how many prompt tokens already have K/V
        in the cache (prefix-cache hits, a multiple of BS; always 0 without prefix caching).
        The caller computes and writes K/V for positions [returned, len) only.

        All or nothing: on OutOfBlocksError nothing has changed."""
        if seq_id in self._tokens:
            raise ValueError(f"seq_id={seq_id!r} is already allocated")
        tokens = check_token_ids("token_ids", token_ids)
        bs, n = self.block_size, len(tokens)
        n_blocks = -(-n // bs)
        alloc, prefix = self._alloc, self._prefix
        hits: list[int] = []
        if prefix is not None:
            # At least the last prompt token is recomputed (the model needs its logits), so a
            # block reaching position n - 1 is never a hit: at most (n - 1) // BS hits.
            hits, hashes, chunks, serials = prefix.match(tokens, bs, (n - 1) // bs)
        need = n_blocks - len(hits)
        avail = alloc.num_free_blocks
        if hits:  # hits sitting in the LRU queue are counted free but are not ours to take
            avail -= list(map(self._ref.__getitem__, hits)).count(0)  # C loops only
        if need > avail:
            raise OutOfBlocksError(need, avail,
                                   f"for the prompt of seq_id={seq_id!r} ({n} tokens)")
        if prefix is not None:
            prefix.touch_all(hits)  # out of the LRU queue *before* allocating may evict them
            prefix.hits += len(hits)
            prefix.queries += len(hashes)
        table = hits + alloc.allocate_many(need)
        self._tables[seq_id] = table
        self._tokens[seq_id] = tokens
        if prefix is not None:  # new full blocks (if any; often all full ones were hits)
            if len(hits) < len(hashes):
                serials = prefix.register_run(table, hashes, chunks, len(hits), serials)
            self._serials[seq_id] = serials
            self._hashes[seq_id] = hashes
        return len(hits) * bs

    def append_slot(self, seq_id: SeqId, token_id: int) -> int:
        """The cache slot for one new token at position ``seq_len``; a new block only when the
        last is full; copy-on-write when the last block is shared. On OutOfBlocksError nothing
        has changed (the token is not appended)."""
        try:  # a subscript, not .get(): no method call on the hottest path (~200k calls)
            table = self._tables[seq_id]
        except KeyError:
            raise self._seq_error(seq_id) from None
        if type(token_id) is not int:
            token_id = check_int("token_id", token_id)
        tokens = self._tokens[seq_id]
        bs = self.block_size
        offset = len(tokens) % bs
        if offset == 0:
            block = self._alloc.allocate()
            table.append(block)
        else:
            block = table[-1]
            if self._ref[block] > 1:
                block = self._copy_on_write(table)
        tokens.append(token_id)
        if offset == bs - 1 and self._prefix is not None:  # just full: hash it, cache it
            self._prefix.register_next(block, self._hashes[seq_id], self._serials[seq_id],
                                       tuple(tokens[-bs:]))
        return block * bs + offset

    def _copy_on_write(self, table: list[int]) -> int:
        """Our own copy of the shared partial last block (vLLM section 4.4); returns it."""
        block = table[-1]
        new = self._alloc.allocate()  # raises before anything changed
        # If the block is itself a copy still pending, copy from *its* source: nothing is
        # written before the copies are applied, so the contents are the same.
        src = self._copies.get(block, block)
        self._copies[new] = src
        self._src_pairs[src] = self._src_pairs.get(src, 0) + 1
        self._unref(block)
        table[-1] = new
        return new

    def free(self, seq_id: SeqId) -> None:
        """Release a sequence (finished or aborted): every block loses one user."""
        table = self._tables.pop(seq_id, None)
        if table is not None:
            if self._src_pairs or self._copies:
                self._release_table(table)
            else:  # the common case, no copy pending: _release_table's fast path, one call less
                self._alloc.free_many(reversed(table))
        elif seq_id in self._tokens:
            self._free_swapped(seq_id)
        else:
            raise KeyError(f"seq_id={seq_id!r} is not allocated")
        del self._tokens[seq_id]
        if self._prefix is not None:
            del self._hashes[seq_id], self._serials[seq_id]

    def _release_table(self, table: list[int]) -> None:
        # Reverse order: with prefix caching the *tail* blocks, least likely to be shared by a
        # future prompt, then sit nearer the head of the LRU queue and are evicted first.
        if not self._src_pairs and not self._copies:  # the common case: no copy pending
            self._alloc.free_many(reversed(table))
            return
        for block in reversed(table):
            self._unref(block)

    def _unref(self, block: int) -> None:
        if self._ref[block] == 1:
            src = self._copies.pop(block, None)
            if src is not None:  # a pending copy *into* this block: its owner left, drop it
                self._drop_src(src)
            if self._src_pairs.get(block):
                # A pending copy still reads this block: keep it out of the free list, or the
                # next allocate could hand it out and a write could land before the copy.
                self._deferred.add(block)
                return
        self._alloc.free(block)

    def _drop_src(self, src: int) -> None:
        self._src_pairs[src] -= 1
        if self._src_pairs[src] == 0:
            del self._src_pairs[src]
            if src in self._deferred:
                self._deferred.discard(src)
                self._alloc.free(src)

    # ---- sharing: fork and copy-on-write ---------------------------------------------------
    def fork(self, parent_seq_id: SeqId, child_seq_id: SeqId) -> None:
        """The child shares every block of the parent; nothing is copied (vLLM section 4.4)."""
        if self.enable_prefix_caching:
            raise ValueError("fork is copy-on-write sharing (vLLM v0); with "
                             "enable_prefix_caching=True, share a prompt by allocating it once "
                             "per sample instead: full blocks are then shared through the cache")
        if child_seq_id in self._tokens:
            raise ValueError(f"child_seq_id={child_seq_id!r} already exists")
        table = self._seq(parent_seq_id)
        ref = self._ref
        for block in table:  # in a table, so in use: incref's checks cannot fail here
            ref[block] += 1
        self._tables[child_seq_id] = list(table)
        self._tokens[child_seq_id] = list(self._tokens[parent_seq_id])

    @property
    def pending_copies(self) -> list[tuple[int, int]]:
        """The (src, dst) copies recorded and not yet taken (read-only view)."""
        return [(src, dst) for dst, src in self._copies.items()]

    def take_copies(self) -> list[tuple[int, int]]:
        """The pending copy-on-write (src, dst) pairs, cleared. Apply them with
        ``cache_ops.copy_blocks`` before writing this step's new K/V."""
        if not self._copies and not self._deferred:
            return []
        pairs = [(src, dst) for dst, src in self._copies.items()]
        self._copies.clear()
        self._src_pairs.clear()
        for block in sorted(self._deferred):
            self._alloc.free(block)
        self._deferred.clear()
        return pairs

    # ---- accounting ------------------------------------------------------------------------
    def usage(self, final_lens: Mapping[SeqId, int] | None = None) -> KVUsage:
        """Slots by category (``usage.py``). A shared block is counted once: its filled slots
        are the most any of its users has written, its reserved slots the most any user will
        still write; the rest of an allocated block is internal fragmentation.

        O(#sequences), yet equal to the oracle ``usage_slow`` (stateful tests assert it): a block
        in use is in a table or is a pending copy source nobody holds (``_deferred``); only a
        *last* block can be partly filled, with the same fill in every table holding it (a
        shared block is never written; prefix caching shares only full blocks). So tables hold
        ``used - len(_deferred)`` blocks: full but partial last ones (reservations sit there)."""
        bs, tokens = self.block_size, self._tokens
        partial: dict[int, tuple[int, int]] = {}  # last block -> (filled, wanted)
        for s, table in self._tables.items():
            n = len(tokens[s])
            filled = n % bs
            if filled:
                final = n if final_lens is None else max(n, int(final_lens.get(s, n)))
                wanted = min(bs, final - n + filled)
                f0, w0 = partial.get(table[-1], (0, 0))  # shared by a fork: the longest plan
                partial[table[-1]] = (max(f0, filled), max(w0, wanted))
        used = self.num_blocks - self.num_free_blocks
        token = (used - len(self._deferred)) * bs - sum(bs - f for f, _ in partial.values())
        reserved = sum(w - f for f, w in partial.values())
        return KVUsage(total=self.num_blocks * bs, token=token, reserved=reserved,
                       internal_fragmentation=used * bs - token - reserved,
                       external_fragmentation=0, free=self.num_free_blocks * bs)

    def usage_slow(self, final_lens: Mapping[SeqId, int] | None = None) -> KVUsage:
        """Oracle for ``usage``: the definition, block by block over every table entry."""
        bs, filled, wanted = self.block_size, {}, {}  # block -> most filled / most wanted
        for s, table in self._tables.items():
            n = len(self._tokens[s])
            final = n if final_lens is None else max(n, int(final_lens.get(s, n)))
            for i, block in enumerate(table):
                start = i * bs
                filled[block] = max(filled.get(block, 0), min(bs, n - start))
                wanted[block] = max(wanted.get(block, 0), min(bs, final - start))
        token, reserved = sum(filled.values()), sum(wanted[b] - filled[b] for b in filled)
        used = self.num_blocks - self.num_free_blocks  # + pending copy sources in no table
        return KVUsage(total=self.num_blocks * bs, token=token, reserved=reserved,
                       internal_fragmentation=used * bs - token - reserved,
                       external_fragmentation=0, free=self.num_free_blocks * bs)

    def check_invariants(self) -> None:
        """Assert invariants 1, 2 and 4 of the module docstring (O(NB), for tests)."""
        self._alloc.check_invariants()
        bs = self.block_size
        refs = [0] * self.num_blocks
        for s, table in self._tables.items():
            assert len(table) == -(-len(self._tokens[s]) // bs), f"seq {s!r}: table length"
            for b in table:
                refs[b] += 1
        for b in self._deferred:
            refs[b] += 1
        for b in range(self.num_blocks):
            assert refs[b] == self._alloc._ref[b], (
                f"block {b}: reference count {self._alloc._ref[b]} but {refs[b]} users")
        self._check_swap_invariants()
