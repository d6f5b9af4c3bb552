"""A contiguous KV cache with Orca-style reservations, and where its memory goes.

What this teaches: the problem PagedAttention solves (vLLM paper, section 3 and Fig. 2). Before
vLLM, a serving system kept each request's K/V in ONE contiguous region, reserved at admission,
because attention kernels wanted K/V as one dense [T, Hkv, D] array. The final length is unknown
then, so a *policy* sizes the region (the paper's Orca baselines, section 6.1), for a request of
P prompt tokens that will end with F tokens:

    max     max_seq_len slots for every request                               (Orca (Max))
    pow2    P + next_pow2(F - P): the output rounded up to a power of two ("over-reserves the
            space for outputs by at most 2x"), at most max_seq_len            (Orca (Pow2))
    oracle  exactly F (needs to know the future)                              (Orca (Oracle))

Regions are placed by the buddy allocator of ``buddy.py``; a request owning [off, off + n) keeps
token t at slot off + t of ``key_arena`` / ``value_arena`` (each [num_slots, Hkv, D]), so
``kv(seq_id)`` is a plain slice that dense attention reads with no gather: what contiguity buys.
Read next: ``paged/block_allocator.py`` (stage 3, lesson 03), where the same memory is paged.

``usage()`` puts every slot in a category of ``usage.py``. For a request with n tokens written,
final length F, a reservation of R slots and H slots held by the allocator:

    token                    n
    reserved                 F - n
    internal_fragmentation   H - F: R - F the policy's over-reservation, H - R the allocator's
                             rounding (``breakdown()`` splits the two)
    external_fragmentation   free slots in buddy blocks smaller than next_pow2(need), the block
                             a region of ``need`` slots must be cut from (default max_seq_len)
    free                     the other free slots

"Free but not allocatable" only means something for a region of a given size, so a scheduler passes
its next waiting request's ``reservation_size`` as ``need``; when that one does not fit, every free
slot is external fragmentation: minipaged's reading of the paper's "external fragmentation &
others" bar (Fig. 2), whose accounting is not published. ``exact_fit=True`` (the default) gives
each buddy block's unused tail back, so the policies differ only in what they reserve (H = R);
``exact_fit=False`` keeps the power-of-two rounding (H = next_pow2(R)). ``store_kv=False`` keeps
only the accounting (``advance``, not ``write``).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, replace

import numpy as np

from minipaged._checks import check_bool, check_choice, check_dtype, check_int, check_seq_id
from minipaged.contiguous.buddy import BuddyAllocator, OutOfMemoryError, next_pow2
from minipaged.contiguous.usage import KVUsage

POLICIES = ("max", "pow2", "oracle")

__all__ = ["POLICIES", "ContiguousKVCache", "OutOfMemoryError", "Reservation"]


@dataclass(slots=True)
class Reservation:
    """One live request: its region [offset, offset + held) and lengths (slots)."""

    offset: int
    prompt_len: int
    final_len: int  # F: tokens the request will have when it finishes
    size: int  # R: what the policy reserved
    held: int  # H: what the allocator holds (>= size)
    num_tokens: int = 0  # n: tokens whose K/V are in the cache now


class ContiguousKVCache:
    """Per-request contiguous K/V regions in one arena of ``num_slots`` slots."""

    def __init__(self, num_slots: int, num_kv_heads: int, head_size: int, *,
                 policy: str = "max", max_seq_len: int = 2048, dtype: object = np.float32,
                 exact_fit: bool = True, store_kv: bool = True) -> None:
        check_choice("policy", policy, POLICIES)
        self.allocator = BuddyAllocator(num_slots)
        self.num_slots = self.allocator.num_slots
        self.num_kv_heads = check_int("num_kv_heads", num_kv_heads, low=1)
        self.head_size = check_int("head_size", head_size, low=1)
        self.max_seq_len = check_int("max_seq_len", max_seq_len, low=1, high=self.num_slots + 1)
        largest_block = 1 << self.allocator.max_order
        if next_pow2(self.max_seq_len) > largest_block:
            raise ValueError(
                f"num_slots={num_slots} cannot place even one max_seq_len={max_seq_len} request: "
                f"that needs a buddy block of {next_pow2(self.max_seq_len)} slots and the "
                f"largest one is {largest_block}; raise num_slots or lower max_seq_len")
        self.exact_fit = check_bool("exact_fit", exact_fit)
        self.store_kv = check_bool("store_kv", store_kv)
        self.policy, self.dtype = policy, check_dtype("dtype", dtype)
        if self.store_kv:  # [num_slots, Hkv, D] each; zeros so a fresh arena is deterministic
            shape = (self.num_slots, self.num_kv_heads, self.head_size)
            self.key_arena = np.zeros(shape, self.dtype)
            self.value_arena = np.zeros(shape, self.dtype)
        self._seqs: dict[Hashable, Reservation] = {}

    # ---- policy -------------------------------------------------------------------------------
    def reservation_size(self, prompt_len: int, final_len: int) -> int:
        """Slots the policy reserves, at most max_seq_len. pow2 rounds the output only:
        prompt 100 + output 25 -> 100 + 32 = 132."""
        final_len = check_int("final_len", final_len, low=1, high=self.max_seq_len + 1)
        prompt_len = check_int("prompt_len", prompt_len, low=1, high=final_len + 1)
        if self.policy == "max":
            return self.max_seq_len
        if self.policy == "pow2":
            output = final_len - prompt_len  # no output, nothing to round
            return min(prompt_len + (next_pow2(output) if output > 0 else 0), self.max_seq_len)
        return final_len

    def can_reserve(self, prompt_len: int, final_len: int) -> bool:
        """True when ``reserve`` with these lengths would succeed now."""
        return self.allocator.can_alloc(self.reservation_size(prompt_len, final_len))

    def reserve(self, seq_id: Hashable, prompt_len: int, final_len: int) -> int:
        """Reserve a new request's region; return its offset. OutOfMemoryError (the cache
        unchanged) when no free region fits; ValueError for a live ``seq_id`` or bad lengths."""
        size = self.reservation_size(prompt_len, final_len)
        if check_seq_id("seq_id", seq_id, new=True) in self._seqs:
            raise ValueError(f"seq_id={seq_id!r} already holds a reservation; release it first")
        try:
            offset = self.allocator.alloc(size, exact=self.exact_fit)
        except OutOfMemoryError as e:
            raise OutOfMemoryError(e.needed, e.largest_free, e.num_free,
                                   f" reserving seq_id={seq_id!r} (policy {self.policy})") from None
        held = self.allocator.held(offset)
        self._seqs[seq_id] = Reservation(offset, int(prompt_len), int(final_len), size, held)
        return offset

    # ---- tokens -------------------------------------------------------------------------------
    def _get(self, seq_id: Hashable) -> Reservation:
        r = self._seqs.get(check_seq_id("seq_id", seq_id))
        if r is None:
            live = list(self._seqs)[:8]
            raise ValueError(f"unknown seq_id={seq_id!r}: no live reservation (live: {live})")
        return r

    def _grow(self, seq_id: Hashable, r: Reservation, t: int, verb: str) -> None:
        if r.num_tokens + t > r.final_len:
            raise ValueError(
                f"{verb}(seq_id={seq_id!r}) of {t} tokens would make {r.num_tokens + t} tokens, "
                f"beyond its final_len={r.final_len} (the length its reservation was made for)")
        r.num_tokens += t

    def write(self, seq_id: Hashable, key: np.ndarray, value: np.ndarray) -> None:
        """Append T tokens' K and V (each [T, Hkv, D], the cache's dtype) after the ones there."""
        if not self.store_kv:
            raise ValueError("write() needs store_kv=True; this cache only keeps accounting "
                             "(use advance(seq_id, num_tokens))")
        r = self._get(seq_id)
        want = (self.num_kv_heads, self.head_size)
        for name, a in (("key", key), ("value", value)):
            if not isinstance(a, np.ndarray):
                raise TypeError(f"{name} must be a numpy array, got {type(a).__name__}")
            if a.ndim != 3 or a.shape[1:] != want:
                raise ValueError(f"{name}.shape={a.shape}, expected [T, Hkv, D] = [T, {want[0]}, "
                                 f"{want[1]}]")
            if a.dtype != self.dtype:
                raise TypeError(f"{name}.dtype={a.dtype} but the cache stores {self.dtype}")
        if key.shape[0] != value.shape[0]:
            raise ValueError(f"key has T={key.shape[0]} tokens but value has T={value.shape[0]}")
        t = key.shape[0]
        start = r.offset + r.num_tokens  # token position p lives at slot offset + p
        self._grow(seq_id, r, t, "write")
        self.key_arena[start:start + t] = key  # [T, Hkv, D]
        self.value_arena[start:start + t] = value

    def advance(self, seq_id: Hashable, num_tokens: int = 1) -> None:
        """Accounting only (store_kv=False): the request now has ``num_tokens`` more tokens."""
        if self.store_kv:
            raise ValueError("advance() is for store_kv=False caches; this one stores K/V, "
                             "so add tokens with write(seq_id, key, value)")
        self._grow(seq_id, self._get(seq_id), check_int("num_tokens", num_tokens, low=0), "advance")

    def kv(self, seq_id: Hashable) -> tuple[np.ndarray, np.ndarray]:
        """The request's logical K and V, read-only views [T, Hkv, D] (T tokens written)."""
        if not self.store_kv:
            raise ValueError("kv() needs store_kv=True; this cache keeps no K/V")
        r = self._get(seq_id)
        k = self.key_arena[r.offset:r.offset + r.num_tokens]  # [T, Hkv, D], a view
        v = self.value_arena[r.offset:r.offset + r.num_tokens]
        k.flags.writeable = v.flags.writeable = False  # the views only: the arena stays writable
        return k, v

    def release(self, seq_id: Hashable) -> None:
        """The request finished (or was preempted): give its whole region back."""
        r = self._get(seq_id)
        self.allocator.free(r.offset)
        del self._seqs[seq_id]

    # ---- inspection ---------------------------------------------------------------------------
    @property
    def seq_ids(self) -> list:
        return list(self._seqs)

    def reservation(self, seq_id: Hashable) -> Reservation:
        """A copy of the request's region and lengths."""
        return replace(self._get(seq_id))

    def seq_len(self, seq_id: Hashable) -> int:
        return self._get(seq_id).num_tokens

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    def _usable(self, need: int | None) -> int:
        """Free slots in buddy blocks >= next_pow2(need)."""
        need = self.max_seq_len if need is None else need
        return self.allocator.usable_free(check_int("need", need, low=1, high=self.num_slots + 1))

    def breakdown(self, need: int | None = None) -> dict[str, int]:
        """``usage`` with internal fragmentation split in two: ``internal_policy`` (R - F) and
        ``internal_rounding`` (H - R). The six counts add up to num_slots."""
        rs, usable = self._seqs.values(), self._usable(need)
        return {
            "token": sum(r.num_tokens for r in rs),
            "reserved": sum(r.final_len - r.num_tokens for r in rs),
            "internal_policy": sum(r.size - r.final_len for r in rs),
            "internal_rounding": sum(r.held - r.size for r in rs),
            "external_fragmentation": self.allocator.num_free - usable,
            "free": usable,
        }

    def usage(self, need: int | None = None) -> KVUsage:
        """The paper's categories now, as slot counts (``.fractions()`` for shares); ``need`` as
        in the module docstring."""
        b = self.breakdown(need)
        internal = b.pop("internal_policy") + b.pop("internal_rounding")
        return KVUsage(total=self.num_slots, internal_fragmentation=internal, **b)

    def __repr__(self) -> str:
        return (f"ContiguousKVCache(num_slots={self.num_slots}, policy={self.policy!r}, "
                f"max_seq_len={self.max_seq_len}, live={len(self._seqs)}, "
                f"num_free={self.num_free})")
