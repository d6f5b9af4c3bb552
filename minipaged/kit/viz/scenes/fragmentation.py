"""Scene ``fragmentation``: the same requests in contiguous caches and in a paged cache.

What it shows (vLLM section 3, Fig. 2): four caches of 128 slots serve the same twelve requests,
first come first served. Three reserve one contiguous region per request at admission, sized by
Orca's policies (``contiguous/cache.py``) and placed by a buddy allocator, so a region of R slots
must be cut from one free, aligned block of next_pow2(R) slots: free slots split into smaller
blocks cannot serve it, even side by side. The fourth is a ``KVCacheManager`` that takes a block
only when the last one is full and, like vLLM, preempts the newest request by recomputation when
a token finds no free block (section 4.5). One step: every running request appends one token
(finishing ones free their memory), then waiting requests are admitted, oldest first, while
their memory is free. Each cache is drawn from its own state with its own ``usage()``; the last
frame averages usage over all steps, as Fig. 2 does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import numpy as np
from rich.console import Group
from rich.text import Text

from minipaged._checks import cdiv
from minipaged.contiguous.buddy import next_pow2
from minipaged.contiguous.cache import ContiguousKVCache
from minipaged.kit.viz.arena import slot_strip, strip_legend, waste_bars
from minipaged.kit.viz.scene import Event, Frame, Scene
from minipaged.kit.viz.scenes.common import random_kv, random_requests
from minipaged.kit.viz.state import read_arena, read_pool
from minipaged.serving.swap import KVCacheManager

NUM_SLOTS = 128
MAX_SEQ_LEN = 32
BLOCK_SIZE = 4
NUM_REQUESTS = 12
STRIDE = 3  # steps between two frames
KINDS = ("max", "pow2", "oracle", "paged")


class CacheQueue:
    """One cache and its FCFS queue. ``kind`` is a contiguous policy or "paged"."""

    def __init__(self, kind: str, requests) -> None:
        self.kind = kind
        self.requests = {r.seq_id: r for r in requests}
        self.waiting = deque(r.seq_id for r in requests)
        self.tokens = {r.seq_id: list(r.prompt) for r in requests}  # paged: what to recompute
        self.admitted_at: dict[int, int] = {}
        self.running: list[int] = []
        self.done: list[int] = []
        self.done_at: int | None = None
        self.peak_running = self.preemptions = 0
        self.usage_sum = None  # KVUsage summed over steps: its fractions are the time average
        self.log: dict[str, list[int]] = {"admitted": [], "finished": [], "preempted": []}
        if kind == "paged":
            self.cache = KVCacheManager(NUM_SLOTS // BLOCK_SIZE, BLOCK_SIZE)
        else:
            self.cache = ContiguousKVCache(NUM_SLOTS, 1, 2, policy=kind, max_seq_len=MAX_SEQ_LEN)

    def fits(self, seq_id: int) -> tuple[bool, str]:
        """Whether the request can be admitted now, and why not, in the cache's own numbers."""
        if self.kind == "paged":
            n = len(self.tokens[seq_id])
            return (self.cache.can_allocate(n), f"needs {cdiv(n, BLOCK_SIZE)} blocks, "
                                                f"{self.cache.num_free_blocks} free")
        r = self.requests[seq_id]
        ok = self.cache.can_reserve(len(r.prompt), r.final_len)
        size, free = self.cache.reservation_size(len(r.prompt), r.final_len), self.cache.num_free
        if free < size:
            return ok, f"needs {size} contiguous slots, {free} free"
        pieces = sorted((n for _, n in self.cache.allocator.free_blocks()), reverse=True)
        return ok, (f"needs {size} contiguous slots, so a free aligned buddy block of "
                    f"{next_pow2(size)}; the {free} free slots are buddy blocks of "
                    f"{'+'.join(map(str, pieces))}")

    def next_need(self) -> int | None:
        """The region the next waiting request needs: what external fragmentation is judged by."""
        if self.kind == "paged" or not self.waiting:
            return None
        r = self.requests[self.waiting[0]]
        return self.cache.reservation_size(len(r.prompt), r.final_len)

    def final_lens(self) -> dict[int, int]:
        return {s: self.requests[s].final_len for s in self.running}

    def usage(self):
        if self.kind == "paged":
            return self.cache.usage(self.final_lens())
        return self.cache.usage(self.next_need())

    def view(self):
        return read_pool(self.cache) if self.kind == "paged" else read_arena(self.cache,
                                                                            self.next_need())

    def slots(self):
        """Each slot as (category, owner), the way the cache's own ``usage()`` counts."""
        if self.kind == "paged":
            return self.view().slot_categories(self.final_lens())
        return self.view().slot_categories()

    def step(self, step: int, rng: np.random.Generator) -> None:
        if self.done_at is not None:
            return
        for seq_id in list(self.running):  # every running request appends one token
            if seq_id not in self.running:
                continue  # preempted earlier in this step
            if self.kind == "paged":
                while (seq_id in self.running and self.cache.blocks_needed_to_append([seq_id])
                       > self.cache.num_free_blocks):
                    victim = self.running.pop()  # the most recently admitted goes first
                    self.tokens[victim] = self.cache.preempt_by_recompute([victim])[victim]
                    self.waiting.appendleft(victim)
                    self.preemptions += 1
                    self.log["preempted"].append(victim)
                if seq_id not in self.running:
                    continue
                tok = int(rng.integers(0, 64))
                self.cache.append_slot(seq_id, tok)
                self.tokens[seq_id].append(tok)
            else:
                self.cache.write(seq_id, *random_kv(rng, 1, 1, 2))
            if self.cache.seq_len(seq_id) == self.requests[seq_id].final_len:
                (self.cache.free if self.kind == "paged" else self.cache.release)(seq_id)
                self.running.remove(seq_id)
                self.done.append(seq_id)
                self.log["finished"].append(seq_id)
        while self.waiting and self.fits(self.waiting[0])[0]:  # oldest first, no overtaking
            seq_id = self.waiting.popleft()
            r = self.requests[seq_id]
            if self.kind == "paged":
                self.cache.allocate(seq_id, self.tokens[seq_id])
            else:
                self.cache.reserve(seq_id, len(r.prompt), r.final_len)
                self.cache.write(seq_id, *random_kv(rng, len(r.prompt), 1, 2))
            self.running.append(seq_id)
            self.admitted_at[seq_id] = step
            self.log["admitted"].append(seq_id)
        self.peak_running = max(self.peak_running, len(self.running))
        u = self.usage()
        self.usage_sum = u if self.usage_sum is None else self.usage_sum + u
        if not self.running and not self.waiting:
            self.done_at = step

    def take_log(self, labels) -> Event | None:
        """What happened since the last frame, and who waits now and why (read at frame time),
        in one line; then forget it."""
        parts = [f"{verb} " + ", ".join(labels(s) for s in ids)
                 for verb, ids in self.log.items() if ids]
        if self.waiting:
            head = self.waiting[0]
            parts.append(f"{labels(head)} waits ({self.fits(head)[1]})")
        if not parts:
            return None
        kind = ("preempt" if self.log["preempted"] else "admit" if self.log["admitted"] else
                "free" if self.log["finished"] else "wait")
        self.log = {k: [] for k in self.log}
        return Event(kind, f"{self.kind}: " + "; ".join(parts))


