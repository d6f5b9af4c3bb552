"""Scene ``cow-prefix``: copy-on-write under prefix caching (fork with the prefix cache on).

What it shows: a ``KVCacheManager(enable_prefix_caching=True)`` of 14 blocks of 4 slots. One
prompt is allocated (its full blocks hashed and cached) and forked twice, parallel sampling
with n = 3. Full blocks are then shared two ways at once, by reference count and findable by
hash; the partly filled last block only by reference count, so the first samples to write
into it get their own copy (copy-on-write) and the last one writes in place. A copy that fills
up is hashed under its own sample's prefix, so a later request whose prompt is that sample's
text finds it by hash. This is how vLLM v0's prefix-caching block manager combined the two
(vllm/core/block/prefix_caching_block.py; here sharing/prefix_cache.py); vLLM v1 has no fork
and runs the samples as separate requests (vllm/v1/engine/parallel_sampling.py).
K/V are a fixed function of each token's prefix, so every table is checked against a cold
computation after every step, and the list of blocks findable by hash is the manager's own.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from minipaged.kit.viz.scene import Event, Frame, Scene
from minipaged.kit.viz.scenes.common import VOCAB, PagedKV, blocks_text, random_tokens, words
from minipaged.serving.swap import KVCacheManager

NUM_BLOCKS = 14
BLOCK_SIZE = 4
SAMPLES = ("A", "B", "C")


class CowPrefixScene(Scene):
    name = "cow-prefix"
    title = "Copy-on-write under prefix caching: hashes and copies"
    summary = "parallel samples with the prefix cache on: full blocks by hash, the last by CoW"
    vocab = VOCAB

    def frames(self) -> Iterator[Frame]:
        rng = np.random.default_rng(self.seed)
        m = self.manager = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, enable_prefix_caching=True)
        self.kv = PagedKV(m, rng, prefix_model=True)
        prompt = random_tokens(rng, int(rng.integers(9, 12)))    # 2 full blocks + 1 to 3
        m.allocate("A", prompt)
        self.kv.write("A", 0)
        full, fill = divmod(len(prompt), BLOCK_SIZE)
        yield self._frame(
            f"Prefix caching is on. A's prompt has {len(prompt)} tokens: its {full} full blocks "
            f"are hashed and cached, its last block ({fill} of {BLOCK_SIZE} slots) is not: "
            f"only full blocks get a hash.",
            [Event("admit", f"A: \"{words(prompt)}\" -> blocks {blocks_text(m.block_table('A'))}"),
             self.kv.check(["A"])])
        for child in SAMPLES[1:]:
            m.fork("A", child)
            self.kv.fork("A", child)
        yield self._frame(
            f"B and C fork A (parallel sampling, n = 3): they share all "
            f"{len(m.block_table('A'))} blocks, the full ones by reference count and hash, "
            f"the partly filled last one by reference count alone. Nothing is copied.",
            [Event("fork", f"{s} = fork of A: blocks {blocks_text(m.block_table(s))}")
             for s in SAMPLES[1:]])
        for step in range(1, BLOCK_SIZE - fill + 2):  # until every sample took a new block
            yield self._decode(step)
        b = m.token_ids("B")
        d_prompt = b + random_tokens(rng, 1)
        before = {blk: m.ref_count(blk) for blk in m.block_table("B")}
        found = m.allocate("D", d_prompt)
        self.kv.write("D", found)
        hits = m.block_table("D")[:found // BLOCK_SIZE]
        copied = [blk for blk in hits if before[blk] == 1]
        yield self._frame(
            f"D arrives with B's text so far as its prompt: {found // BLOCK_SIZE} of its "
            f"blocks are found by hash, {len(copied)} of them B's own copy, hashed when it "
            f"filled. D's last block is its own: a partly filled block is never shared "
            f"between requests.",
            [Event("admit", f"D: {len(d_prompt)} prompt tokens -> blocks "
                            f"{blocks_text(m.block_table('D'))}"),
             Event("hit", f"D: first {found} tokens already cached in {blocks_text(hits)}; "
                          f"computes only {len(d_prompt) - found}"),
             self.kv.check(m.seq_ids)])
        for s in (*SAMPLES, "D"):
            m.free(s)
        cached = len(m.allocator.cached_blocks())
        yield self._frame(
            f"All done. {cached} blocks stay findable by hash with their K/V, free but cached: "
            f"hits for a later prompt. The others, partly filled ones among them, are plain "
            f"free again.",
            [Event("free", f"A, B, C, D freed; {m.num_free_blocks} of {m.num_blocks} blocks "
                           f"free")])

    def _decode(self, step: int) -> Frame:
        m = self.manager
        copies, events = self.kv.decode(SAMPLES, self.labels)
        caption = f"Step {step}: each sample appends a token. "
        if copies:
            caption += (f"{len(copies)} copy-on-write copies: the last writer of the shared "
                        f"block keeps it and writes in place.")
        else:
            caption += "No copies: no sample writes into a shared block."
        if filled := [s for s in SAMPLES if m.seq_len(s) % BLOCK_SIZE == 0]:
            caption += (f" {', '.join(filled)} filled a block: hashed and cached under its own "
                        f"prefix ({len(m.allocator.cached_blocks())} blocks findable now).")
        return self._frame(caption, events, copies=copies)

    def _frame(self, caption: str, events: list[Event], copies=()) -> Frame:
        findable = sorted(self.manager.allocator.cached_blocks().values())
        line = f"findable by hash: {blocks_text(findable)}"
        return self.pool_frame(caption, events, line, copies=copies)
