"""Where the KV cache memory goes: the four categories of the vLLM paper's Figure 2, plus free.

Lessons 02 and 03 report memory in these terms, so a contiguous and a paged cache compare slot
for slot. Every slot (one token's K and V, one layer) is in exactly one category:

    token                   holds the K/V of a token that exists now
    reserved                set aside for a token the request will produce later
    internal_fragmentation  set aside for the request, which finishes before using it
    external_fragmentation  free but unusable for a contiguous reservation (0 when paged)
    free                    free and usable

The paper (Fig. 2) measured 20.4-38.2% of the cache holding token states in systems
that reserve contiguously; vLLM about 96%. Read next: ``contiguous/buddy.py``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

CATEGORIES = ("token", "reserved", "internal_fragmentation", "external_fragmentation", "free")


@dataclass(frozen=True)
class KVUsage:
    """Slot counts per category at one moment. The five counts always add up to ``total``."""

    total: int
    token: int
    reserved: int
    internal_fragmentation: int
    external_fragmentation: int
    free: int

    def __post_init__(self) -> None:
        counts = [getattr(self, c) for c in CATEGORIES]
        if min(counts) < 0 or sum(counts) != self.total:
            raise ValueError(f"usage categories {dict(zip(CATEGORIES, counts))} must be "
                             f">= 0 and add up to total={self.total}")

    @property
    def used(self) -> int:
        """Slots that are not plainly free: everything the requests cost."""
        return self.total - self.free

    def fractions(self) -> dict[str, float]:
        """Each category as a fraction of all slots (they add up to 1)."""
        t = max(self.total, 1)
        return {c: getattr(self, c) / t for c in CATEGORIES}

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def __add__(self, other: KVUsage) -> KVUsage:
        # Lesson 02 and the fragmentation scene sum snapshots: an average, each weighing the same.
        return KVUsage(**{f: getattr(self, f) + getattr(other, f) for f in ("total", *CATEGORIES)})
