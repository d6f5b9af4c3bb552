"""Scene ``prefix``: a shared system prompt, prefix-cache hits, and LRU eviction (vLLM v1).

What it shows: a ``KVCacheManager(enable_prefix_caching=True)`` of 12 blocks. Every request
starts with the same 8-token system prompt (two full blocks). The first request computes it; the
next ones find its blocks by hash (``allocate`` returns how many prompt tokens are already
computed) and share them, with reference counts. When a request finishes, its full blocks keep
their K/V and hash: free, but cached (``○``), waiting in least-recently-used order. A long
unrelated request then needs more blocks than are plainly free, so the allocator evicts the
oldest cached blocks; the scene reports which hashes disappeared and whether the next request
still hits. K/V here are a fixed function of each token's prefix, as in a real model, so the
step log can check that a sequence's K/V read through its table equal a cold computation.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from rich.console import Group
from rich.text import Text

from minipaged.kit.viz.blocks import block_tables, memory_map
from minipaged.kit.viz.labels import Labels
from minipaged.kit.viz.palette import NOTE_STYLE
from minipaged.kit.viz.scene import Frame, Scene
from minipaged.kit.viz.scenes.common import VOCAB, PagedKV, blocks_text
from minipaged.kit.viz.state import read_pool
from minipaged.kit.viz.steplog import Event

NUM_BLOCKS = 12
BLOCK_SIZE = 4


class PrefixScene(Scene):
    name = "prefix"
    title = "Prefix caching: shared system prompt, hits and LRU eviction"
    summary = "a shared system prompt: prefix-cache hits, cached free blocks, LRU eviction"
    needs = ("core", "prefix")

    def managers(self) -> dict[str, object]:
        return {"pool": self.manager}

    def frames(self) -> Iterator[Frame]:
        from minipaged.serving.swap import KVCacheManager

        rng = np.random.default_rng(self.seed)
        self.manager = m = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True)
        self.kv = PagedKV(m, rng, prefix_model=True)
        self.labels = Labels()
        system = [int(t) for t in rng.integers(0, len(VOCAB), 8)]

        def question(n: int) -> list[int]:
            return [int(t) for t in rng.integers(0, len(VOCAB), n)]

        yield self._frame(0, f"Every request starts with the same {len(system)}-token system "
                             f"prompt: \"{' '.join(VOCAB[t] for t in system)}\".", [])
        step = 1
        for rid in ("R1", "R2"):
            yield self._admit(step, rid, system + question(int(rng.integers(3, 6))))
            step += 1
        yield self._free(step, "R1")
        step += 1
        yield self._admit(step, "R3", system + question(int(rng.integers(3, 6))))
        step += 1
        yield self._free(step, "R2", "R3")
        step += 1
        # 10 blocks: more than the 8 never-cached free blocks, so 2 cached ones must go
        long_prompt = question(10 * BLOCK_SIZE - 1)
        yield self._admit(step, "R4", long_prompt, note="a long prompt with nothing in common")
        step += 1
        yield self._free(step, "R4")
        step += 1
        yield self._admit(step, "R5", system + question(3))

    def _cached(self) -> dict[int, int]:
        return self.manager.allocator.cached_blocks()  # hash -> block

    def _admit(self, step: int, rid: str, prompt: list[int], note: str = "") -> Frame:
        m = self.manager
        self.labels.name(rid, rid)
        before = self._cached()
        computed = m.allocate(rid, prompt)
        self.kv.write(rid, computed)  # only the positions not found in the cache are computed
        after = self._cached()
        table = m.block_table(rid)
        evicted = sorted(b for h, b in before.items() if after.get(h) != b)
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
        events.append(self._check())
        caption = (f"{rid} arrives" + (f" ({note})" if note else "") + ": " +
                   (f"{computed} of {len(prompt)} prompt tokens are prefix-cache hits."
                    if computed else "nothing to reuse, every token is computed."))
        if evicted:
            caption += f" To make room, {len(evicted)} cached blocks were evicted."
        return self._frame(step, caption, events)

    def _free(self, step: int, *rids: str) -> Frame:
        for rid in rids:
            self.manager.free(rid)
        n_cached = sum(1 for b in read_pool(self.manager).blocks if b.state == "cached")
        return self._frame(step, f"{' and '.join(rids)} finished. Blocks another request still "
                                 f"uses stay in use; full blocks nobody uses keep their K/V and "
                                 f"hash: free but cached ({n_cached} now), a hit for a prompt "
                                 f"that starts the same way.",
                           [Event("free", f"{rid}: freed") for rid in rids])

    def _check(self) -> Event:
        ok = self.kv.all_intact(self.manager.seq_ids)
        return Event("check", f"K/V read through each block table equal a cold computation: "
                              f"{ok}")

    def _frame(self, step: int, caption: str, events: list[Event]) -> Frame:
        view = read_pool(self.manager)
        alloc = self.manager.allocator
        rate = f"{100 * alloc.hits / alloc.queries:.0f}%" if alloc.queries else "-"
        stats = (f"prefix cache: {alloc.hits} block hits of {alloc.queries} full blocks looked "
                 f"up ({rate}); {alloc.evictions} evictions")
        body = Group(block_tables(view, self.labels, vocab=VOCAB, width=self.width), Text(""),
                     memory_map(view, self.labels, width=self.width), Text(""),
                     Text(stats, NOTE_STYLE))
        return self.frame(step, caption, body, events, pool=view)
