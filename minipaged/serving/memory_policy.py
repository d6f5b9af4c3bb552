"""What the scheduler needs from a KV cache, and adapters for the paged and contiguous caches.

What this teaches (lesson 06): the scheduler decides *who* runs, a memory policy *whether there is
room*, so one scheduler compares vLLM's paged cache with the Orca baselines (paper section 6.1):
same requests, same order, same preemption rules; only the memory differs. ``PagedPolicy`` wraps
``KVCacheManager`` with vLLM's *watermark*: admit only while a few free blocks (1%) remain, so
running sequences can grow before anyone is preempted (vLLM v0, ``vllm/core/block_manager_v1.py``,
``watermark_blocks``). ``ContiguousPolicy`` (Orca) reserves each request's whole region at
admission, sized by its policy (max_seq_len, the prompt + next_pow2(output), or exactly the final
length), so it never preempts and cannot share; it keeps accounting only (``store_kv=False``).

Read next: ``serving/queues.py``, then ``serving/scheduler.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Hashable, Mapping
from contextlib import suppress

from minipaged._checks import OutOfBlocksError, cdiv, check_choice, check_float, check_int
from minipaged.contiguous.cache import ContiguousKVCache
from minipaged.contiguous.usage import KVUsage
from minipaged.serving.swap import KVCacheManager

SeqId = Hashable


class MemoryPolicy(ABC):
    """The scheduler's view of a KV cache. ``final_len``: a request's tokens with K/V at its end."""

    name = "abstract"
    supports_sharing = False
    total_slots: int  # token slots of KV memory

    @abstractmethod
    def refusal(self, width: int, final_len: int) -> str | None:
        """Why a request could never run to its end, even alone in an empty cache (or None)."""

    @abstractmethod
    def admit(self, seq_ids: list[SeqId], token_ids: list[list[int]],
              final_len: int) -> list[int] | None:
        """Memory for sequences about to be prefilled, all or nothing: per sequence the tokens
        already cached (prefix caching), or None when there is no room."""

    @abstractmethod
    def can_append(self, seq_ids: list[SeqId]) -> bool:
        """Room for one more token in each of ``seq_ids`` (a whole group, before any append)."""

    @abstractmethod
    def append_slot(self, seq_id: SeqId, token_id: int) -> None: ...

    @abstractmethod
    def free(self, seq_id: SeqId) -> None: ...  # finished, dropped or preempted by recompute

    @abstractmethod
    def usage(self, final_lens: Mapping[SeqId, int],
              next_request: tuple[int, int] | None) -> KVUsage:
        """KV memory by category now: the paper's four (Fig. 2) plus free. ``next_request``:
        (tokens, final length) of the next waiting request, which external fragmentation needs."""

    @abstractmethod
    def blocks_in_use(self) -> int: ...  # physical blocks (paged) or slots (contiguous)

    def no_sharing(self) -> str:
        return (f"the {self.name} policy cannot share memory between sequences "
                "(parallel sampling and beam search need --policy paged)")

    def fork(self, parent_id: SeqId, child_id: SeqId) -> None:
        raise ValueError(self.no_sharing())

    def take_copies(self) -> list[tuple[int, int]]:
        return []

    def computed(self, seq_id: SeqId, num_tokens: int) -> None:  # noqa: B027 - optional hook
        """The sequence's first ``num_tokens`` tokens get K/V this step (a prefill chunk)."""

    def can_swap_out(self, seq_ids: list[SeqId]) -> bool:
        return False  # swap_out, can_swap_in, can_ever_swap_in, swap_in exist where it can be True

    def describe(self) -> str:
        """The numbers a stuck scheduler reports."""
        return f"{self.name}, {self.blocks_in_use()} of {self.total_slots} slots in use"