class FragmentationScene(Scene):
    name = "fragmentation"
    title = "Fragmentation: contiguous reservations vs paged blocks"
    summary = "the same requests in max / pow2 / oracle contiguous caches and a paged cache"
    log_title = f"in the last {STRIDE} steps"

    def frames(self) -> Iterator[Frame]:
        rng = np.random.default_rng(self.seed)
        requests = random_requests(rng, NUM_REQUESTS, prompt=(2, 8), output=(4, 20),
                                   max_len=MAX_SEQ_LEN)
        for r in requests:
            self.labels(r.seq_id)
        self.systems = [CacheQueue(k, requests) for k in KINDS]
        lens = ", ".join(f"{self.labels(r.seq_id)} {len(r.prompt)}->{r.final_len}"
                         for r in requests)
        yield self._frame(f"{NUM_REQUESTS} requests (prompt -> final tokens): {lens}. Each cache "
                          f"has {NUM_SLOTS} slots; contiguous ones reserve at most "
                          f"max_seq_len={MAX_SEQ_LEN}.", [])
        step = 0
        while any(s.done_at is None for s in self.systems):
            step += 1
            for system in self.systems:
                system.step(step, rng)
            if step % STRIDE == 0 or all(s.done_at is not None for s in self.systems):
                events = [e for s in self.systems if (e := s.take_log(self.labels))]
                yield self._frame(self._caption(step), events)
        yield self._summary()

    def _caption(self, step: int) -> str:
        """The step, and what it means for one running request of the first cache that has one
        (its token count is the cache's own ``seq_len``)."""
        caption = (f"After step {step}. Each step appends one token to every running request, "
                   f"then admits what fits.")
        example = next((s for s in self.systems[:3] if s.running), None)
        if example is not None:
            seq_id = example.running[0]
            since = step - example.admitted_at[seq_id]
            prompt = len(example.requests[seq_id].prompt)
            caption += (f" {self.labels(seq_id)} in {example.kind}, admitted at step "
                        f"{example.admitted_at[seq_id]} with {prompt} prompt tokens, holds "
                        f"{prompt} + {since} = {example.cache.seq_len(seq_id)} tokens.")
        return caption

    def _summary(self) -> Frame:
        lines = [Text(f"{s.kind:<7} all done after {s.done_at:>3} steps   at most "
                      f"{s.peak_running} requests at once   token share "
                      f"{100 * s.usage_sum.fractions()['token']:.0f}%"
                      + (f"   {s.preemptions} preemptions" if s.kind == "paged" else ""))
                 for s in self.systems]
        body = Group(waste_bars([(s.kind, s.usage_sum) for s in self.systems], width=self.width,
                                title="usage averaged over every step (as in Fig. 2)"),
                     Text(""), *lines)
        caption = ("The whole run, averaged: the paper measured 20.4-38.2% of the cache holding "
                   "tokens for the Orca policies and about 96% for vLLM (OPT-13B, ShareGPT; "
                   "section 1, Fig. 2).")
        events = [Event("check", "every figure above is summed from each cache's own usage() "
                                 "at every step")]
        return self.frame(caption, body, events, **self.views())

    def managers(self) -> dict[str, object]:
        return {s.kind: s.cache for s in self.systems}

    def views(self) -> dict[str, object]:
        views: dict[str, object] = {s.kind: s.view() for s in self.systems}
        views["final_lens"] = {"paged": self.systems[-1].final_lens()}
        return views

    def _frame(self, caption: str, events: list[Event]) -> Frame:
        parts = []
        for s in self.systems:
            note = (f"running {len(s.running)}   waiting {len(s.waiting)}   done {len(s.done)}"
                    + (f"   (all done after {s.done_at} steps)" if s.done_at else ""))
            parts.append(slot_strip(s.kind, s.slots(), self.labels, width=self.width, note=note))
        bars = waste_bars([(s.kind, s.usage()) for s in self.systems], width=self.width)
        return self.frame(caption, Group(*parts, strip_legend(), Text(""), bars), events,
                          **self.views())
