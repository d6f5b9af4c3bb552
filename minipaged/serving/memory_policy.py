"""What the scheduler needs from a KV cache, and adapters for the paged and contiguous caches.

What this teaches: the scheduler (``scheduler.py``) decides *who* runs; a memory policy decides
*whether there is room*. Keeping the two apart is what lets one scheduler compare vLLM's paged
cache with the Orca baselines slot for slot (paper section 6.1): same requests, same FCFS order,
same preemption rules; only the memory differs. Read before: ``kv_cache.py``, ``contiguous.py``,
``swap.py``. Read next: ``scheduler.py``.

The interface (``MemoryPolicy``), in vLLM's words:

    admit(seqs)           memory for sequences about to be prefilled (a new prompt, or prompt +
                          generated tokens after a recompute preemption); all or nothing; returns
                          the tokens already cached per sequence (prefix caching) or None
    append_slot(id, tok)  room for one more token (a decode step); raises ``oom_error``, state
                          unchanged, when there is none
    can_append(ids)       room for one more token in every one of ``ids`` (a multi-sequence
                          group is checked before any of it is appended: all or nothing)
    fork / free           copy-on-write sharing of a parent's blocks; release a sequence
    swap_out / swap_in    preemption by swapping (paged only), block mappings returned
    usage(...)            the paper's four categories of KV memory, now

Paged (``PagedPolicy``) is a thin layer over ``KVCacheManager`` plus vLLM's *watermark*: a new
request is admitted only if a few free blocks (1% by default) remain afterwards, so that running
sequences can still grow for a while without being preempted at once.

Contiguous (``ContiguousPolicy``, the Orca baselines) reserves each request's region at admission
for its whole final length, so decoding never runs out and never preempts: the waste is paid up
front instead. It keeps accounting only (``store_kv=False``). It cannot share memory between
sequences, so parallel sampling and beam search run with the paged policy only.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Iterable, Mapping

from minipaged.contiguous.buddy import OutOfMemoryError
from minipaged.contiguous.cache import ContiguousKVCache
from minipaged.contiguous.usage import KVUsage
from minipaged.paged.block_allocator import OutOfBlocksError
from minipaged.serving.swap import KVCacheManager

SeqId = Hashable


class MemoryPolicy(ABC):
    """Base class: the scheduler's view of a KV cache. See the module docstring."""

    name = "abstract"
    supports_swap = False
    supports_sharing = False
    oom_error: type[Exception] = OutOfBlocksError
    # Hot-path methods, called once per token or per sequence: a subclass may bind them to
    # its manager's own methods in __init__ (no extra call layer), so they are declared here
    # as attributes rather than abstract methods.
    append_slot: Callable[[SeqId, int], object]
    can_append: Callable[[list[SeqId]], bool]
    free: Callable[[SeqId], None]

    @abstractmethod
    def fits_ever(self, lens: list[int], final_len: int) -> bool:
        """Could these sequences fit in an empty cache? (False: reject, never admit.)"""
        ...

    @abstractmethod
    def admit(self, seq_ids: list[SeqId], token_ids: list[list[int]],
              final_len: int) -> list[int] | None:
        ...

    def fork(self, parent_id: SeqId, child_id: SeqId) -> None:
        raise ValueError(f"the {self.name} policy cannot share memory between sequences "
                         f"(parallel sampling and beam search need --policy paged)")

    def take_copies(self) -> list[tuple[int, int]]:
        return []

    def can_swap_in(self, seq_ids: list[SeqId]) -> bool:
        return False

    def can_swap_out(self, seq_ids: list[SeqId]) -> bool:
        return False

    def swap_out(self, seq_ids: list[SeqId]) -> list[tuple[int, int]]:
        raise ValueError(f"the {self.name} policy cannot swap")

    def swap_in(self, seq_ids: list[SeqId]) -> list[tuple[int, int]]:
        raise ValueError(f"the {self.name} policy cannot swap")

    @abstractmethod
    def usage(self, final_lens: Mapping[SeqId, int], next_final_len: int | None) -> KVUsage:
        ...

    @abstractmethod
    def blocks_in_use(self) -> int:
        """Physical blocks (paged) or slots (contiguous) held now."""
        ...

    @property
    @abstractmethod
    def total_slots(self) -> int:
        ...


