"""What a picture shows, read from the managers' own state: the demo's rule against lying.

Every picture of the demo is drawn from a *view*: a frozen snapshot read out of a real
``KVCacheManager`` or ``ContiguousKVCache`` through their public methods, at the moment the frame
is made. Nothing in a picture comes from what a scene *expected* to happen.
``tests/test_demo_consistency.py`` re-reads the managers at every frame of every scene and checks
each view against them; ``tests/test_viz.py`` parses the drawn text back and checks it against
the view. Views are plain data, so the drawing code (``blocks.py``, ``arena.py``) never touches
a manager.

The slot categories are the paper's (Fig. 2, ``contiguous/usage.py``), one definition for both
caches: *reserved* slots are set aside for tokens the request will still produce; *internal
fragmentation* is set aside but will never be used (beyond the request's final length).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from minipaged.contiguous.buddy import next_pow2
from minipaged.contiguous.usage import CATEGORIES, KVUsage

Slots = list[tuple[str, Hashable | None]]  # one (category, owning seq_id) per slot


def _category(pos: int, num_tokens: int, final_len: int | None) -> str:
    if pos < num_tokens:
        return "token"
    if final_len is not None and pos < final_len:
        return "reserved"
    return "internal_fragmentation"


@dataclass(frozen=True)
class TableView:
    """One sequence's block table: logical block i lives in physical block ``blocks[i]``."""

    seq_id: Hashable
    blocks: tuple[int, ...]
    seq_len: int
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class BlockView:
    """One physical block. state: "used" (in a block table), "cached" (free, but findable by its
    hash in the prefix cache), "held" (in no table but not free: the source of a copy-on-write
    not yet taken) or "free"."""

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
    swapped: tuple[TableView, ...] = ()  # sequences in the CPU pool, with their CPU blocks
    copies: tuple[tuple[int, int], ...] = ()
    hashed: frozenset[int] = frozenset()  # blocks the prefix cache holds a hash of (any state)

    def slot_categories(self, final_lens: Mapping[Hashable, int] | None = None) -> Slots:
        """Each of the NB * BS slots as (category, owner), the way the manager's ``usage`` counts:
        the unfilled tail of a last block is reserved up to the final length and internal
        fragmentation beyond it. A shared block is drawn once, for its first owner."""
        bs = self.block_size
        slots: Slots = [("free", None)] * (self.num_blocks * bs)
        for t in self.tables:
            final = None if final_lens is None else final_lens.get(t.seq_id)
            for i, b in enumerate(t.blocks):
                if slots[b * bs][1] is None:
                    for off in range(bs):
                        slots[b * bs + off] = (_category(i * bs + off, t.seq_len, final),
                                               t.seq_id)
        return slots


def read_pool(manager, *, copies: Iterable[tuple[int, int]] = ()) -> PoolView:
    """Snapshot a ``KVCacheManager`` through its public methods. ``copies``: the copy-on-write
    pairs the scene took with ``take_copies()`` this step (gone from the manager once taken)."""
    bs, copies = manager.block_size, tuple(copies)
    swapped = set(manager.swapped_seq_ids)
    tables = tuple(TableView(s, tuple(manager.block_table(s)), manager.seq_len(s),
                             tuple(manager.token_ids(s)))
                   for s in manager.seq_ids if s not in swapped)
    owners: dict[int, list[Hashable]] = {}
    filled: dict[int, int] = {}
    for t in tables:
        for i, b in enumerate(t.blocks):
            owners.setdefault(b, []).append(t.seq_id)
            filled[b] = max(filled.get(b, 0), min(bs, t.seq_len - i * bs))
    cached_blocks = getattr(manager.allocator, "cached_blocks", None)  # prefix caching only
    cached = frozenset(cached_blocks().values()) if cached_blocks else frozenset()
    copy_src = {dst: src for src, dst in copies}
    blocks = []
    for b in range(manager.num_blocks):
        ref = manager.ref_count(b)
        state = ("used" if b in owners else "held" if ref > 0 else
                 "cached" if b in cached else "free")
        fill = bs if state == "cached" else filled.get(b, 0)  # only full blocks get a hash
        blocks.append(BlockView(b, state, tuple(owners.get(b, ())), ref, fill, copy_src.get(b)))
    swapped_views = tuple(TableView(s, tuple(manager.cpu_block_table(s)), manager.seq_len(s),
                                    tuple(manager.token_ids(s))) for s in manager.swapped_seq_ids)
    return PoolView(manager.num_blocks, bs, manager.num_free_blocks, tuple(blocks), tables,
                    swapped_views, copies, cached)


@dataclass(frozen=True)
class Reservation:
    """One request's contiguous region: slots [offset, offset + held)."""

    seq_id: Hashable
    offset: int
    held: int  # slots the buddy allocator holds for it (>= the policy's reservation)
    num_tokens: int  # tokens written so far
    final_len: int  # the request's final length


@dataclass(frozen=True)
class ArenaView:
    """A ``ContiguousKVCache``: its reservations, its free buddy blocks and its own usage report.
    ``need``: the region size ``usage(need)`` was asked about (the next waiting request's)."""

    policy: str
    num_slots: int
    need: int
    reservations: tuple[Reservation, ...]
    free_blocks: tuple[tuple[int, int], ...]  # (offset, slots)
    usage: KVUsage

    def slot_categories(self) -> Slots:
        """Each slot as (category, owner), the way ``ContiguousKVCache.usage`` counts: in a
        region, token / reserved / internal fragmentation by position; a free slot is external
        fragmentation when its free buddy block is smaller than the aligned power-of-two block
        a region of ``need`` slots must be cut from (``contiguous/buddy.py``)."""
        slots: Slots = [("free", None)] * self.num_slots
        for r in self.reservations:
            for i in range(r.held):
                slots[r.offset + i] = (_category(i, r.num_tokens, r.final_len), r.seq_id)
        for off, n in self.free_blocks:
            if n < next_pow2(self.need):
                slots[off:off + n] = [("external_fragmentation", None)] * n
        return slots


def read_arena(cache, need: int | None = None) -> ArenaView:
    """Snapshot a ``ContiguousKVCache`` through its public methods."""
    rs = []
    for s in cache.seq_ids:
        r = cache.reservation(s)
        rs.append(Reservation(s, r.offset, r.held, r.num_tokens, r.final_len))
    need = cache.max_seq_len if need is None else need
    return ArenaView(cache.policy, cache.num_slots, need, tuple(rs),
                     tuple(cache.allocator.free_blocks()), cache.usage(need))


def count_categories(slots: Iterable[tuple[str, Hashable | None]]) -> dict[str, int]:
    counts = dict.fromkeys(CATEGORIES, 0)
    for cat, _ in slots:
        counts[cat] += 1
    return counts
