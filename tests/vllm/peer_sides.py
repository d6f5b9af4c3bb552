"""The two sides of the lockstep comparison: minipaged's prefix-caching KVCacheManager and vLLM
v1's, each behind one small interface.

Both sides offer ``allocate`` a prompt (the prompt tokens already cached, or None when the pool
cannot hold it), ``append`` one decode token, ``free``, and read-only views keyed by *token
prefix*, never by block id or hash value: each side's hashes are translated to the prefix they
stand for, from the tokens submitted to that side. tests/vllm/peer_lockstep.py drives both.

vLLM is driven the way its scheduler drives it (vllm/v1/core/sched/scheduler.py): a request
built with the engine's block hasher (vllm/v1/engine/core.py:231-240), ``get_computed_blocks``
then ``allocate_slots(request, num_new_tokens, num_new_computed_tokens, new_computed_blocks)``
for a prompt, ``append_output_token_ids`` then ``allocate_slots(request, 1)`` per decode step,
``free`` when it finishes. Paths below are inside the installed ``vllm`` package (0.32.0).

Documented differences, normalised here and nowhere else:
 1. vLLM's pool spends one block on the *null block*: BlockPool pops it from the free queue at
    start-up and never frees it (v1/core/block_pool.py:184-188). The vLLM side gets
    ``num_blocks + 1`` blocks, so both have ``num_blocks`` usable ones.
 2. No lookahead and no watermark: ``allocate_slots`` is called with its default
    ``num_lookahead_tokens=0`` (v1/core/kv_cache_manager.py:377) and the manager with its
    default ``watermark=0.0`` (kv_cache_manager.py:148, 208), as minipaged has neither.
 3. vLLM does not de-duplicate: a block computed twice (two requests miss on the same block,
    or the last-token rule makes a repeated prompt recompute its last full block) is cached
    twice under one hash (v1/core/block_pool.py:48-52; ``insert`` at :85-99), and a lookup
    returns the first copy (``get_one_block``, :62-71). minipaged may choose to keep only the
    first copy (the second stays private). ``minipaged_keeps_duplicates`` asks minipaged which
    it does; if it keeps only the first, the vLLM side is given the same rule, in one place:
    ``_insert_block_hash`` (block_pool.py:626-646, called by ``cache_full_blocks`` at :295)
    leaves a block uncached when another block already holds its hash. Everything else about
    vLLM is untouched, and ``run_trace(..., reference="stock")`` (peer_lockstep) runs the
    unchanged vLLM, to measure what the choice costs (the prefix survives until its *last* copy
    is evicted; the copies sit at different places in the free queue). The views count a block
    as cached only if it is the copy a lookup returns (its *primary*), on both sides.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmKVCacheManager
from vllm.v1.core.kv_cache_utils import get_block_hash, get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request, RequestStatus

import minipaged

Prefix = tuple[int, ...]


def keep_first_copy_only(pool) -> None:
    """Difference 3 as minipaged resolves it, applied to a vLLM BlockPool: a full block whose
    hash another block already holds stays uncached."""
    insert = pool._insert_block_hash

    def insert_first_copy_only(key, block, num_tokens) -> None:
        if block.block_hash is None and pool.cached_block_hash_to_block.get_one_block(key):
            return  # another block holds this prefix already: this copy stays uncached
        insert(key, block, num_tokens)

    pool._insert_block_hash = insert_first_copy_only


class VllmSide:
    """vLLM's v1 KVCacheManager, standalone: one full-attention group, prefix caching on."""

    def __init__(self, num_blocks: int, block_size: int, keep_duplicates: bool = True) -> None:
        # The engine's default hash (CacheConfig.prefix_caching_hash_algo = "sha256",
        # vllm/config/cache.py:143), initialised the way EngineCore does it.
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(block_size, hash_fn)
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=16,
                                 dtype=torch.float32)
        config = KVCacheConfig(num_blocks=num_blocks + 1,  # + the null block (difference 1)
                               kv_cache_tensors=[],
                               kv_cache_groups=[KVCacheGroupSpec(["layers.0"], spec)])
        self.mgr = VllmKVCacheManager(config, max_model_len=1 << 20,
                                      scheduler_block_size=block_size,
                                      hash_block_size=block_size, enable_caching=True)
        self.pool = self.mgr.block_pool
        if not keep_duplicates:  # difference 3, as minipaged chose: the first copy only
            keep_first_copy_only(self.pool)
        self.requests: dict[str, Request] = {}
        self.prefix_of: dict[bytes, Prefix] = {}  # vLLM block hash -> the prefix it covers
        self.block_size = block_size

    def _learn(self, req: Request) -> None:
        bs, tokens = self.block_size, req.all_token_ids
        for i, h in enumerate(req.block_hashes):
            self.prefix_of.setdefault(h, tuple(tokens[:(i + 1) * bs]))

    def allocate(self, rid: str, tokens: list[int]) -> int | None:
        """Prompt tokens already cached, or None when the pool cannot hold the prompt."""
        req = Request(rid, list(tokens), SamplingParams(max_tokens=1 << 20), None,
                      block_hasher=self.hasher)
        self._learn(req)
        blocks, hits, _ = self.mgr.get_computed_blocks(req)
        if self.mgr.allocate_slots(req, req.num_tokens - hits, hits, blocks) is None:
            return None
        req.num_computed_tokens = req.num_tokens  # the whole prompt is prefilled in one step
        req.status = RequestStatus.RUNNING
        self.requests[rid] = req
        return hits

    def append(self, rid: str, token: int) -> bool:
        req = self.requests[rid]
        req.append_output_token_ids(token)
        self._learn(req)
        if self.mgr.allocate_slots(req, 1) is None:
            return False
        req.num_computed_tokens += 1
        return True

    def free(self, rid: str) -> None:
        self.mgr.free(self.requests.pop(rid))

    def num_free_blocks(self) -> int:
        return self.pool.get_num_free_blocks()

    def table_len(self, rid: str) -> int:
        return len(self.mgr.get_block_ids(rid)[0])

    def _key(self, block) -> Prefix | None:
        """The prefix a block is the primary cached copy of, else None (difference 3)."""
        key = block.block_hash
        if key is None or block.is_null:
            return None
        if self.pool.cached_block_hash_to_block.get_one_block(key) is not block:
            return None
        return self.prefix_of[get_block_hash(key)]

    def cached_prefixes(self) -> set[Prefix]:
        return {k for b in self.pool.blocks if (k := self._key(b)) is not None}

    def free_queue(self) -> list[Prefix | None]:
        return [self._key(b) for b in self.pool.free_block_queue.get_all_free_blocks()]

    def eviction_order(self) -> list[Prefix]:
        return [k for k in self.free_queue() if k is not None]

    def num_duplicates(self) -> int:
        """Blocks that carry a hash but are not its primary copy (difference 3)."""
        return sum(1 for b in self.pool.blocks
                   if b.block_hash is not None and not b.is_null and self._key(b) is None)


