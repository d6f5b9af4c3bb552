"""Scene ``preempt``: a pool too small for everyone, recovered by swapping and by recomputation.

What it shows (vLLM section 4.5): four requests decode in a pool of 10 blocks that cannot hold
them all at their final lengths. When a decode step needs more blocks than are free
(``blocks_needed_to_append``), the newest request is preempted: the first time by swapping (its
blocks copied to a CPU block pool, ``swap_out`` + ``CPUBlockPool.copy_out``), later by
recomputation (``preempt_by_recompute``: blocks freed, tokens prefilled again later). Preempted
requests come back oldest first, before anything new runs. K/V are a fixed function of each
token's prefix, so the log can check that after a swap round trip or a recompute every
sequence's K/V, read through its block table, equal a cold computation.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from minipaged._checks import cdiv
from minipaged.kit.viz.blocks import cpu_pool
from minipaged.kit.viz.scene import Event, Frame, Scene
from minipaged.kit.viz.scenes.common import VOCAB, PagedKV, blocks_text, random_tokens
from minipaged.kit.viz.state import read_pool
from minipaged.serving.swap import CPUBlockPool, KVCacheManager

NUM_BLOCKS = 10
NUM_CPU_BLOCKS = 8
BLOCK_SIZE = 4
MAX_FRAMES = 24


class PreemptScene(Scene):
    name = "preempt"
    title = "Preemption: swapping out and recomputing when blocks run out"
    summary = "a pool too small: a request swapped to CPU and back, another recomputed"
    vocab = VOCAB

    def frames(self) -> Iterator[Frame]:
        rng = np.random.default_rng(self.seed)
        self.manager = m = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, num_cpu_blocks=NUM_CPU_BLOCKS)
        self.kv = kv = PagedKV(m, rng, prefix_model=True)
        self.cpu = CPUBlockPool(NUM_CPU_BLOCKS, 1, BLOCK_SIZE, kv.key_cache.shape[3])
        self.final: dict[str, int] = {}
        running: list[str] = []
        for sid in ("A", "B", "C", "D"):
            self.labels.name(sid, sid)
            m.allocate(sid, random_tokens(rng, int(rng.integers(3, 6))))
            kv.write(sid, 0)
            self.final[sid] = m.seq_len(sid) + int(rng.integers(8, 15))
            running.append(sid)
        need = sum(cdiv(f, BLOCK_SIZE) for f in self.final.values())
        yield self._frame(f"Four requests run in a pool of {NUM_BLOCKS} blocks; at their final "
                          f"lengths they will need {need} blocks. Something has to give.",
                          [Event("admit", f"{s}: {m.seq_len(s)} prompt tokens, will end at "
                                          f"{self.final[s]}") for s in running])
        swapped: list[str] = []  # oldest first
        recompute: dict[str, list[int]] = {}  # seq -> tokens to prefill again
        step, used_swap = 0, False
        # Until at most one request is left with nobody waiting: from there on it runs alone.
        while (len(running) > 1 or swapped or recompute) and step < MAX_FRAMES:
            step += 1
            events: list[Event] = []
            # 1. bring preempted requests back, oldest first, keeping a block for the step
            while swapped and m.can_swap_in(swapped[:1]) and \
                    m.num_free_blocks - len(m.cpu_block_table(swapped[0])) >= 1:
                sid = swapped.pop(0)
                mapping = m.swap_in([sid])
                self.cpu.copy_in(kv.key_cache, kv.value_cache, mapping)
                running.append(sid)
                events += [Event("swap", f"{sid} swapped in: " + ", ".join(
                    f"cpu#{c} -> #{g}" for c, g in mapping)), self._check()]
            while not swapped and recompute and \
                    m.num_free_blocks - cdiv(len(next(iter(recompute.values()))), BLOCK_SIZE) >= 1:
                sid = next(iter(recompute))
                m.allocate(sid, recompute.pop(sid))
                kv.write(sid, 0)
                running.append(sid)
                events += [Event("admit", f"{sid} re-admitted: its {m.seq_len(sid)} tokens "
                                          f"recomputed as one prefill into blocks "
                                          f"{blocks_text(m.block_table(sid))}"), self._check()]
            # 2. make room for this decode step by preempting the newest request
            while running and m.blocks_needed_to_append(running) > m.num_free_blocks:
                victim = running.pop()
                if not used_swap:  # the first preemption swaps, every later one recomputes
                    used_swap = True
                    gpu = m.block_table(victim)
                    self.cpu.copy_out(kv.key_cache, kv.value_cache, m.swap_out([victim]))
                    swapped.append(victim)
                    events.append(Event("preempt", f"{victim} swapped out to the CPU pool: "
                                                   f"blocks {blocks_text(gpu)} freed"))
                else:
                    recompute.update(m.preempt_by_recompute([victim]))
                    events.append(Event("preempt", f"{victim} preempted by recomputation: its "
                                                   f"blocks are freed, its "
                                                   f"{len(recompute[victim])} tokens kept"))
            # 3. one decode step
            for sid in list(running):
                m.append_slot(sid, int(rng.integers(0, len(VOCAB))))
                kv.write(sid, m.seq_len(sid) - 1)
                if m.seq_len(sid) == self.final[sid]:
                    m.free(sid)
                    running.remove(sid)
                    events.append(Event("free", f"{sid} finished at {self.final[sid]} tokens"))
            waiting = ", ".join([f"{s} (swapped)" for s in swapped] +
                                [f"{s} (to recompute)" for s in recompute]) or "nobody"
            # A re-admitted request's prefill shares the step with the decodes, as vLLM v1 (or v0
            # with chunked prefill) schedules them; v0's default would give it a step of its own.
            mixed = " (a prefill and the decodes in one step)" if any(
                "re-admitted" in e.text for e in events) else ""
            yield self._frame(f"Decode step {step}{mixed}: running "
                              f"{', '.join(running) or 'nobody'}; waiting {waiting}.", events)

    def _check(self) -> Event:
        return self.kv.check([s for s in self.manager.seq_ids if not self.manager.is_swapped(s)])

    def _frame(self, caption: str, events: list[Event]) -> Frame:
        lens = {s: f for s, f in self.final.items() if s in self.manager.seq_ids}
        free_cpu = f"CPU pool: {self.manager.num_free_cpu_blocks} of {NUM_CPU_BLOCKS} blocks free"
        view = read_pool(self.manager)
        return self.pool_frame(caption, events, cpu_pool(view, self.labels),  # "empty" says all
                               *([free_cpu] if view.swapped else []), view=view, final_lens=lens)
