"""Scene ``paging``: block tables growing token by token, and the slot mapping they produce.

What it shows (vLLM sections 4.2-4.3): a ``KVCacheManager`` with 16 physical blocks of 4 slots.
Three requests arrive; each prompt gets just enough blocks. Every decode step appends one token
to every sequence; ``append_slot`` returns the slot its K/V goes to, and a new block is taken
only when the last one is full. One request finishes and frees its blocks; the next request
takes whichever blocks are free, so its logical blocks land scattered over the pool, and its
block table is the only thing that knows the order. Each step's ``slot_mapping`` (the array
``reshape_and_cache`` scatters K/V with) is printed with the arithmetic behind each slot.
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
from minipaged.kit.viz.scenes.common import VOCAB, blocks_text, ids_text, random_requests, words
from minipaged.kit.viz.state import read_pool
from minipaged.kit.viz.steplog import Event

NUM_BLOCKS = 16
BLOCK_SIZE = 4


class PagingScene(Scene):
    name = "paging"
    title = "Paging: block tables and the slot mapping"
    summary = "block tables growing token by token; slot = block * block_size + offset"

    def frames(self) -> Iterator[Frame]:
        from minipaged.serving.swap import KVCacheManager

        rng = np.random.default_rng(self.seed)
        self.manager = m = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE)
        self.labels = Labels()
        reqs = random_requests(rng, 4, prompt=(3, 9), output=(4, 8), max_len=24)
        for r in reqs:
            self.labels(r.seq_id)
        a, b, c, d = reqs
        step = 0
        yield self._frame(step, f"An empty pool: {NUM_BLOCKS} physical blocks of {BLOCK_SIZE} "
                                f"slots. Nothing is reserved ahead of time.", [], "")
        for r in (a, b, c):
            step += 1
            yield self._admit(step, r)
        for _ in range(3):
            step += 1
            yield self._decode(step, [a.seq_id, b.seq_id, c.seq_id], rng)
        step += 1
        freed = m.block_table(b.seq_id)
        m.free(b.seq_id)
        yield self._frame(step, f"{self.labels(b.seq_id)} finished: its blocks go back to the "
                                f"free list, in no particular place.",
                          [Event("free", f"{self.labels(b.seq_id)}: blocks {blocks_text(freed)} "
                                         f"are free again")], "")
        step += 1
        yield self._admit(step, d)
        for _ in range(3):
            step += 1
            yield self._decode(step, [a.seq_id, c.seq_id, d.seq_id], rng)

    def managers(self) -> dict[str, object]:
        return {"pool": self.manager}

    def _admit(self, step: int, r) -> Frame:
        m, name = self.manager, self.labels(r.seq_id)
        m.allocate(r.seq_id, r.prompt)
        table = m.block_table(r.seq_id)
        slots = m.slot_mapping(r.seq_id, 0, len(r.prompt))
        scattered = any(y != x + 1 for x, y in zip(table, table[1:]))
        caption = (f"{name} arrives with a prompt of {len(r.prompt)} tokens: it gets "
                   f"{len(table)} block(s), just enough; the last one has room to grow.")
        if scattered:
            caption += " Its blocks are not next to each other, and that is fine."
        events = [Event("admit", f"{name}: \"{words(r.prompt)}\" -> blocks {blocks_text(table)}"),
                  Event("note", f"slot_mapping({name}, 0, {len(r.prompt)}) = {ids_text(slots)}")]
        return self._frame(step, caption, events, f"prefill {name}: slot_mapping = "
                                                  f"{ids_text(slots, 16)}")

    def _decode(self, step: int, seq_ids: list[int], rng: np.random.Generator) -> Frame:
        m, bs = self.manager, BLOCK_SIZE
        events, slots = [], []
        for s in seq_ids:
            before = len(m.block_table(s))
            pos = m.seq_len(s)
            tok = int(rng.integers(0, len(VOCAB)))
            slot = m.append_slot(s, tok)
            slots.append(slot)
            table = m.block_table(s)
            name = self.labels(s)
            if len(table) > before:
                events.append(Event("block", f"{name}: block full, takes a new block "
                                             f"#{table[-1]} as logical block {len(table) - 1}"))
            events.append(Event("append", f"{name}: \"{VOCAB[tok]}\" at position {pos} -> "
                                          f"logical block {pos // bs}, offset {pos % bs} -> "
                                          f"slot {table[pos // bs]}*{bs}+{pos % bs} = {slot}"))
        caption = ("One decode step: every sequence appends one token. A new block is taken "
                   "only when the last one is full.")
        return self._frame(step, caption, events,
                           f"this step's slot_mapping = {ids_text(slots)} (one slot per token)")

    def _frame(self, step: int, caption: str, events: list[Event], mapping: str) -> Frame:
        view = read_pool(self.manager)
        parts = [block_tables(view, self.labels, vocab=VOCAB, width=self.width), Text(""),
                 memory_map(view, self.labels, width=self.width)]
        if mapping:
            parts += [Text(""), Text(mapping, NOTE_STYLE)]
        return self.frame(step, caption, Group(*parts), events, pool=view)