class MinipagedSide:
    """minipaged.KVCacheManager with prefix caching, seen through ``mgr.allocator``'s views."""

    def __init__(self, num_blocks: int, block_size: int,
                 factory: Callable[..., minipaged.KVCacheManager] | None = None) -> None:
        self.prefix_of: dict[int, Prefix] = {}
        self._ids: dict[Prefix, int] = {}
        make = factory or minipaged.KVCacheManager
        # A hash function that names each prefix by a number of its own: collision-free, so
        # the hash -> prefix map is exact (the chain rule h_i = f(h_{i-1}, tokens_i) is
        # minipaged's contract for ``hash_fn``).
        self.mgr = make(num_blocks, block_size, enable_prefix_caching=True, hash_fn=self._hash)

    def _hash(self, parent: int, token_ids: tuple[int, ...]) -> int:
        prefix = self.prefix_of.get(parent, ()) + tuple(token_ids)
        h = self._ids.setdefault(prefix, len(self._ids) + 1)  # never 0, minipaged's root
        self.prefix_of[h] = prefix
        return h

    def allocate(self, rid: str, tokens: list[int]) -> int | None:
        try:
            return self.mgr.allocate(rid, tokens)
        except minipaged.OutOfBlocksError:
            return None

    def append(self, rid: str, token: int) -> bool:
        try:
            self.mgr.append_slot(rid, token)
        except minipaged.OutOfBlocksError:
            return False
        return True

    def free(self, rid: str) -> None:
        self.mgr.free(rid)

    def num_free_blocks(self) -> int:
        return self.mgr.num_free_blocks

    def table_len(self, rid: str) -> int:
        return len(self.mgr.block_table(rid))

    def _key(self, block: int) -> Prefix | None:
        alloc = self.mgr.allocator
        h = alloc.block_hash(block)
        if h is None or alloc.cached_blocks().get(h) != block:
            return None
        return self.prefix_of[h]

    def cached_prefixes(self) -> set[Prefix]:
        return {self.prefix_of[h] for h in self.mgr.allocator.cached_blocks()}

    def eviction_order(self) -> list[Prefix]:
        return [k for b in self.mgr.allocator.lru_blocks() if (k := self._key(b)) is not None]

    def free_queue(self) -> list[Prefix | None] | None:
        """All free blocks, next allocated first; None where minipaged has no ``free_queue``."""
        queue = getattr(self.mgr.allocator, "free_queue", None)
        return None if queue is None else [self._key(b) for b in queue()]


def minipaged_keeps_duplicates(factory: Callable | None = None) -> bool:
    """Does minipaged cache the second copy of a block computed twice, as vLLM does?

    Probe: the same two-block prompt twice. The second request hits the first block only (the
    last prompt token is recomputed), so it computes the second block again."""
    side = MinipagedSide(4, 2, factory)
    side.allocate("a", [1, 2, 3, 4])
    side.allocate("b", [1, 2, 3, 4])
    return side.mgr.allocator.block_hash(side.mgr.block_table("b")[1]) is not None
