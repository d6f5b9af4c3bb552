"""The short, fixed stories the slides' block-table figures are drawn from.

What it teaches: the same mechanics as lessons 02-06, as scripts small enough to read beside
the pictures. Each story drives a real manager (``KVCacheManager`` or ``ContiguousKVCache``)
through its public methods and takes snapshots (``pool_diagram.read_state``); every number in a
caption is read from the manager after the step it describes. Nothing is random: token ids are
arbitrary fixed integers (only where the prefix cache hashes them do they matter; the
fragmentation figure's come from a fixed seed and show nowhere), so a figure changes only when a
manager's behaviour does.
"""

from __future__ import annotations

import functools

import numpy as np

from minipaged import KVCacheManager
from minipaged.contiguous.buddy import next_pow2
from minipaged.kit.diagrams import Drawing, arena_strips
from minipaged.kit.pool_diagram import Marks, draw, read_state
from minipaged.kit.viz.scenes.common import Request, blocks_text, ids_text
from minipaged.kit.viz.scenes.fragmentation import KINDS, MAX_SEQ_LEN, NUM_SLOTS, CacheQueue
from minipaged.kit.viz.state import count_categories

BS = 4


def _tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


@functools.cache
def stories(colors) -> dict[str, Drawing]:
    """name -> drawing, for every block-table figure (``colors``: names -> colour map)."""
    out: dict[str, Drawing] = {}
    for story in (_paging, _fork, _beam, _prefix, _preempt):
        out.update(story(colors))
    return out


def _paging(colors) -> dict[str, Drawing]:
    m = KVCacheManager(12, BS)
    for name, n in (("A", 8), ("B", 7), ("C", 9)):
        m.allocate(name, _tokens(n))
    c_slots = m.slot_mapping("C", 0, 9)
    early = draw(read_state(m), colors(m.seq_ids), [
        f"A, B and C arrive with 8, 7 and 9 tokens and get "
        f"{len(m.block_table('A'))}, {len(m.block_table('B'))} and {len(m.block_table('C'))} "
        f"blocks: just enough, nothing reserved ahead. C's prefill writes slots "
        f"{ids_text(c_slots)}: slot = block × {BS} + offset."],
        "paging: three prompts", Marks(written=set(map(int, c_slots))))
    for _ in range(3):
        for s in ("A", "B", "C"):
            m.append_slot(s, 0)
    freed = m.block_table("B")
    m.free("B")
    m.allocate("D", _tokens(6))
    d_table = m.block_table("D")
    for _ in range(3):
        slots = [m.append_slot(s, 0) for s in ("A", "C", "D")]
    pos = m.seq_len("A") - 1
    table = m.block_table("A")
    late = draw(read_state(m), colors(m.seq_ids), [
        f"B finished; its blocks {blocks_text(freed)} went back to the pool and D's 6-token prompt "
        f"took {blocks_text(d_table)}. After 3 more decode steps, this step's slot_mapping is "
        f"{ids_text(slots)}: A's token at position {pos} is in logical block {pos // BS}, offset "
        f"{pos % BS}: slot {table[pos // BS]} × {BS} + {pos % BS} = {slots[0]}."],
        "paging: decode steps and the slot mapping", Marks(written=set(slots)))
    return {"paging_early": early, "paging_late": late}


def _fork(colors) -> dict[str, Drawing]:
    m = KVCacheManager(10, BS)
    m.allocate("A", _tokens(7))
    for child in ("B", "C"):
        m.fork("A", child)
    shared = draw(read_state(m), colors(m.seq_ids), [
        f"Parallel sampling: A's 7-token prompt is allocated once; B and C are forks of A. "
        f"They share blocks {blocks_text(m.block_table('A'))}, nothing is copied, and each block's "
        f"reference count is {m.ref_count(m.block_table('A')[0])}."],
        "fork: three samples share one prompt")
    before = {s: m.block_table(s)[-1] for s in ("A", "B", "C")}
    slots = {s: m.append_slot(s, 100 + i) for i, s in enumerate(("A", "B", "C"))}
    copies = m.take_copies()
    copiers = [s for s in ("A", "B", "C") if m.block_table(s)[-1] != before[s]]
    keeper = [s for s in ("A", "B", "C") if s not in copiers]
    copied = draw(read_state(m), colors(m.seq_ids), [
        f"Each sample appends its own token into the shared, partly filled block "
        f"#{before['A']}. {' and '.join(copiers)} write first, so each gets its own copy "
        f"({', '.join(f'#{s} to #{d}' for s, d in copies)}: copy-on-write, applied before the "
        f"step's writes); {keeper[0]}, the last writer, holds #{before['A']} alone and writes in "
        f"place. The full block #{m.block_table('A')[0]} stays shared."],
        "copy-on-write", Marks(copies={d: s for s, d in copies}, written=set(slots.values())))
    return {"fork_shared": shared, "fork_copied": copied}


