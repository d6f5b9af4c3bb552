"""Exercise 10: prefix caching with chained block hashes and an LRU free queue (vLLM v1).

Lesson: lessons/05_*.py (prefix caching).  Check: minipaged check 10

Many requests start with the same tokens (a system prompt, a few-shot header). vLLM v1 keeps
the K/V of full blocks after a request ends and reuses them (vllm/v1/core/kv_cache_manager.py,
vllm/v1/core/block_pool.py). This exercise's rules:
- each FULL block gets a hash chained from its parent's: h_i = hash_block(h_{i-1}, tokens_i)
  (h_{-1} = NO_PARENT), so equal hashes mean equal whole prefixes, not just equal blocks;
- a table maps hash -> physical block; a new request reuses the longest chain of its leading
  full blocks found there, checking the stored token ids too (hashes can collide; nano-vllm
  checks them too, while vLLM looks a hit up by its hash alone);
- at least the last prompt token is always recomputed (the model needs its logits), so only
  blocks lying entirely within the first len(token_ids) - 1 tokens may be hits;
- a freed block keeps its hash and K/V and joins the END of the free queue (least recently
  used first); it is evicted (hash dropped) only when allocate takes it from the HEAD as a
  fresh block. A hit on a block in the free queue removes it from the queue (O(1)).

Rules for allocate(token_ids), exactly (the grader replays them):
1. hits: for i = 0, 1, ... while block i is full and (i + 1) * BS <= len - 1: look its hash up;
   stop at the first miss or token mismatch.
2. fresh = ceil(len / BS) - len(hits). If fresh > free blocks not among the hits: raise
   RuntimeError and change nothing.
3. take the hits (ref_count += 1; out of the free queue if there), then take each fresh block
   from the head of the free queue (evicting its old hash if it had one), ref_count = 1.
4. register every fresh FULL block: hash -> block, unless that hash is already in the table
   (a simplification: vLLM does not de-duplicate, and minipaged's PrefixCachingBlockManager
   keeps a block computed twice cached twice under one hash).
5. return (block_table, number of cached tokens = len(hits) * BS).
free(block_table): for each block in REVERSED order, ref_count -= 1; at 0 it joins the end of
the queue (a sequence's tail is evicted before its head, which others are likelier to share).
"""

from __future__ import annotations

from collections import OrderedDict

EXERCISE = "10_prefix_cache"
NO_PARENT = -1


def hash_block(parent_hash: int, tokens) -> int:
    """Given: the hash of one full block, chained to its parent's hash."""
    return hash((parent_hash, tuple(tokens)))


def block_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """Hashes of the FULL blocks of token_ids, chained (a partial last block gets none).

    Hint: call hash_block(previous_hash, token_ids[i*BS:(i+1)*BS]) in a loop; the grader
    replaces hash_block with a colliding one to test rule 1's token check, so call it by name.
    """
    raise NotImplementedError


class PrefixCache:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        # Given: the state.
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self.free_queue: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.block_hash: dict[int, int] = {}             # cached block -> its hash
        self.block_tokens: dict[int, tuple[int, ...]] = {}  # cached block -> its token ids

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def allocate(self, token_ids: list[int]) -> tuple[list[int], int]:
        """Blocks for a prompt, reusing cached full blocks; returns (block_table, cached).

        Follow rules 1-5 in the module docstring.
        Hint: OrderedDict.popitem(last=False) takes the head; .pop(block) removes from the
        middle in O(1); queue[block] = None appends at the end.
        """
        raise NotImplementedError

    def free(self, block_table: list[int]) -> None:
        """Release a finished request's blocks (reversed order; cached blocks keep their hash).

        Errors: ValueError if a block's count is already 0 (a double free); nothing changes.
        """
        raise NotImplementedError
