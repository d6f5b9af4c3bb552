"""Scene ``fragmentation``: the same requests in contiguous caches and in a paged cache.

What it shows (vLLM section 3, Fig. 2): four caches of the same 128 slots serve the same eight
requests, first come first served. Three reserve one contiguous region per request when it is
admitted, sized by Orca's policies (max_seq_len, the next power of two of the final length, or
exactly the final length); the fourth is a ``KVCacheManager`` that takes a 4-slot block only when
the last one is full. Each cache is drawn one character per slot, from its own state, with its
own ``usage()`` report as a waste bar.

Admission, the same for all four: the oldest waiting request is admitted as soon as memory for it
is there (head-of-line, no overtaking). For a contiguous cache that is its whole reservation. The
paged cache, like vLLM, admits a request when its prompt's blocks are free, and takes more blocks
as tokens arrive; when a decode step finds no free block it preempts the most recently admitted
request by recomputation (its blocks are freed; it waits at the head of the queue and re-enters
with all its tokens as a new prompt: vLLM section 4.5). A "step" is one decode iteration of every
running request; a prompt is written in the step it is admitted.

The last frame shows each cache's usage averaged over all steps, the way Fig. 2 averages.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import numpy as np
from rich.console import Group
from rich.text import Text

from minipaged.kit.viz.arena import slot_strip, strip_legend, waste_bars
from minipaged.kit.viz.labels import Labels
from minipaged.kit.viz.scene import Frame, Scene
from minipaged.kit.viz.scenes.common import random_kv, random_requests
from minipaged.kit.viz.state import read_arena, read_pool
from minipaged.kit.viz.steplog import Event

NUM_SLOTS = 128
MAX_SEQ_LEN = 32
BLOCK_SIZE = 4
NUM_REQUESTS = 12
STRIDE = 3  # decode steps between two frames


class _System:
    """One cache and its FCFS queue. ``kind`` is a contiguous policy or "paged"."""

    def __init__(self, kind: str, requests) -> None:
        from minipaged.contiguous.cache import ContiguousKVCache
        from minipaged.serving.swap import KVCacheManager

        self.kind = kind
        self.requests = {r.seq_id: r for r in requests}
        self.waiting = deque(r.seq_id for r in requests)
        self.tokens = {r.seq_id: list(r.prompt) for r in requests}  # paged: for recompute
        self.running: list[int] = []
        self.done: list[int] = []
        self.done_at: int | None = None
        self.peak_running = 0
        self.preemptions = 0
        self.usage_sum = None  # KVUsage summed over steps (time average = fractions of the sum)
        self.log: dict[str, list[str]] = {"admit": [], "free": [], "preempt": [], "wait": []}
        if kind == "paged":
            self.cache = KVCacheManager(NUM_SLOTS // BLOCK_SIZE, BLOCK_SIZE)
        else:
            self.cache = ContiguousKVCache(NUM_SLOTS, 1, 2, policy=kind, max_seq_len=MAX_SEQ_LEN)

    def fits(self, seq_id: int) -> tuple[bool, str]:
        r = self.requests[seq_id]
        if self.kind == "paged":
            n = len(self.tokens[seq_id])
            need, free = -(-n // BLOCK_SIZE), self.cache.num_free_blocks
            return self.cache.can_allocate(n), f"needs {need} blocks, {free} free"
        size = self.cache.reservation_size(r.final_len)
        ok = self.cache.can_reserve(len(r.prompt), r.final_len)
        return ok, f"needs {size} contiguous slots, largest free {self.cache.largest_free()}"

    def next_need(self) -> int | None:
        """The region the next waiting request needs: what external fragmentation is judged by."""
        if self.kind == "paged" or not self.waiting:
            return None
        return self.cache.reservation_size(self.requests[self.waiting[0]].final_len)

    def final_lens(self) -> dict[int, int]:
        return {s: self.requests[s].final_len for s in self.running}

    def usage(self):
        if self.kind == "paged":
            return self.cache.usage(self.final_lens())
        return self.cache.usage(self.next_need())

    def take_log(self) -> Event | None:
        """This frame's story of this cache in one line, then forget it."""
        verbs = {"preempt": "preempted", "admit": "admitted", "free": "finished",
                 "wait": "waits"}
        kinds = [k for k in verbs if self.log[k]]
        if not kinds:
            return None
        text = "; ".join(f"{verbs[k]} " + ", ".join(self.log[k]) for k in
                         ("admit", "free", "preempt", "wait") if self.log[k])
        for k in kinds:
            self.log[k] = []
        return Event(kinds[0], f"{self.kind}: {text}")


