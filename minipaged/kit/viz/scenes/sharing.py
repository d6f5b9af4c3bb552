"""Scenes ``fork`` and ``beam``: block sharing with reference counts and copy-on-write.

What they show (vLLM section 4.4), with real K/V written through ``cache_ops``:

* ``fork``: parallel sampling. One prompt is allocated once and forked twice, so every prompt
  block has reference count 3. The first samples to write into the shared, partly filled last
  block get their own copy (``take_copies`` then ``copy_blocks``); the last writer owns it alone
  and writes in place. Full prompt blocks stay shared to the end.
* ``beam``: beam search of width 3 (``sharing.sampling.BeamSearch``) with seeded random scores:
  a beam chosen twice is forked, a beam not chosen is freed.

After every step each sequence's K/V are read back through its block table and compared, bit
for bit, with what was written for it.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from minipaged.kit.viz.scene import Event, Frame, Scene
from minipaged.kit.viz.scenes.common import VOCAB, PagedKV, blocks_text, random_tokens, words
from minipaged.serving.swap import KVCacheManager
from minipaged.sharing.sampling import BeamSearch, Candidate

NUM_BLOCKS = 16
BLOCK_SIZE = 4


class _SharingScene(Scene):
    vocab = VOCAB

    def _start(self) -> tuple[np.random.Generator, KVCacheManager, list[int]]:
        """A fresh pool with K/V storage, and a seeded prompt of 5-7 tokens to share."""
        rng = np.random.default_rng(self.seed)
        self.manager = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE)
        self.kv = PagedKV(self.manager, rng)
        return rng, self.manager, random_tokens(rng, int(rng.integers(5, 8)))


class ForkScene(_SharingScene):
    name = "fork"
    title = "Parallel sampling: fork and copy-on-write"
    summary = "three samples of one prompt share its blocks; copy-on-write on append"

    def frames(self) -> Iterator[Frame]:
        _, m, prompt = self._start()
        m.allocate(0, prompt)
        self.kv.write(0, 0)
        yield self.pool_frame(f"A prompt of {len(prompt)} tokens is allocated once and its K/V "
                              f"written. We want three samples of it.",
                              [Event("admit", f"A: \"{words(prompt)}\" -> blocks "
                                              f"{blocks_text(m.block_table(0))}")])
        samples, events = [0, 1, 2], []
        for child in samples[1:]:
            m.fork(0, child)
            self.kv.fork(0, child)
            events.append(Event("fork", f"{self.labels(child)} = fork of A: shares blocks "
                                        f"{blocks_text(m.block_table(child))}, nothing copied"))
        yield self.pool_frame("Forking copies no K/V: the samples share every block, and each "
                              "block's reference count says by how many.", events)
        for _ in range(6):
            copies, events = self.kv.decode(samples, self.labels)
            caption = "Each sample appends its own token. " + (
                f"{len(copies)} copy-on-write copies: the last writer of a shared block keeps "
                f"it and writes in place." if copies else
                "No block is shared where they write any more: no copies.")
            yield self.pool_frame(caption, events, copies=copies)
        for s in samples:
            m.free(s)
        yield self.pool_frame("The request is done: every sample is freed; every block's "
                              "reference count drops to 0 and the pool is free again.",
                              [Event("free", f"A, B, C freed; {m.num_free_blocks} of "
                                             f"{m.num_blocks} blocks free")])


class BeamScene(_SharingScene):
    name = "beam"
    title = "Beam search: forking candidates, freeing dropped beams"
    summary = "beam search of width 3: survivors forked, dropped beams freed"

    def frames(self) -> Iterator[Frame]:
        rng, m, prompt = self._start()
        beam = BeamSearch(m, "query", prompt, width=3)
        self.kv.write(beam.beams[0], 0)
        yield self.pool_frame(f"Beam search of width 3 starts from one beam: the {len(prompt)}-"
                              f"token prompt.", [])
        for step in range(1, 8):
            cands = [Candidate(s, int(t), beam.scores[s] + float(np.log(p)))
                     for s in beam.beams
                     for t, p in zip(rng.integers(0, len(VOCAB), 3), rng.dirichlet([1, 1, 1]))]
            old = set(beam.beams)
            beam.step(cands)
            copies = m.take_copies()
            self.kv.copy(copies)
            dropped = sorted(old - set(beam.beams), key=repr)
            events = [Event("free", f"{self.labels(s)} dropped: freed (shared blocks stay for "
                                    f"the beams still using them)") for s in dropped]
            parent = None
            for s in beam.beams:  # BeamSearch lists each forked child right after its parent
                if s in old:
                    parent = s
                    continue
                self.kv.fork(parent, s)
                events.append(Event("fork", f"{self.labels(s)} = fork of {self.labels(parent)}"))
            events += [Event("copy", f"#{src} -> #{dst} (copy-on-write)") for src, dst in copies]
            for s in beam.beams:
                self.kv.write(s, m.seq_len(s) - 1)
            events.append(self.kv.check(beam.beams))
            forked = len([s for s in beam.beams if s not in old])
            caption = (f"Step {step}: {len(cands)} candidates, the {len(beam.beams)} best survive "
                       f"({forked} forked, {len(dropped)} dropped). Beams share their common "
                       f"history.")
            yield self.pool_frame(caption, events, copies=copies)
