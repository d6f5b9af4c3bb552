"""Scene ``prefix``: a shared system prompt, prefix-cache hits, and LRU eviction (vLLM v1).

What it shows: a ``KVCacheManager(enable_prefix_caching=True)`` of 12 blocks; every request
starts with the same 8-token system prompt (two full blocks). The first request computes it; the
next ones find its blocks by hash (``allocate`` returns how many prompt tokens are already
computed) and share them. A finished request's full blocks keep their K/V and hash: free but
cached (``○``), in least-recently-used order, until a long unrelated request needs more blocks
than are plainly free and the allocator evicts the oldest (vLLM v1 does the same:
vllm/v1/core/kv_cache_utils.py FreeKVCacheBlockQueue, vllm/v1/core/block_pool.py). K/V are a
fixed function of each token's prefix, so the log can check every table against a cold
computation.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from minipaged.kit.viz.scene import Event, Frame, Scene
from minipaged.kit.viz.scenes.common import VOCAB, PagedKV, blocks_text, random_tokens, words
from minipaged.serving.swap import KVCacheManager

NUM_BLOCKS = 12
BLOCK_SIZE = 4


class PrefixScene(Scene):
    name = "prefix"
    title = "Prefix caching: shared system prompt, hits and LRU eviction"
    summary = "a shared system prompt: prefix-cache hits, cached free blocks, LRU eviction"
    vocab = VOCAB

    def frames(self) -> Iterator[Frame]:
        rng = np.random.default_rng(self.seed)
        self.manager = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True)
        self.kv = PagedKV(self.manager, rng, prefix_model=True)
        self.hits = self.eligible = self.evictions = 0
        system = random_tokens(rng, 8)
        yield self._frame(f"Every request starts with the same {len(system)}-token system "
                          f"prompt: \"{words(system)}\".", [])
        for rid in ("R1", "R2"):
            yield self._admit(rid, system + random_tokens(rng, int(rng.integers(3, 6))))
        yield self._free("R1")
        yield self._admit("R3", system + random_tokens(rng, int(rng.integers(3, 6))))
        yield self._free("R2", "R3")
        # 10 blocks: more than the 8 never-cached free blocks, so 2 cached ones must go
        yield self._admit("R4", random_tokens(rng, 10 * BLOCK_SIZE - 1),
                          note="a long prompt with nothing in common")
        yield self._free("R4")
        yield self._admit("R5", system + random_tokens(rng, 3))

    def _cached_free(self) -> dict[int, int]:
        """hash -> block, for the cached blocks nobody uses (the ``○`` of the memory map)."""
        return {h: b for h, b in self.manager.allocator.cached_blocks().items()
                if self.manager.ref_count(b) == 0}

    def _admit(self, rid: str, prompt: list[int], note: str = "") -> Frame:
        m = self.manager
        self.labels.name(rid, rid)
        before = m.allocator.cached_blocks()
        computed = m.allocate(rid, prompt)
        self.kv.write(rid, computed)  # only the positions not found in the cache are computed
        after = m.allocator.cached_blocks()
        table = m.block_table(rid)
        evicted = sorted(b for h, b in before.items() if after.get(h) != b)
        self.hits += computed // BLOCK_SIZE
        self.eligible += (len(prompt) - 1) // BLOCK_SIZE  # the last token is always computed
        self.evictions += len(evicted)
        events = [Event("admit", f"{rid}: {len(prompt)} prompt tokens -> blocks "
                                 f"{blocks_text(table)}")]
        if computed:
            events.append(Event("hit", f"{rid}: first {computed} tokens already cached in "
                                       f"{blocks_text(table[:computed // BLOCK_SIZE])}: "
                                       f"computes only {len(prompt) - computed}"))
        else:
            events.append(Event("note", f"{rid}: no cached prefix: computes all {len(prompt)}"))
        if evicted:
            events.append(Event("evict", f"evicted least recently used cached blocks "
                                         f"{blocks_text(evicted)} (their hashes dropped)"))
        events.append(self.kv.check(m.seq_ids))
        caption = (f"{rid} arrives" + (f" ({note})" if note else "") + ": " +
                   (f"{computed} of {len(prompt)} prompt tokens are prefix-cache hits."
                    if computed else "nothing to reuse, every token is computed."))
        if evicted:
            caption += f" To make room, {len(evicted)} cached blocks were evicted."
        return self._frame(caption, events)

    def _free(self, *rids: str) -> Frame:
        for rid in rids:
            self.manager.free(rid)
        return self._frame(f"{' and '.join(rids)} finished. Blocks another request still uses "
                           f"stay in use; full blocks nobody uses keep their K/V and hash: free "
                           f"but cached ({len(self._cached_free())} now), a hit for a prompt "
                           f"that starts the same way.",
                           [Event("free", f"{rid}: freed") for rid in rids])

    def _frame(self, caption: str, events: list[Event]) -> Frame:
        rate = f" ({100 * self.hits / self.eligible:.0f}%)" if self.eligible else ""
        stats = (f"prefix cache so far: {self.hits} hits of {self.eligible} prompt blocks that "
                 f"could hit{rate}; {self.evictions} evictions")
        return self.pool_frame(caption, events, stats)