class FragmentationScene(Scene):
    name = "fragmentation"
    title = "Fragmentation: contiguous reservations vs paged blocks"
    summary = "the same requests in max / pow2 / oracle contiguous caches and a paged cache"
    needs = ("core", "contiguous")
    log_title = f"in the last {STRIDE} steps"

    def frames(self) -> Iterator[Frame]:
        rng = np.random.default_rng(self.seed)
        requests = random_requests(rng, NUM_REQUESTS, prompt=(2, 8), output=(4, 20),
                                   max_len=MAX_SEQ_LEN)
        self.labels = Labels()
        for r in requests:
            self.labels(r.seq_id)
        self.systems = [_System(k, requests) for k in ("max", "pow2", "oracle", "paged")]
        self.requests = requests
        lens = ", ".join(f"{self.labels(r.seq_id)} {len(r.prompt)}->{r.final_len}"
                         for r in requests)
        step = 0
        yield self._frame(step, f"{NUM_REQUESTS} requests (prompt -> final tokens): {lens}. "
                                f"Each cache has {NUM_SLOTS} slots; contiguous ones reserve at "
                                f"most max_seq_len={MAX_SEQ_LEN}.", [])
        while any(s.done_at is None for s in self.systems):
            step += 1
            for sys_ in self.systems:
                self._tick(sys_, step, rng)
            if step % STRIDE == 0 or all(s.done_at is not None for s in self.systems):
                events = [e for s in self.systems if (e := s.take_log())]
                yield self._frame(step, self._caption(step), events)
        yield self._summary(step)

    # ---- one decode step of one system -------------------------------------------------------
    def _tick(self, s: _System, step: int, rng: np.random.Generator) -> None:
        if s.done_at is not None:
            return
        name = self.labels
        for seq_id in list(s.running):  # decode: one new token for every running request
            if seq_id not in s.running:
                continue  # preempted earlier in this step
            r = s.requests[seq_id]
            if s.kind == "paged":
                while (seq_id in s.running and
                       s.cache.blocks_needed_to_append([seq_id]) > s.cache.num_free_blocks):
                    victim = s.running.pop()  # the most recently admitted goes first
                    s.tokens[victim] = s.cache.preempt_by_recompute([victim])[victim]
                    s.waiting.appendleft(victim)
                    s.preemptions += 1
                    s.log["preempt"].append(name(victim))
                if seq_id not in s.running:
                    continue
                tok = int(rng.integers(0, 64))
                s.cache.append_slot(seq_id, tok)
                s.tokens[seq_id].append(tok)
            else:
                s.cache.write(seq_id, *random_kv(rng, 1, 1, 2))
            length = s.cache.seq_len(seq_id)
            if length == r.final_len:
                (s.cache.free if s.kind == "paged" else s.cache.release)(seq_id)
                s.running.remove(seq_id)
                s.done.append(seq_id)
                s.log["free"].append(name(seq_id))
        while s.waiting:  # admission, oldest first, no overtaking
            seq_id = s.waiting[0]
            ok, why = s.fits(seq_id)
            if not ok:
                msg = f"{name(seq_id)} ({why})"
                if msg not in s.log["wait"]:
                    s.log["wait"] = [msg]
                break
            r = s.requests[s.waiting.popleft()]
            if s.kind == "paged":
                s.cache.allocate(seq_id, s.tokens[seq_id])
            else:
                s.cache.reserve(seq_id, len(r.prompt), r.final_len)
                s.cache.write(seq_id, *random_kv(rng, len(r.prompt), 1, 2))
            s.running.append(seq_id)
            s.log["admit"].append(name(seq_id))
        s.peak_running = max(s.peak_running, len(s.running))
        u = s.usage()
        s.usage_sum = u if s.usage_sum is None else s.usage_sum + u
        if not s.running and not s.waiting:
            s.done_at = step

    def _caption(self, step: int) -> str:
        return (f"After {step} decode steps. Capital letter: a token's K/V; small letter: "
                f"reserved for a token still to come; × and !: memory nobody will use.")

    def _summary(self, step: int) -> Frame:
        rows = [(s.kind, s.usage_sum) for s in self.systems]
        lines = [Text(f"{s.kind:<7} all done after {s.done_at:>3} steps   at most "
                      f"{s.peak_running} requests at once   token share "
                      f"{100 * s.usage_sum.fractions()['token']:.0f}%"
                      + (f"   {s.preemptions} preemptions" if s.kind == "paged" else ""))
                 for s in self.systems]
        body = Group(waste_bars(rows, width=self.width,
                                title="usage averaged over every step (as in Fig. 2)"),
                     Text(""), *lines)
        caption = ("The whole run, averaged: the paper measured 20.4-38.2% of the cache holding "
                   "tokens for the Orca policies and about 96% for vLLM (OPT-13B, ShareGPT).")
        events = [Event("check", "every figure above is summed from each cache's own usage() "
                                 "at every step")]
        return self.frame(step, caption, body, events, **self.views())

    def managers(self) -> dict[str, object]:
        return {s.kind: s.cache for s in self.systems}

    def views(self) -> dict[str, object]:
        out: dict[str, object] = {"final_lens": {"paged": self.systems[-1].final_lens()}}
        for s in self.systems:
            if s.kind == "paged":
                out["paged"] = read_pool(s.cache)
            else:
                out[s.kind] = read_arena(s.cache, s.next_need())
        return out

    def _frame(self, step: int, caption: str, events: list[Event]) -> Frame:
        views = self.views()
        strips, bars = [], []
        for s in self.systems:
            v = views[s.kind]
            note = (f"running {len(s.running)}   waiting {len(s.waiting)}   "
                    f"done {len(s.done)}" + (f"   (all done after {s.done_at} steps)"
                                             if s.done_at is not None else ""))
            if s.kind == "paged":
                slots = v.slot_categories(s.final_lens())
            else:
                slots = v.slot_categories()
            strips.append(slot_strip(s.kind, slots, self.labels, width=self.width, note=note))
            bars.append((s.kind, s.usage()))
        body = Group(*strips, strip_legend(), Text(""), waste_bars(bars, width=self.width))
        return self.frame(step, caption, body, events, **views)