def _beam(colors) -> dict[str, Drawing]:
    m = KVCacheManager(10, BS)
    m.allocate("A", _tokens(6))
    for child in ("B", "C"):
        m.fork("A", child)
    for i, s in enumerate(("A", "B", "C")):            # step 1: each beam its own token
        m.append_slot(s, 100 + i)
    m.take_copies()
    # Step 2: A is the best candidate twice, B once, C not at all. As sharing/sampling.py's
    # BeamSearch does, the dropped beam is freed first, so its blocks can serve the copies
    # (reference counts keep the survivors' shared blocks alive in either order).
    c_blocks = m.block_table("C")
    m.free("C")
    freed = [b for b in c_blocks if m.ref_count(b) == 0]
    m.fork("A", "D")
    slots = [m.append_slot(s, 200 + i) for i, s in enumerate(("A", "B", "D"))]
    copies = m.take_copies()
    first = m.block_table("A")[0]
    drawing = draw(read_state(m), colors(m.seq_ids), [
        f"Beam search, width 3, step 2: beam A is extended twice (D is a fork of A), B once, and "
        f"C is dropped: C is freed first (its blocks {blocks_text(c_blocks)} lose one reference "
        f"each; {blocks_text(freed)} is free again), then A is forked. Each beam appends its "
        f"token: "
        + (", ".join(f"#{s} is copied to #{d}" for s, d in copies) or "no copy") +
        f". The prompt's block #{first} is shared by all {m.ref_count(first)} beams."],
        "beam search", Marks(copies={d: s for s, d in copies}, written=set(slots)))
    return {"beam_step": drawing}


def _prefix(colors) -> dict[str, Drawing]:
    m = KVCacheManager(12, BS, enable_prefix_caching=True)
    system = _tokens(8, 1)                              # a shared 8-token system prompt
    m.allocate("R1", system + _tokens(3, 20))
    hits = m.allocate("R2", system + _tokens(4, 30))
    hits_fig = draw(read_state(m), colors(m.seq_ids), [
        f"Prefix caching, as in vLLM v1: both requests start with the same 8-token system prompt. "
        f"Each full block is cached under a hash of its parent's hash and its tokens (vLLM adds "
        f"extra keys; minipaged has none), so R2 "
        f"finds R1's {blocks_text(m.block_table('R2')[:hits // BS])}: {hits} of its 12 prompt "
        f"tokens are hits, and only the rest is computed."],
        "prefix caching: hits")
    m.free("R1")
    m.free("R2")
    cached_before = set(m.allocator.cached_blocks().values())
    plain_free = m.num_free_blocks - len(cached_before)
    m.allocate("R4", _tokens(39, 100))
    evicted = sorted(cached_before - set(m.allocator.cached_blocks().values()))
    need = len(m.block_table("R4"))
    evicted_fig = draw(read_state(m), colors(m.seq_ids), [
        f"R1 and R2 finished; their full blocks stay cached while free. R4, 39 tokens with "
        f"nothing in common, needs {need} blocks and only {plain_free} were never cached, so "
        f"the least recently used cached block{'s' * (len(evicted) > 1)} {blocks_text(evicted)} "
        f"{'are' if len(evicted) > 1 else 'is'} evicted (hash dropped). The system prompt's "
        f"blocks survive: a new request starting with it would still hit."],
        "prefix caching: LRU eviction")
    return {"prefix_hits": hits_fig, "prefix_evicted": evicted_fig}


