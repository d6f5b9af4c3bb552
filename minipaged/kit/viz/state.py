"""What a picture shows, read from the managers' own state: the demo's rule against lying.

Every picture of the demo is drawn from a *view*: a frozen snapshot read out of the real
``KVCacheManager`` or ``ContiguousKVCache`` through their public methods, at the moment the
frame is made. Nothing in a picture comes from what a scene *expected* to happen. The tests
(``tests/test_demo_consistency.py``) re-read the managers at every frame of every scene and
check that each view says exactly what the manager says (owners, reference counts, free counts,
usage), and ``tests/test_viz.py`` parses the drawn text back and checks it says what the view says.

Views are plain data, so the renderables in ``blocks.py`` / ``arena.py`` never touch a manager.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from minipaged.contiguous.usage import CATEGORIES, KVUsage


@dataclass(frozen=True)
class TableView:
    """One sequence's block table: logical block i lives in physical block ``blocks[i]``."""

    seq_id: Hashable
    blocks: tuple[int, ...]
    seq_len: int
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class BlockView:
    """One physical block of the pool.

    state: "used" (in at least one block table), "cached" (free, but still findable by its
    hash in the prefix cache), "held" (in no table but not free: kept as the source of a
    copy-on-write not yet taken) or "free".
    """

    block: int
    state: str
    owners: tuple[Hashable, ...]
    ref_count: int
    filled: int  # slots holding a token, 0 .. BS
    copy_from: int | None = None  # copy-on-write source, when this block was a destination


@dataclass(frozen=True)
class PoolView:
    """The paged pool of one ``KVCacheManager``: every physical block and every block table."""

    num_blocks: int
    block_size: int
    num_free: int  # as the manager reports it (num_free_blocks)
    blocks: tuple[BlockView, ...]
    tables: tuple[TableView, ...]
    swapped: tuple[TableView, ...] = ()  # sequences whose blocks sit in the CPU pool
    copies: tuple[tuple[int, int], ...] = ()

    def table(self, seq_id: Hashable) -> TableView:
        for t in self.tables:
            if t.seq_id == seq_id:
                return t
        raise KeyError(f"seq_id={seq_id!r} has no block table in this view")

    def slot_categories(self, final_lens: Mapping[Hashable, int] | None = None
                        ) -> list[tuple[str, Hashable | None]]:
        """Each of the NB * BS slots as (category, owning seq_id), the way ``usage`` counts them.

        A slot of an owned block is "token" below the sequence's length, "reserved" below its
        final length, and "internal_fragmentation" beyond it. A shared block belongs to its first
        owner here (the memory is counted once). A paged pool has no external fragmentation."""
        bs = self.block_size
        slots: list[tuple[str, Hashable | None]] = [("free", None)] * (self.num_blocks * bs)
        for t in self.tables:
            final = None if final_lens is None else final_lens.get(t.seq_id)
            for i, b in enumerate(t.blocks):
                if slots[b * bs][1] is not None:
                    continue  # shared block, already drawn for an earlier owner
                for off in range(bs):
                    pos = i * bs + off
                    if pos < t.seq_len:
                        cat = "token"
                    elif final is not None and pos < final:
                        cat = "reserved"
                    else:
                        cat = "internal_fragmentation"
                    slots[b * bs + off] = (cat, t.seq_id)
        return slots


def _cached_blocks(manager: object) -> set[int]:
    """Free blocks that still carry a prefix-cache hash (prefix caching only): reference count 0
    and a hash the allocator still remembers, so a later prompt can hit them."""
    alloc = getattr(manager, "allocator", None)
    block_hash = getattr(alloc, "block_hash", None)
    if not callable(block_hash):
        return set()
    return {b for b in range(manager.num_blocks)
            if manager.ref_count(b) == 0 and block_hash(b) is not None}


