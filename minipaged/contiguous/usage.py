"""Where the KV cache memory goes: the four categories of the vLLM paper's Figure 2.

Lesson 02 (contiguous cache) and lesson 03 (paged cache) both report memory in these terms, so
that the two can be compared slot for slot. Read next: ``contiguous/buddy.py``.

Every slot of KV cache memory (one token's K and V, for one layer) is in exactly one category:

    token                   holds the K/V of a token that exists now
    reserved                set aside for a token the request will produce later
    internal_fragmentation  set aside for the request but will never hold a token
                            (the request finishes before reaching it)
    external_fragmentation  free, but not usable: it is not part of the largest free region, so
                            a contiguous reservation cannot use it (always 0 for a paged cache,
                            because any free block serves any sequence)
    free                    free and usable

The paper (section 3, Fig. 2, OPT-13B on ShareGPT) measured that only 20.4% to 38.2% of the KV
cache held token states in systems that reserve contiguous memory; vLLM reached about 96%.
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
        # Summing snapshots is how a simulator builds a time average (divide the fractions
        # of the sum, not the average of fractions, so that every snapshot weighs the same).
        a, b = asdict(self), asdict(other)
        return KVUsage(**{k: a[k] + b[k] for k in a})
