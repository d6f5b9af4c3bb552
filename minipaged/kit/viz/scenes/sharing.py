"""Scenes ``fork`` and ``beam``: block sharing with reference counts and copy-on-write.

What they show (vLLM section 4.4), with real K/V arrays written through ``cache_ops``:

* ``fork``: parallel sampling. One prompt, three samples (``sharing.start_parallel_sampling``):
  the prompt is allocated once and forked, so every prompt block has reference count 3. The
  first samples to write into the shared, partly filled last block get their own copy
  (copy-on-write: ``take_copies`` then ``copy_blocks``); the last writer owns the block alone
  and writes in place. Full prompt blocks stay shared to the end.
* ``beam``: beam search of width 3 (``sharing.BeamSearch``) with seeded random scores. Each step
  keeps the three best candidates: a beam chosen twice is forked, a beam not chosen is freed.

After every step the scene reads every sequence's K/V back through its block table and compares
it, bit for bit, with what was written for that sequence; the step log prints the result.
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
from minipaged.kit.viz.scenes.common import VOCAB, PagedKV, blocks_text, words
from minipaged.kit.viz.state import read_pool
from minipaged.kit.viz.steplog import Event

NUM_BLOCKS = 16
BLOCK_SIZE = 4


class _SharingScene(Scene):
    needs = ("core", "fork")

    def managers(self) -> dict[str, object]:
        return {"pool": self.manager}

    def _start(self) -> tuple[np.random.Generator, object, list[int]]:
        """A fresh pool with K/V storage, and a seeded prompt of 5-7 tokens to share."""
        from minipaged.serving.swap import KVCacheManager

        rng = np.random.default_rng(self.seed)
        self.manager = m = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE)
        self.kv = PagedKV(m, rng)
        self.labels = Labels()
        prompt = [int(t) for t in rng.integers(0, len(VOCAB), int(rng.integers(5, 8)))]
        return rng, m, prompt

    def _savings(self, seq_ids) -> str:
        from minipaged.sharing.sampling import blocks_with_sharing, blocks_without_sharing

        shared = blocks_with_sharing(self.manager, seq_ids)
        alone = blocks_without_sharing(self.manager, seq_ids)
        pct = 100 * (alone - shared) / alone if alone else 0.0
        return (f"{len(seq_ids)} sequences hold {shared} distinct blocks; without sharing they "
                f"would hold {alone}: {pct:.0f}% saved")

    def _check(self, seq_ids) -> Event:
        ok = self.kv.all_intact(seq_ids)
        return Event("check", "every sequence's K/V, read through its block table, equals what "
                              f"was written for it: {ok}")

    def _frame(self, step: int, caption: str, events: list[Event], seq_ids,
               copies=()) -> Frame:
        view = read_pool(self.manager, copies=copies)
        parts = [block_tables(view, self.labels, vocab=VOCAB, width=self.width), Text(""),
                 memory_map(view, self.labels, width=self.width)]
        if len(seq_ids) > 1:
            parts += [Text(""), Text(self._savings(seq_ids), NOTE_STYLE)]
        return self.frame(step, caption, Group(*parts), events, pool=view)


class ForkScene(_SharingScene):
    name = "fork"
    title = "Parallel sampling: fork and copy-on-write"
    summary = "three samples of one prompt share its blocks; copy-on-write on append"

    def frames(self) -> Iterator[Frame]:
        from minipaged.sharing.sampling import (
            append_group,
            fork_seq,
            free_group,
            start_parallel_sampling,
        )

        rng, m, prompt = self._start()
        group, _ = start_parallel_sampling(m, "request", prompt, 1)
        first = group.seq_ids[0]
        self.kv.write(first, 0)
        self.labels(first)
        yield self._frame(0, f"A prompt of {len(prompt)} tokens is allocated once and its K/V "
                             f"written. We want three samples of it.",
                          [Event("admit", f"{self.labels(first)}: \"{words(prompt)}\" -> "
                                          f"blocks {blocks_text(m.block_table(first))}")],
                          group.seq_ids)
        events = []
        for _ in range(2):
            child = fork_seq(m, group, first)
            self.kv.fork(first, child)
            events.append(Event("fork", f"{self.labels(child)} = fork of {self.labels(first)}: "
                                        f"shares blocks {blocks_text(m.block_table(child))}, "
                                        f"nothing copied"))
        yield self._frame(1, "Forking copies no K/V: the samples share every block, and each "
                             "block's reference count says by how many.",
                          events, group.seq_ids)
        for step in range(2, 8):
            tokens = {s: int(rng.integers(0, len(VOCAB))) for s in group.seq_ids}
            before = {s: m.block_table(s) for s in group.seq_ids}
            append_group(m, group, tokens)
            copies = m.take_copies()
            self.kv.copy(copies)  # copies first, then the step's new K/V
            events = []
            for src, dst in copies:
                who = [self.labels(s) for s in group.seq_ids if before[s][-1] == src
                       and m.block_table(s)[-1] == dst]
                events.append(Event("copy", f"#{src} -> #{dst}: {', '.join(who)} wrote into a "
                                            f"shared block, so it gets its own copy first"))
            for s in group.seq_ids:
                pos = m.seq_len(s) - 1
                self.kv.write(s, pos)
                table = m.block_table(s)
                if len(table) > len(before[s]):
                    events.append(Event("block", f"{self.labels(s)}: last block full, new "
                                                 f"block #{table[-1]}"))
                events.append(Event("append", f"{self.labels(s)}: \"{VOCAB[tokens[s]]}\" -> "
                                              f"slot {m.slot_mapping(s, pos, pos + 1)[0]}"))
            events.append(self._check(group.seq_ids))
            caption = ("Each sample appends its own token. " + (
                f"{len(copies)} copy-on-write copies: the last writer of a shared block keeps "
                f"it and writes in place." if copies else
                "No block is shared where they write any more: no copies."))
            yield self._frame(step, caption, events, group.seq_ids, copies)
        ids = list(group.seq_ids)
        free_group(m, group)
        yield self._frame(8, "The request is done: the whole group is freed at once; every "
                             "block's reference count drops to 0 and the pool is full again.",
                          [Event("free", f"{', '.join(self.labels(s) for s in ids)} freed; "
                                         f"{m.num_free_blocks} of {m.num_blocks} blocks free")],
                          [])


class BeamScene(_SharingScene):
    name = "beam"
    title = "Beam search: forking candidates, freeing dropped beams"
    summary = "beam search of width 3: survivors forked, dropped beams freed"

    def frames(self) -> Iterator[Frame]:
        from minipaged.sharing.sampling import BeamSearch, Candidate

        rng, m, prompt = self._start()
        beam = BeamSearch(m, "query", prompt, width=3)
        self.kv.write(beam.beams[0], 0)
        yield self._frame(0, f"Beam search of width 3 starts from one beam: the {len(prompt)}-"
                             f"token prompt.", [], beam.beams)
        for step in range(1, 8):
            cands = [Candidate(s, int(t), beam.scores[s] + float(np.log(p)))
                     for s in beam.beams
                     for t, p in zip(rng.integers(0, len(VOCAB), 3), rng.dirichlet([1, 1, 1]))]
            old = set(beam.beams)
            beam.step(cands)
            copies = m.take_copies()
            self.kv.copy(copies)
            events = []
            new = [s for s in beam.beams if s not in old]
            dropped = [s for s in old if s not in beam.beams]
            for s in sorted(dropped, key=repr):
                events.append(Event("free", f"{self.labels(s)} dropped: freed (shared blocks "
                                            f"stay for the beams still using them)"))
            parent = None
            for s in beam.beams:  # BeamSearch lists each forked child right after its parent
                if s in old:
                    parent = s
                    continue
                self.kv.fork(parent, s)
                events.append(Event("fork", f"{self.labels(s)} = fork of {self.labels(parent)}"))
            for src, dst in copies:
                events.append(Event("copy", f"#{src} -> #{dst} (copy-on-write)"))
            for s in beam.beams:
                self.kv.write(s, m.seq_len(s) - 1)
            events.append(self._check(beam.beams))
            caption = (f"Step {step}: 9 candidates, the 3 best survive ({len(new)} forked, "
                       f"{len(dropped)} dropped). Beams share their common history.")
            yield self._frame(step, caption, events, beam.beams, copies)