class PagedPolicy(MemoryPolicy):
    """vLLM: ``KVCacheManager`` blocks, allocated on demand, with a watermark for admissions."""

    supports_sharing = True

    def __init__(self, manager: KVCacheManager, *, watermark: float = 0.01) -> None:
        if not 0 <= watermark < 1:
            raise ValueError(f"watermark={watermark} must be in [0, 1)")
        self.manager = manager
        self.block_size = manager.block_size
        self.watermark_blocks = int(watermark * manager.num_blocks)
        self.name = f"paged (block {manager.block_size})"
        self.supports_swap = manager.num_free_cpu_blocks > 0
        self.append_slot = manager.append_slot  # the hot path: no extra Python frame per token
        self.can_append = manager.can_append_slots
        self.fork = manager.fork
        self.free = manager.free
        self.take_copies = manager.take_copies
        self.can_swap_out = manager.can_swap_out
        self.swap_in = manager.swap_in
        self.swap_out = manager.swap_out

    def _blocks(self, lens: Iterable[int]) -> int:
        bs = self.block_size
        return sum([-(-n // bs) for n in lens])

    def fits_ever(self, lens: list[int], final_len: int) -> bool:
        return self._blocks(lens) <= self.manager.num_blocks - self.watermark_blocks

    def admit(self, seq_ids, token_ids, final_len):
        m = self.manager
        # Without prefix caching the exact need is known; with it, hits only lower the need,
        # so try and let the manager refuse (all or nothing) if the estimate was too high.
        need = self._blocks([len(t) for t in token_ids])
        if not m.enable_prefix_caching and m.num_free_blocks - need < self.watermark_blocks:
            return None
        done: list[int] = []
        try:
            for sid, toks in zip(seq_ids, token_ids):
                done.append(m.allocate(sid, toks))
        except OutOfBlocksError:
            for sid in seq_ids[:len(done)]:
                m.free(sid)
            return None
        if m.num_free_blocks < self.watermark_blocks:  # a prefix-cache admission went too far
            for sid in seq_ids:
                m.free(sid)
            return None
        return done

    def can_swap_in(self, seq_ids):
        # Room for the group's blocks, one new slot per sequence, and the watermark.
        m = self.manager
        need = len({b for s in seq_ids for b in m.cpu_block_table(s)}) + len(seq_ids)
        return need + self.watermark_blocks <= m.num_free_blocks

    def usage(self, final_lens, next_final_len):
        return self.manager.usage(final_lens)

    def blocks_in_use(self) -> int:
        return self.manager.num_blocks - self.manager.num_free_blocks

    @property
    def total_slots(self) -> int:
        return self.manager.num_blocks * self.block_size


class ContiguousPolicy(MemoryPolicy):
    """Orca: one contiguous region per request, reserved at admission for the final length."""

    oom_error = OutOfMemoryError
    block_size = 1

    def __init__(self, cache: ContiguousKVCache) -> None:
        if cache.store_kv:
            raise ValueError("ContiguousPolicy needs a ContiguousKVCache(store_kv=False): the "
                             "scheduler keeps accounting only")
        self.cache = cache
        self.name = f"orca-{cache.policy}"
        # Decode tokens are counted here and handed to the cache in one ``advance`` per
        # sequence when its accounting is read (``usage``): the reservation already holds every
        # slot, so appending can never fail, and one call per token would dominate a simulation.
        self._pending: dict[SeqId, int] = {}

    def append_slot(self, seq_id: SeqId, token_id: int) -> None:
        p = self._pending
        p[seq_id] = p.get(seq_id, 0) + 1

    def flush(self) -> None:
        """Hand every pending decode token to the cache (``advance``)."""
        for sid, k in self._pending.items():
            self.cache.advance(sid, k)
        self._pending.clear()

    def fits_ever(self, lens, final_len):
        c = self.cache
        return len(lens) == 1 and final_len <= c.max_seq_len and (
            c.reservation_size(lens[0], final_len) <= c.num_slots)

    def admit(self, seq_ids, token_ids, final_len):
        if len(seq_ids) != 1:
            self.fork(seq_ids[0], seq_ids[1])  # raises: no sharing, no multi-sequence groups
        n = len(token_ids[0])
        if not self.cache.can_reserve(n, final_len):
            return None
        self.cache.reserve(seq_ids[0], n, final_len)
        self.cache.advance(seq_ids[0], n)
        return [0]

    def can_append(self, seq_ids):
        return True

    def free(self, seq_id):
        self._pending.pop(seq_id, None)
        self.cache.release(seq_id)

    def usage(self, final_lens, next_final_len):
        self.flush()
        need = None if next_final_len is None else self.cache.reservation_size(
            1, min(next_final_len, self.cache.max_seq_len))  # prompt length not passed: 1
        return self.cache.usage(need)

    def blocks_in_use(self) -> int:
        self.flush()
        return self.cache.num_slots - self.cache.num_free

    @property
    def total_slots(self) -> int:
        return self.cache.num_slots


POLICY_NAMES = ("paged", "orca-max", "orca-pow2", "orca-oracle")


def make_policy(name: str, *, num_slots: int, block_size: int = 16, max_seq_len: int = 2048,
                enable_prefix_caching: bool = False, num_cpu_blocks: int = 0,
                watermark: float = 0.01) -> MemoryPolicy:
    """A policy by its command-line name over ``num_slots`` token slots of KV memory."""
    if name == "paged":
        if num_slots < block_size:
            raise ValueError(f"num_slots={num_slots} holds no block of block_size={block_size}")
        m = KVCacheManager(num_slots // block_size, block_size,
                           enable_prefix_caching=enable_prefix_caching,
                           num_cpu_blocks=num_cpu_blocks)
        return PagedPolicy(m, watermark=watermark)
    if name in ("orca-max", "orca-pow2", "orca-oracle"):
        cache = ContiguousKVCache(num_slots, 1, 1, policy=name.split("-")[1],
                                  max_seq_len=max_seq_len, store_kv=False)
        return ContiguousPolicy(cache)
    raise ValueError(f"policy={name!r} is not one of {POLICY_NAMES}")
