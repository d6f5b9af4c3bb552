"""The invariants of every allocator and block manager, asserted: each stage states its invariants
in prose in its module docstring; this file checks them after every step of the tests.

``check_invariants(x)`` takes the contiguous stage's ``BuddyAllocator``, a ``BlockAllocator`` (or
the prefix cache's) or any block manager from ``BlockManager`` up to ``KVCacheManager``, and
asserts what its class and every class below it promise. It reads private state on purpose: the
invariants are about it.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from minipaged._checks import cdiv
from minipaged.contiguous.buddy import BuddyAllocator
from minipaged.paged.block_allocator import BlockAllocator
from minipaged.paged.block_manager import BlockManager
from minipaged.serving.swap import KVCacheManager
from minipaged.sharing.cow import CowBlockManager
from minipaged.sharing.prefix_cache import PrefixCachingBlockAllocator, PrefixCachingBlockManager


def check_invariants(x: BlockAllocator | BlockManager | BuddyAllocator) -> None:
    if isinstance(x, BuddyAllocator):
        check_buddy(x)
    elif isinstance(x, BlockAllocator):
        check_allocator(x)
    elif isinstance(x, BlockManager):
        check_manager(x)
    else:
        raise TypeError(f"no invariants known for {type(x).__name__}")


def check_buddy(a: BuddyAllocator) -> None:
    """contiguous/buddy.py, invariants 1-3, by the slow, obvious route: paint every slot with its
    owner (O(num_slots)) instead of trusting the allocator's own sets and counts."""
    owner = np.zeros(a.num_slots, dtype=np.int8)  # 0 nobody, 1 allocated, 2 free
    regions = [(off, n, 1) for off, n in a.allocations.items()]
    regions += [(off, n, 2) for off, n in a.free_blocks()]
    for off, n, who in regions:
        assert 0 <= off and off + n <= a.num_slots, f"region [{off}, {off + n}) leaves the arena"
        assert not owner[off:off + n].any(), f"region [{off}, {off + n}) overlaps another"
        owner[off:off + n] = who
    for k, offs in enumerate(a._free):
        for off in offs:
            assert off % (1 << k) == 0, f"free block ({off}, order {k}) is misaligned"
            assert k == a.max_order or (off ^ (1 << k)) not in offs, \
                f"free block ({off}, order {k}) and its buddy are not merged"
    assert (owner != 0).all(), f"slot {int(np.argmin(owner))} is neither free nor allocated"
    assert int((owner == 2).sum()) == a.num_free, \
        f"num_free={a.num_free} but {int((owner == 2).sum())} slots are free"


def check_allocator(a: BlockAllocator) -> None:
    """paged/block_allocator.py: a block is free (count 0, in the free list once) or in use
    (count >= 1); free + in use == NB. The prefix cache's queue: unhashed blocks first, and the
    hash table holds exactly the blocks with a hash."""
    free = list(a._free)
    assert len(set(free)) == len(free), "a block is in the free list twice"
    for b in free:
        assert a._ref[b] == 0, f"free block {b} has reference count {a._ref[b]}"
    assert min(a._ref) >= 0, "negative reference count"
    in_use = sum(1 for r in a._ref if r > 0)
    assert in_use + len(free) == a.num_blocks, "free + used != total"
    if isinstance(a, PrefixCachingBlockAllocator):
        queue = [a._hash[b] is not None for b in a._free]
        assert queue == sorted(queue), "a block with a hash is queued before one without"
        held = sorted(b for blocks in a._cached.values() for b in blocks)
        assert held == [b for b in range(a.num_blocks) if a._hash[b] is not None]
        for h, blocks in a._cached.items():
            for b in blocks:
                assert a._hash[b] == h and a._block_tokens[b] is not None, f"block {b}"


def check_manager(m: BlockManager) -> None:
    """Invariants 1-3 of paged/block_manager.py, then those of every later stage m has."""
    check_allocator(m.allocator)
    bs = m.block_size
    for s, table in m._tables.items():
        assert len(table) == cdiv(len(m._tokens[s]), bs), f"seq {s!r}: ceil(len / BS) blocks"
    # Invariant 2: a block's count = the table entries pointing at it (+ copies reading it).
    want = Counter(b for table in m._tables.values() for b in table)
    if isinstance(m, CowBlockManager):
        want.update(m._copies.values())
    for b in range(m.num_blocks):
        got = m.allocator._ref[b]
        assert got == want[b], f"block {b}: reference count {got}, expected {want[b]}"
    if isinstance(m, CowBlockManager):
        _check_cow(m)
    if isinstance(m, PrefixCachingBlockManager) and m.enable_prefix_caching:
        _check_prefix_cache(m)
    if isinstance(m, KVCacheManager):
        _check_swap(m)


def _check_cow(m: CowBlockManager) -> None:
    """sharing/cow.py 1-2: pending reads per source; a copy's destination is in some table and
    is the source of no copy."""
    sources = set(m._copies.values())
    assert m._reads == Counter(m._copies.values()), "pending reads per source"
    for dst in m._copies:
        assert m._table_users(dst) >= 1, f"copy destination {dst} is in no table"
        assert dst not in sources, f"block {dst} is both a copy source and destination"


def _check_prefix_cache(m: PrefixCachingBlockManager) -> None:
    """sharing/prefix_cache.py 3: one chain hash per full block; the computed ones are cached
    under it, with their token ids; the others carry none."""
    bs = m.block_size
    for s, table in m._tables.items():
        hashes, tokens = m._hashes[s], m._tokens[s]
        assert len(hashes) == len(tokens) // bs, f"seq {s!r}: one hash per full block"
        for i, h in enumerate(hashes):
            want = h if i < m._computed[s] // m.block_size else None
            assert m.allocator.block_hash(table[i]) == want, f"seq {s!r}, block {i}"
            assert want is None or m.allocator.block_token_ids(table[i]) == tuple(
                tokens[i * bs:(i + 1) * bs]), f"seq {s!r}, block {i}: cached tokens"


def _check_swap(m: KVCacheManager) -> None:
    """serving/swap.py: a sequence is on the GPU or swapped, never both, and never lost; CPU
    reference counts = the CPU table entries pointing at each block."""
    assert not set(m._swapped) & set(m._tables), "a sequence both swapped and on GPU"
    assert set(m._swapped) | set(m._tables) == set(m._tokens), "a lost sequence"
    if m.cpu_allocator is None:
        assert not m._swapped, "swapped sequences without a CPU pool"
        return
    check_allocator(m.cpu_allocator)
    want = Counter(c for table in m._swapped.values() for c in table)
    for c in range(m.cpu_allocator.num_blocks):
        got = m.cpu_allocator.ref_count(c)
        assert got == want[c], f"CPU block {c}: reference count {got}, {want[c]} table entries"
