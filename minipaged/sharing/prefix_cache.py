"""Prefix caching: full blocks found again by a hash of everything before them (vLLM v1 style).

What this teaches: how vLLM v1 (and nano-vllm) share KV cache blocks *between requests* without
copy-on-write. Every full block gets a hash chained from its parent block's hash and its own
token ids::

    h_0 = hash(ROOT, tokens[0:BS]);  h_i = hash(h_{i-1}, tokens[i*BS:(i+1)*BS])

so two blocks with equal hashes hold K/V of the same *whole prefix*, not only of the same BS
tokens (K/V of a token depend on every token before it). A table maps hash -> physical block.
A new prompt walks its own chain and reuses the longest run of cached blocks; only full blocks
are ever cached, so a shared block is never written again and block tables stay append-only.

When its last user leaves, a block that carries a hash is *not* forgotten: it goes to a free
queue in least-recently-used order and keeps its K/V and its hash. It stays a hit for the next
request until the allocator actually needs a block and no never-cached block is left; only then
is the oldest one evicted (its hash dropped) and reused. Paper: vLLM section 4.4 describes shared
prefixes; the hash-and-LRU design is vLLM v1's (docs "Automatic Prefix Caching"). Read next:
``swap.py`` (preemption) or ``lessons/05_prefix_caching.py``.

Invariants (asserted by ``check_invariants`` in the stateful tests):
    * a block is in exactly one of: in use (ref >= 1), the clean free list, the LRU queue;
    * the LRU queue holds exactly the free blocks that carry a hash;
    * the table maps each hash to a block whose recorded hash is that hash;
    * a hit is verified, not only looked up: the cached block's token ids must equal the
      prompt's, and its recorded parent must be the very block (same allocation ``serial``)
      that the previous hit verified. By induction the whole prefix matches, so a hash
      collision can cost a hit but never return another prefix's K/V (the stateful tests run
      with a hash function that collides all the time to prove it). vLLM and nano-vllm check
      less (the hash, or the hash and the block's tokens) and accept a ~2^-64 risk instead.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from minipaged.paged.block_allocator import BlockAllocator, OutOfBlocksError

ROOT_HASH = 0     # the "parent hash" of a sequence's first block
ROOT_SERIAL = -1  # the "parent serial" of a sequence's first block
BROKEN = -2       # a chain that can no longer be cached (a collision took its hash)

HashFn = Callable[[int, tuple[int, ...]], int]


def default_block_hash(parent_hash: int, token_ids: tuple[int, ...]) -> int:
    """Python's hash of a tuple of ints: 64-bit, deterministic (ints are not salted), and fast
    because it runs in C. vLLM uses sha256 or a builtin hash; nano-vllm uses xxhash64."""
    return hash((parent_hash, token_ids))


class PrefixCachingBlockAllocator(BlockAllocator):
    """A ``BlockAllocator`` whose freed blocks keep their K/V and hash until memory is needed.

    The LRU queue needs three O(1) operations: append at the tail when a block's last user
    leaves, pop at the head to evict the least recently used, and take a block out of the
    *middle* when a new request hits it. vLLM v1 writes a doubly linked list by hand
    (FreeKVCacheBlockQueue). In Python a linked list costs an object per block, and an
    ``OrderedDict`` (a linked list plus an index) ~100-200 ns per operation, more than the rest
    of a decode step's bookkeeping. So the queue is a ``deque`` with *lazy deletion*: taking a
    block out of the middle only marks its entry stale (``_stale[block] += 1``: one entry of that
    block, its oldest, is dead); popping at the head skips stale entries; when stale entries
    outnumber live ones the deque is rebuilt without them. Every operation is O(1) amortized
    and the order of the live entries is exactly that of the linked list. (A block's stale
    entries are always older than its live one: it re-enters the queue only after the hit that
    made the old entry stale.)
    """

    def __init__(self, num_blocks: int, hash_fn: HashFn | None = None) -> None:
        super().__init__(num_blocks)
        self.hash_fn: HashFn = hash_fn or default_block_hash
        self._lru: deque[int] = deque()        # free blocks with a hash, oldest first (+ stale)
        self._stale: list[int] = [0] * self.num_blocks  # per block: its stale entries in _lru
        self._num_stale = 0                               # sum of _stale
        self._table: dict[int, int] = {}                    # hash -> physical block
        self._block_hash: list[int | None] = [None] * self.num_blocks
        self._block_parent: list[int] = [ROOT_SERIAL] * self.num_blocks  # parent's serial
        self._block_tokens: list[tuple[int, ...] | None] = [None] * self.num_blocks
        # Every allocation of a block gets a new serial number: "block 7 as allocated at time
        # 1234". A full block's K/V never change within one allocation, so a serial names a
        # prefix's content exactly, which a block id alone (reused after eviction) cannot.
        self._serial: list[int] = [ROOT_SERIAL] * self.num_blocks
        self._next_serial = 0
        self.hits = 0           # blocks reused from the cache
        self.queries = 0        # blocks looked up
        self.evictions = 0      # cached blocks whose hash was dropped to reuse the block

    # ---- the free side ---------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._lru) - self._num_stale

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._lru) - self._num_stale

    def lru_blocks(self) -> list[int]:
        """The free cached blocks, least recently used first (the live entries of the queue)."""
        stale = list(self._stale)
        out = []
        for b in self._lru:
            if stale[b]:
                stale[b] -= 1  # a block's oldest entries are its stale ones
            else:
                out.append(b)
        return out

    def allocate(self) -> int:
        if self._free:  # never-cached blocks first: evict only when nothing else is left
            block = self._free.pop()
        elif len(self._lru) > self._num_stale:
            block = self._evict_oldest()
        else:
            raise OutOfBlocksError(1, 0)
        self._ref[block] = 1
        self._serial[block] = self._next_serial
        self._next_serial += 1
        return block

    def allocate_many(self, n: int) -> list[int]:
        """Same blocks, same order as ``n`` calls of ``allocate``: the clean ones, then the
        least recently used cached ones (evicted). One plain loop: a prompt's new blocks are
        few (its prefix is mostly hits), so slicing tricks cost more than they save."""
        free = self._free
        if n > len(free) + len(self._lru) - self._num_stale:
            raise OutOfBlocksError(n, self.num_free_blocks)
        ref, serial, nxt = self._ref, self._serial, self._next_serial
        blocks = []
        for _ in range(n):
            b = free.pop() if free else self._evict_oldest()
            ref[b] = 1
            serial[b] = nxt
            nxt += 1
            blocks.append(b)
        self._next_serial = nxt
        return blocks

    def _evict_oldest(self) -> int:
        """Pop the least recently used cached block (the caller checked there is one), skipping
        stale entries, and drop its hash: its K/V are about to be overwritten."""
        lru, stale, block_hash = self._lru, self._stale, self._block_hash
        b = lru.popleft()
        while stale[b]:  # an entry a hit made stale earlier: skip it
            stale[b] -= 1
            self._num_stale -= 1
            b = lru.popleft()
        table, h = self._table, block_hash[b]
        if table.get(h) == b:
            del table[h]
        block_hash[b] = None
        self._block_tokens[b] = None
        self.evictions += 1
        return b

    def _release(self, block: int) -> None:
        if self._block_hash[block] is None:
            self._free.append(block)
        else:
            self._lru.append(block)  # most recently used end

    def _release_many(self, blocks: list[int]) -> None:
        hashes, free, lru = self._block_hash, self._free, self._lru
        for b in blocks:
            if hashes[b] is None:
                free.append(b)
            else:
                lru.append(b)

    def free_many(self, blocks: Iterable[int]) -> None:
        # The base class's loop with the release inlined: freeing a finished request's whole
        # table is the hottest path of prefix caching after append_slot.
        ref, hashes, free, lru = self._ref, self._block_hash, self._free, self._lru
        for b in blocks:
            r = ref[b]
            if r == 0:
                self.free(b)  # raises: double free
            ref[b] = r - 1
            if r == 1:
                if hashes[b] is None:
                    free.append(b)
                else:
                    lru.append(b)

    # ---- the hash side ---------------------------------------------------------------------
    def match(self, token_ids: list[int], block_size: int, max_hits: int
              ) -> tuple[list[int], list[int], list[tuple[int, ...]], list[int]]:
        """For every full block of ``token_ids``: its chain hash and its token tuple; and the
        cached blocks of the longest verified run from the start (at most ``max_hits``), with
        their serials (for ``register_run``).
        Nothing is changed. This loop runs for every block of every prompt, so it is written
        with local names; the test is the one in the module docstring."""
        hash_fn, get = self.hash_fn, self._table.get
        tokens_of, parent_of, serial = self._block_tokens, self._block_parent, self._serial
        # The full blocks' token tuples, the partial tail left out: zip takes BS items at a time
        # from one shared iterator and stops when a tuple cannot be completed (the "grouper"
        # recipe of the itertools docs; one C loop instead of a slice per block).
        chunks = list(zip(*[iter(token_ids)] * block_size))
        # Every full block needs its chain hash anyway (to be cached later), so compute them
        # all in one tight loop first, then look them up.
        hashes: list[int] = []
        parent = ROOT_HASH
        if hash_fn is default_block_hash:  # the same hash, minus a Python call per block
            for chunk in chunks:
                parent = hash((parent, chunk))
                hashes.append(parent)
        else:
            for chunk in chunks:
                parent = hash_fn(parent, chunk)
                hashes.append(parent)
        hits: list[int] = []
        serials: list[int] = []  # per hit: the serial standing for the prefix through it
        parent_serial = ROOT_SERIAL
        # The unbroken run of verified hits; ``map(get, ...)`` is lazy, so the lookups stop
        # at the first miss.
        for block, chunk in zip(map(get, hashes[:max_hits]), chunks):
            if (block is None or tokens_of[block] != chunk
                    or parent_of[block] != parent_serial):
                break
            hits.append(block)
            parent_serial = serial[block]
            serials.append(parent_serial)
        return hits, hashes, chunks, serials

    def register_block(self, block: int, h: int, parent_serial: int,
                       token_ids: tuple[int, ...]) -> int:
        """Record that ``block`` (in use, just full) holds ``token_ids`` after the prefix that
        ``parent_serial`` stands for, under chain hash ``h``. Returns the serial that now
        stands for the prefix *including* this block, for the next block to chain from: this
        block's own, or that of an equal block cached earlier (then this one stays private),
        or BROKEN when a different prefix holds the hash (the chain stops being cached)."""
        if parent_serial == BROKEN:
            return BROKEN
        other = self._table.get(h)
        if other is None:
            if self._block_hash[block] is not None:
                return BROKEN  # a block carries one hash
            self._table[h] = block
            self._block_hash[block] = h
            self._block_parent[block] = parent_serial
            self._block_tokens[block] = token_ids
            return self._serial[block]
        if self._block_tokens[other] == token_ids and self._block_parent[other] == parent_serial:
            return self._serial[other]  # the same prefix, computed twice: keep the first
        return BROKEN

    def register_next(self, block: int, hashes: list[int], serials: list[int],
                      token_ids: tuple[int, ...]) -> None:
        """A sequence's last block ``block`` just became full with ``token_ids``: append its
        chain hash to the sequence's ``hashes`` and the serial standing for its prefix to
        ``serials`` (``register_block``, common case inlined: this runs every BS appends)."""
        parent = hashes[-1] if hashes else ROOT_HASH
        h = (hash((parent, token_ids)) if self.hash_fn is default_block_hash
             else self.hash_fn(parent, token_ids))
        hashes.append(h)
        parent_serial = serials[-1] if serials else ROOT_SERIAL
        table, block_hash = self._table, self._block_hash
        if parent_serial != BROKEN and h not in table and block_hash[block] is None:
            table[h] = block
            block_hash[block] = h
            self._block_parent[block] = parent_serial
            self._block_tokens[block] = token_ids
            serials.append(self._serial[block])
        else:
            serials.append(self.register_block(block, h, parent_serial, token_ids))

    def register_run(self, blocks: list[int], hashes: list[int],
                     chunks: list[tuple[int, ...]], start: int,
                     hit_serials: list[int] | None = None) -> list[int]:
        """``register_block`` for blocks[i], i >= start, chained; returns the serial standing
        for each prefix 0..i (the first ``start`` are hits: their own serials, which the
        caller may pass in as ``hit_serials`` when ``match`` already read them)."""
        serial, table, block_hash = self._serial, self._table, self._block_hash
        parent_of, tokens_of = self._block_parent, self._block_tokens
        serials = (hit_serials if hit_serials is not None
                   else [serial[b] for b in blocks[:start]])
        parent = serials[-1] if serials else ROOT_SERIAL
        for i in range(start, len(hashes)):
            h, b = hashes[i], blocks[i]
            if parent != BROKEN and h not in table and block_hash[b] is None:
                table[h] = b  # the common case of register_block, inlined (one call a prompt)
                block_hash[b] = h
                parent_of[b] = parent
                tokens_of[b] = chunks[i]
                parent = serial[b]
            else:
                parent = self.register_block(b, h, parent, chunks[i])
            serials.append(parent)
        return serials

    def touch(self, block: int) -> None:
        """A new user of a cached block: out of the LRU queue if it sat there (O(1))."""
        self.touch_all([block])

    def touch_all(self, blocks: list[int]) -> None:
        ref, stale = self._ref, self._stale
        for b in blocks:
            if ref[b] == 0:  # it sits in the LRU queue: O(1) removal from the middle, lazily
                stale[b] += 1
                self._num_stale += 1
            ref[b] += 1
        if self._num_stale > 32 and 2 * self._num_stale > len(self._lru):
            self._compact()

    def _compact(self) -> None:
        """Rebuild the queue without its stale entries. Runs only when they outnumber the live
        ones, so its O(len) cost is paid for by the hits that made them: O(1) amortized."""
        stale, keep = self._stale, []
        for b in self._lru:
            if stale[b]:
                stale[b] -= 1  # every stale entry is in the queue: this zeroes every count
            else:
                keep.append(b)
        self._lru = deque(keep)
        self._num_stale = 0

    def serial(self, block: int) -> int:
        """The allocation serial of a block (see ``__init__``)."""
        return self._serial[self._check_block(block)]

    def block_hash(self, block: int) -> int | None:
        return self._block_hash[self._check_block(block)]

    def block_token_ids(self, block: int) -> tuple[int, ...] | None:
        return self._block_tokens[self._check_block(block)]

    def cached_blocks(self) -> dict[int, int]:
        """A copy of the hash -> block table."""
        return dict(self._table)

    def check_invariants(self) -> None:
        free, lru = self._free, self.lru_blocks()
        assert self._num_stale == sum(self._stale) >= 0, "stale entry count"
        assert len(lru) == len(self._lru) - self._num_stale, "a stale count without an entry"
        assert len(set(free) | set(lru)) == len(free) + len(lru), "a block is free twice"
        for b in free:
            assert self._ref[b] == 0 and self._block_hash[b] is None, f"clean free block {b}"
        for b in lru:
            assert self._ref[b] == 0 and self._block_hash[b] is not None, f"LRU block {b}"
        in_use = sum(1 for r in self._ref if r > 0)
        assert min(self._ref) >= 0, "negative reference count"
        assert in_use + len(free) + len(lru) == self.num_blocks, "free + used != total"
        for h, b in self._table.items():
            assert self._block_hash[b] == h, f"table maps hash to block {b} holding another"
