"""Scene ``preempt``: a pool too small for everyone, recovered by swapping and by recomputation.

What it shows (vLLM section 4.5): three requests decode in a pool of 10 blocks of 4 slots that
cannot hold all of them at their final lengths. Before each decode step the scene asks the
manager how many blocks the step needs (``blocks_needed_to_append``); when that exceeds the free
blocks, the most recently admitted request is preempted, the first time by *swapping* (its
blocks are copied to a CPU block pool with real arrays, ``swap_out`` + ``CPUBlockPool.copy_out``)
and afterwards by *recomputation* (its blocks are freed, ``preempt_by_recompute``, and its
tokens are prefilled again later). A preempted request comes back, oldest first, as soon as its
blocks fit, and nothing new runs before it. K/V are a fixed function of each token's prefix, so
the step log can check that after a swap round trip or a recompute every sequence's K/V, read
through its block table, equal a cold computation.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from rich.console import Group
from rich.text import Text

from minipaged.kit.viz.blocks import block_tables, cpu_pool, memory_map
from minipaged.kit.viz.labels import Labels
from minipaged.kit.viz.palette import NOTE_STYLE
from minipaged.kit.viz.scene import Frame, Scene
from minipaged.kit.viz.scenes.common import VOCAB, PagedKV, blocks_text
from minipaged.kit.viz.state import read_pool
from minipaged.kit.viz.steplog import Event

NUM_BLOCKS = 10
NUM_CPU_BLOCKS = 8
BLOCK_SIZE = 4
MAX_FRAMES = 24


class PreemptScene(Scene):
    name = "preempt"
    title = "Preemption: swapping out and recomputing when blocks run out"
    summary = "a pool too small: a request swapped to CPU and back, another recomputed"
    needs = ("core", "swap")

    def managers(self) -> dict[str, object]:
        return {"pool": self.manager}

    def frames(self) -> Iterator[Frame]:
        from minipaged.serving.swap import CPUBlockPool, KVCacheManager

        rng = np.random.default_rng(self.seed)
        self.manager = m = KVCacheManager(NUM_BLOCKS, BLOCK_SIZE, num_cpu_blocks=NUM_CPU_BLOCKS)
        self.kv = kv = PagedKV(m, rng, prefix_model=True)
        self.cpu = CPUBlockPool(NUM_CPU_BLOCKS, 1, BLOCK_SIZE, kv.key_cache.shape[3])
        self.labels = Labels()
        final = {}
        running: list[str] = []
        for sid in ("A", "B", "C", "D"):
            self.labels.name(sid, sid)
            prompt = [int(t) for t in rng.integers(0, len(VOCAB), int(rng.integers(3, 6)))]
            m.allocate(sid, prompt)
            kv.write(sid, 0)
            final[sid] = len(prompt) + int(rng.integers(8, 15))
            running.append(sid)
        self.final = final
        need = sum(-(-f // BLOCK_SIZE) for f in final.values())
        yield self._frame(0, f"Four requests run in a pool of {NUM_BLOCKS} blocks; at their "
                             f"final lengths they will need {need} blocks. Something has to "
                             f"give.", [Event("admit", f"{s}: {m.seq_len(s)} prompt tokens, "
                                                       f"will end at {final[s]}")
                                        for s in running])
        swapped: list[str] = []  # oldest first
        recompute: dict[str, list[int]] = {}  # seq -> tokens to prefill again
        used_swap = False
        step = 0
        # Until at most one request is left with nobody waiting: from there on it runs alone.
        while (len(running) > 1 or swapped or recompute) and step < MAX_FRAMES:
            step += 1
            events: list[Event] = []
            # 1. bring preempted requests back, oldest first, before anything else
            for sid in list(swapped):
                if m.can_swap_in([sid]) and m.num_free_blocks - len(m.cpu_block_table(sid)) >= 1:
                    mapping = m.swap_in([sid])
                    self.cpu.copy_in(kv.key_cache, kv.value_cache, mapping)
                    swapped.remove(sid)
                    running.append(sid)
                    events.append(Event("swap", f"{sid} swapped in: " + ", ".join(
                        f"cpu#{c} -> #{g}" for c, g in mapping)))
                    events.append(self._check())
                else:
                    break
            for sid in list(recompute):
                if swapped or m.num_free_blocks - -(-len(recompute[sid]) // BLOCK_SIZE) < 1:
                    break
                m.allocate(sid, recompute.pop(sid))
                kv.write(sid, 0)
                running.append(sid)
                events.append(Event("admit", f"{sid} re-admitted: its {m.seq_len(sid)} tokens "
                                             f"recomputed as one prefill into blocks "
                                             f"{blocks_text(m.block_table(sid))}"))
                events.append(self._check())
            # 2. make room for this decode step by preempting the newest request
            while running and m.blocks_needed_to_append(running) > m.num_free_blocks:
                victim = running.pop()
                if not used_swap:
                    gpu = m.block_table(victim)
                    mapping = m.swap_out([victim])
                    self.cpu.copy_out(kv.key_cache, kv.value_cache, mapping)
                    swapped.append(victim)
                    used_swap = True
                    events.append(Event("preempt", f"{victim} swapped out to the CPU pool: "
                                                   f"blocks {blocks_text(gpu)} freed"))
                else:
                    recompute.update(m.preempt_by_recompute([victim]))
                    events.append(Event("preempt", f"{victim} preempted by recomputation: its "
                                                   f"blocks are freed, its "
                                                   f"{len(recompute[victim])} tokens kept"))
            # 3. one decode step
            for sid in list(running):
                tok = int(rng.integers(0, len(VOCAB)))
                m.append_slot(sid, tok)
                kv.write(sid, m.seq_len(sid) - 1)
                if m.seq_len(sid) == final[sid]:
                    m.free(sid)
                    running.remove(sid)
                    events.append(Event("free", f"{sid} finished at {final[sid]} tokens"))
            waiting = ", ".join([f"{s} (swapped)" for s in swapped] +
                                [f"{s} (to recompute)" for s in recompute]) or "nobody"
            caption = (f"Decode step {step}: running {', '.join(running) or 'nobody'}; "
                       f"waiting {waiting}.")
            yield self._frame(step, caption, events)

    def _check(self) -> Event:
        ok = self.kv.all_intact([s for s in self.manager.seq_ids
                                 if not self.manager.is_swapped(s)])
        return Event("check", f"K/V read through every block table equal a cold computation: "
                              f"{ok}")

    def _frame(self, step: int, caption: str, events: list[Event]) -> Frame:
        view = read_pool(self.manager)
        lens = {s: self.final[s] for s in self.final if s in self.manager.seq_ids}
        body = Group(block_tables(view, self.labels, vocab=VOCAB, width=self.width,
                                  final_lens=lens), Text(""),
                     memory_map(view, self.labels, width=self.width), Text(""),
                     cpu_pool(view, self.labels),
                     Text(f"CPU pool: {self.manager.num_free_cpu_blocks} of {NUM_CPU_BLOCKS} "
                          f"blocks free", NOTE_STYLE))
        return self.frame(step, caption, body, events, pool=view)