def read_pool(manager, *, copies: Iterable[tuple[int, int]] = ()) -> PoolView:
    """Snapshot a ``KVCacheManager`` through its public methods.

    ``copies`` are the copy-on-write pairs the scene took with ``take_copies()`` this step (they
    are gone from the manager once taken, so the scene hands them over). Sequences swapped out
    to the CPU pool (``swapped_seq_ids``) are listed apart, with their CPU block tables."""
    swapped = tuple(getattr(manager, "swapped_seq_ids", ()))
    swapped_set = set(swapped)
    bs = manager.block_size
    tables = []
    for seq_id in manager.seq_ids:
        if seq_id in swapped_set:
            continue
        tables.append(TableView(seq_id, tuple(manager.block_table(seq_id)),
                                manager.seq_len(seq_id), tuple(manager.token_ids(seq_id))))
    owners: dict[int, list[Hashable]] = {}
    filled: dict[int, int] = {}
    for t in tables:
        for i, b in enumerate(t.blocks):
            owners.setdefault(b, []).append(t.seq_id)
            filled[b] = max(filled.get(b, 0), min(bs, t.seq_len - i * bs))
    copy_src = {dst: src for src, dst in copies}
    cached = _cached_blocks(manager)
    blocks = []
    for b in range(manager.num_blocks):
        if b in owners:
            state = "used"
        elif manager.ref_count(b) > 0:
            state = "held"
        elif b in cached:
            state = "cached"
        else:
            state = "free"
        # A cached block is always full: only full blocks get a hash.
        fill = bs if state == "cached" else filled.get(b, 0)
        blocks.append(BlockView(b, state, tuple(owners.get(b, ())), manager.ref_count(b),
                                fill, copy_src.get(b)))
    swapped_views = tuple(
        TableView(s, tuple(_cpu_table(manager, s)), manager.seq_len(s),
                  tuple(manager.token_ids(s)))
        for s in swapped)
    return PoolView(manager.num_blocks, bs, manager.num_free_blocks, tuple(blocks),
                    tuple(tables), swapped_views, tuple(copies))


def _cpu_table(manager, seq_id: Hashable) -> list[int]:
    return list(manager.cpu_block_table(seq_id))


@dataclass(frozen=True)
class Reservation:
    """One request's contiguous region: slots [offset, offset + held)."""

    seq_id: Hashable
    offset: int
    held: int  # slots the buddy allocator holds for it (>= size)
    size: int  # slots the policy reserved
    num_tokens: int  # tokens written so far
    final_len: int  # the request's final length


@dataclass(frozen=True)
class ArenaView:
    """A ``ContiguousKVCache``: its reservations, its free buddy blocks and its own usage report.

    ``need`` is the region size the cache's ``usage(need)`` was asked about: free blocks too small
    to hold a region of that size are external fragmentation."""

    policy: str
    num_slots: int
    need: int
    reservations: tuple[Reservation, ...]
    free_blocks: tuple[tuple[int, int], ...]  # (offset, slots)
    usage: KVUsage

    def slot_categories(self) -> list[tuple[str, Hashable | None]]:
        """Each slot as (category, owning seq_id), the way ``ContiguousKVCache.usage`` counts:
        in a region, token below num_tokens, reserved below final_len, internal fragmentation
        up to what the allocator holds; a free slot is external fragmentation when its free
        block is smaller than the buddy block a region of ``need`` slots must be cut from."""
        slots: list[tuple[str, Hashable | None]] = [("free", None)] * self.num_slots
        for r in self.reservations:
            for i in range(r.held):
                if i < r.num_tokens:
                    cat = "token"
                elif i < r.final_len:
                    cat = "reserved"
                else:
                    cat = "internal_fragmentation"
                slots[r.offset + i] = (cat, r.seq_id)
        smallest_usable = 1 << max(0, self.need - 1).bit_length()  # next power of two of need
        for off, n in self.free_blocks:
            if n < smallest_usable:
                for i in range(off, off + n):
                    slots[i] = ("external_fragmentation", None)
        return slots


def read_arena(cache, need: int | None = None) -> ArenaView:
    """Snapshot a ``ContiguousKVCache`` through its public methods."""
    rs = []
    for s in cache.seq_ids:
        r = cache.reservation(s)
        rs.append(Reservation(s, r.offset, r.held, r.size, r.num_tokens, r.final_len))
    need = cache.max_seq_len if need is None else need
    return ArenaView(cache.policy, cache.num_slots, need, tuple(rs),
                     tuple(cache.allocator.free_blocks()), cache.usage(need))


def count_categories(slots: Iterable[tuple[str, Hashable | None]]) -> dict[str, int]:
    counts = dict.fromkeys(CATEGORIES, 0)
    for cat, _ in slots:
        counts[cat] += 1
    return counts
