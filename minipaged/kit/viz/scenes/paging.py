"""Scene ``paging``: block tables growing token by token, and the slot mapping they produce.

What it shows (vLLM sections 4.2-4.3): a ``KVCacheManager`` of 16 blocks of 4 slots. Each prompt
gets just enough blocks; every decode step appends one token per sequence, and ``append_slot``
returns the slot its K/V goes to (a new block only when the last one is full). A finished
request frees its blocks; the next one takes whichever are free, so its logical blocks land
scattered and its block table is the only thing that knows their order. Each step's slot
mapping (what ``reshape_and_cache`` scatters K/V with) is printed with its arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from minipaged.kit.viz.scene import Event, Frame, Scene
from minipaged.kit.viz.scenes.common import VOCAB, blocks_text, ids_text, random_requests, words
from minipaged.serving.swap import KVCacheManager

NUM_BLOCKS = 16
BLOCK_SIZE = 4


class PagingScene(Scene):
    name = "paging"
    title = "Paging: block tables and the slot mapping"
    summary = "block tables growing token by token; slot = block * block_size + offset"
    vocab = VOCAB

    def frames(self) -> Iterator[Frame]:
        rng = np.random.default_rng(self.seed)
        self.manager = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE)
        a, b, c, d = random_requests(rng, 4, prompt=(3, 9), output=(4, 8), max_len=24)
        for r in (a, b, c, d):
            self.labels(r.seq_id)
        yield self._frame(f"An empty pool: {NUM_BLOCKS} physical blocks of {BLOCK_SIZE} slots. "
                          f"Nothing is reserved ahead of time.", [])
        for r in (a, b, c):
            yield self._admit(r)
        for _ in range(3):
            yield self._decode([a.seq_id, b.seq_id, c.seq_id], rng)
        freed = self.manager.block_table(b.seq_id)
        self.manager.free(b.seq_id)
        name = self.labels(b.seq_id)
        yield self._frame(f"{name} finished: its blocks go back to the free list, in no "
                          f"particular place.",
                          [Event("free", f"{name}: blocks {blocks_text(freed)} are free again")])
        yield self._admit(d)
        for _ in range(3):
            yield self._decode([a.seq_id, c.seq_id, d.seq_id], rng)

    def _admit(self, r) -> Frame:
        m, name = self.manager, self.labels(r.seq_id)
        m.allocate(r.seq_id, r.prompt)
        table = m.block_table(r.seq_id)
        slots = m.slot_mapping(r.seq_id, 0, len(r.prompt))
        room = -m.seq_len(r.seq_id) % BLOCK_SIZE  # free slots left in its last block
        caption = (f"{name} arrives with a prompt of {len(r.prompt)} tokens: it gets "
                   f"{len(table)} block{'s' * (len(table) != 1)}, just enough; " +
                   (f"its last block has {room} free slot{'s' * (room > 1)} for the next tokens."
                    if room else
                    "all are full, so its next token will take a new block."))
        if any(y != x + 1 for x, y in zip(table, table[1:])):
            caption += " Its blocks are not next to each other, and that is fine."
        events = [Event("admit", f"{name}: \"{words(r.prompt)}\" -> blocks {blocks_text(table)}"),
                  Event("note", f"slot_mapping({name}, 0, {len(r.prompt)}) = {ids_text(slots)}")]
        return self._frame(caption, events, f"prefill {name}: slot_mapping = "
                                            f"{ids_text(slots, 16)}")

    def _decode(self, seq_ids: list[int], rng: np.random.Generator) -> Frame:
        m, bs = self.manager, BLOCK_SIZE
        events, slots = [], []
        for s in seq_ids:
            before, pos = len(m.block_table(s)), m.seq_len(s)
            tok = int(rng.integers(0, len(VOCAB)))
            slots.append(m.append_slot(s, tok))
            table, name = m.block_table(s), self.labels(s)
            if len(table) > before:
                events.append(Event("block", f"{name}: block full, takes a new block "
                                             f"#{table[-1]} as logical block {len(table) - 1}"))
            events.append(Event("append", f"{name}: \"{VOCAB[tok]}\" at position {pos} -> "
                                          f"logical block {pos // bs}, offset {pos % bs} -> "
                                          f"slot {table[pos // bs]}*{bs}+{pos % bs} = {slots[-1]}"))
        return self._frame("One decode step: every sequence appends one token. A new block is "
                           "taken only when the last one is full.", events,
                           f"this step's slot_mapping = {ids_text(slots)} (one slot per token)")

    def _frame(self, caption: str, events: list[Event], mapping: str = "") -> Frame:
        return self.pool_frame(caption, events, *[mapping] if mapping else [])