def _preempt(colors) -> dict[str, Drawing]:
    cpu_blocks = 8
    m = KVCacheManager(10, BS, num_cpu_blocks=cpu_blocks)
    running = []
    for name, n in (("A", 5), ("B", 4), ("C", 5), ("D", 3)):
        m.allocate(name, _tokens(n))
        running.append(name)
    waiting: dict[str, list[int]] = {}
    figs, step = {}, 0
    for mode in ("swap", "recompute"):
        while m.blocks_needed_to_append(running) <= m.num_free_blocks:
            step += 1
            for s in running:
                m.append_slot(s, 0)
        step += 1
        need, free = m.blocks_needed_to_append(running), m.num_free_blocks
        victim = running.pop()                         # the request that arrived last
        gone = m.block_table(victim)
        if mode == "swap":
            m.swap_out([victim])
            what = (f"is swapped out: swap_out copies its {len(gone)} blocks to CPU blocks "
                    f"{' '.join(f'cpu {b}' for b in m.cpu_block_table(victim))} and frees "
                    f"{blocks_text(gone)} on the GPU")
        else:
            waiting.update(m.preempt_by_recompute([victim]))
            what = (f"is preempted by recomputation: its blocks {blocks_text(gone)} are freed and "
                    f"only its {len(waiting[victim])} token ids are kept, to be prefilled again")
        slots = {m.append_slot(s, 0) for s in running}
        state = read_state(m, waiting)
        state.cpu_note = f"CPU pool: {m.num_free_cpu_blocks} of {cpu_blocks} blocks free"
        figs[f"preempt_{mode}"] = draw(state, colors([*m.seq_ids, *waiting]), [
            f"Decode step {step} needs {need} new block{'s' * (need != 1)} and {free} "
            f"{'is' if free == 1 else 'are'} free. {victim}, the newest running request, "
            f"{what}. The others run the step."],
            f"preemption by {mode}", Marks(written=slots))
    return figs


# ---- contiguous reservations next to paging -------------------------------------------------
REQUESTS = {"A": (7, 16), "B": (9, 25), "C": (7, 18), "D": (10, 14), "E": (5, 21),
            "F": (8, 12), "G": (6, 19), "H": (4, 10), "I": (9, 27), "J": (5, 13)}
STEPS = 3


def fragmentation() -> Drawing:
    """The same ten requests (prompt, final length), first come first served, in three
    contiguous caches (Orca's policies, buddy-placed) and a paged one, after ``STEPS`` decode
    steps of the demo's fragmentation scene (``CacheQueue``: 128 slots, blocks of 4): every
    slot coloured by the paper's category (Fig. 2), as the demo's views count them."""
    requests = [Request(s, tuple(_tokens(p)), f) for s, (p, f) in REQUESTS.items()]
    rng = np.random.default_rng(0)  # the K/V and decode tokens written: shown nowhere
    rows = []
    for kind in KINDS:
        q = CacheQueue(kind, requests)
        for step in range(STEPS + 1):  # step 0 admits the first requests
            q.step(step, rng)
        slots = q.slots()
        got, want = count_categories(slots), q.usage().as_dict()
        if any(got[c] != want[c] for c in got):
            raise AssertionError(f"the {kind} picture counts {got}, the cache's usage() {want}")
        status = f"running {len(q.running)} · waiting {len(q.waiting)}"
        if kind != "paged" and q.waiting:  # why the next one waits: buddy placement
            pieces = sorted((n for _, n in q.cache.allocator.free_blocks()), reverse=True)
            status += (f" · {q.waiting[0]} needs {q.next_need()} slots: a free buddy block of "
                       f"{next_pow2(q.next_need())}; free pieces: "
                       f"{'+'.join(map(str, pieces)) or 'none'}")
        rows.append((kind, slots, status))
    return arena_strips(rows, title=f"{len(REQUESTS)} requests arrive at once: {NUM_SLOTS} "
                                    f"slots, max length {MAX_SEQ_LEN}, after {STEPS} decode "
                                    f"steps",
                        notes=["Capital letters mark each request's tokens. Contiguous caches "
                               "reserve for the future at admission; the paged cache takes a "
                               "block of 4 only when the last one is full."])