class PagedPolicy(MemoryPolicy):
    """vLLM: ``KVCacheManager`` blocks, allocated on demand, with a watermark for admissions."""

    supports_sharing = True

    def __init__(self, manager: KVCacheManager, *, watermark: float = 0.01) -> None:
        watermark = check_float("watermark", watermark, low=0.0)
        if watermark >= 1:
            raise ValueError(f"watermark={watermark} is out of range: expected in [0, 1)")
        self.manager = manager
        self.block_size = manager.block_size
        self.watermark_blocks = int(watermark * manager.num_blocks)
        self.name = f"paged (block {manager.block_size})"
        self.total_slots = manager.num_blocks * manager.block_size

    def refusal(self, width, final_len):
        # The worst case: every sequence at its final length, sharing nothing (a recompute
        # re-prefills each one on its own), admitted with the watermark still free.
        need = width * cdiv(final_len, self.block_size)
        room = self.manager.num_blocks - self.watermark_blocks
        if need <= room:
            return None
        minus = f" minus a watermark of {self.watermark_blocks}" if self.watermark_blocks else ""
        return (f"needs up to {need} blocks ({width} sequence(s) of up to {final_len} tokens, "
                f"block_size={self.block_size}) but num_blocks={self.manager.num_blocks}{minus}")

    def admit(self, seq_ids, token_ids, final_len):
        m = self.manager
        # Without prefix caching the need is exact; with it, hits only lower it, so allocate and
        # let the manager refuse (all or nothing).
        need = sum(cdiv(len(t), self.block_size) for t in token_ids)
        if not m.enable_prefix_caching and m.num_free_blocks - need < self.watermark_blocks:
            return None
        cached: list[int] = []
        with suppress(OutOfBlocksError):
            for sid, toks in zip(seq_ids, token_ids):
                cached.append(m.allocate(sid, toks, cache=False))  # cached as computed
        if len(cached) == len(seq_ids) and m.num_free_blocks >= self.watermark_blocks:
            return cached
        for sid in seq_ids[:len(cached)]:  # all or nothing (and the watermark kept free)
            m.free(sid)
        return None

    def can_append(self, seq_ids):
        # vLLM v0's rule (``block_manager_v1.py``, ``can_append_slots``): one free block per
        # sequence is enough (a token takes at most one new block). Where vLLM would preempt,
        # the manager's exact count gets the last word (a last block with room needs none).
        m = self.manager
        return len(seq_ids) <= m.num_free_blocks or m.can_append_slots(seq_ids)

    def append_slot(self, seq_id, token_id):
        self.manager.append_slot(seq_id, token_id)

    def fork(self, parent_id, child_id):
        self.manager.fork(parent_id, child_id)

    def free(self, seq_id):
        self.manager.free(seq_id)

    def take_copies(self):
        return self.manager.take_copies()

    def computed(self, seq_id, num_tokens):
        self.manager.cache_blocks(seq_id, num_tokens)  # only now may other requests hit them

    def can_swap_out(self, seq_ids):
        return self.manager.can_swap_out(seq_ids)  # False without a CPU pool, or a full one

    def swap_out(self, seq_ids):
        return self.manager.swap_out(seq_ids)

    def _swap_in_need(self, seq_ids) -> int:
        # vLLM v0's conservative rule (block_manager_v1.py, ``can_swap_in``): the group's blocks
        # plus one new block per sequence, which it may take right after coming back.
        blocks = {c for sid in seq_ids for c in self.manager.cpu_block_table(sid)}
        return len(blocks) + len(seq_ids) + self.watermark_blocks

    def can_swap_in(self, seq_ids):
        return self._swap_in_need(seq_ids) <= self.manager.num_free_blocks

    def can_ever_swap_in(self, seq_ids):
        return self._swap_in_need(seq_ids) <= self.manager.num_blocks

    def swap_in(self, seq_ids):
        return self.manager.swap_in(seq_ids)

    def usage(self, final_lens, next_request):
        return self.manager.usage(final_lens)

    def describe(self) -> str:
        m = self.manager
        return (f"{self.name}, {m.num_free_blocks} of {m.num_blocks} blocks free, watermark "
                f"{self.watermark_blocks}")

    def blocks_in_use(self) -> int:
        return self.manager.num_blocks - self.manager.num_free_blocks


class ContiguousPolicy(MemoryPolicy):
    """Orca: one contiguous region per request, reserved at admission, as its policy sizes it."""

    def __init__(self, cache: ContiguousKVCache) -> None:
        if cache.store_kv:
            raise ValueError("ContiguousPolicy needs a ContiguousKVCache(store_kv=False): the "
                             "scheduler keeps accounting only")
        self.cache = cache
        self.name = f"orca-{cache.policy}"
        self.total_slots = cache.num_slots

    def refusal(self, width, final_len):
        if width > 1:
            return self.no_sharing()
        if final_len > self.cache.max_seq_len:  # (max_seq_len itself fits: the cache checked)
            return f"final length {final_len} exceeds max_seq_len={self.cache.max_seq_len}"
        return None

    def admit(self, seq_ids, token_ids, final_len):
        if len(seq_ids) != 1:
            raise ValueError(self.no_sharing())
        n = len(token_ids[0])
        if not self.cache.can_reserve(n, final_len):
            return None
        self.cache.reserve(seq_ids[0], n, final_len)
        self.cache.advance(seq_ids[0], n)
        return [0]

    def can_append(self, seq_ids):
        return True  # the reservation already holds every slot up to the final length

    def append_slot(self, seq_id, token_id):
        self.cache.advance(seq_id, 1)

    def free(self, seq_id):
        self.cache.release(seq_id)

    def usage(self, final_lens, next_request):
        # The region ``admit`` would reserve for the next request: pow2 sizes it by the prompt.
        final = None if next_request is None else min(next_request[1], self.cache.max_seq_len)
        need = None if final is None else self.cache.reservation_size(
            min(next_request[0], final), final)
        return self.cache.usage(need)

    def blocks_in_use(self) -> int:
        return self.cache.num_slots - self.cache.num_free


POLICY_NAMES = ("paged", "orca-max", "orca-pow2", "orca-oracle")


def make_policy(name: str, *, num_slots: int, block_size: int = 16, max_seq_len: int = 2048,
                enable_prefix_caching: bool = False, num_cpu_blocks: int = 0,
                watermark: float = 0.01) -> MemoryPolicy:
    """A policy by its command-line name over ``num_slots`` token slots of KV memory."""
    check_choice("policy", name, POLICY_NAMES)
    num_slots = check_int("num_slots", num_slots, low=0)
    block_size = check_int("block_size", block_size, low=1)
    if name == "paged":
        if num_slots < block_size:
            raise ValueError(f"num_slots={num_slots} holds no block of block_size={block_size}")
        m = KVCacheManager(num_slots // block_size, block_size, num_cpu_blocks=num_cpu_blocks,
                           enable_prefix_caching=enable_prefix_caching)
        return PagedPolicy(m, watermark=watermark)
    cache = ContiguousKVCache(num_slots, 1, 1, policy=name.split("-")[1],
                              max_seq_len=max_seq_len, store_kv=False)
    return ContiguousPolicy(cache)
