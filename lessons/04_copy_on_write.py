# %% [markdown]
# # Lesson 04: sharing blocks: fork, copy-on-write, parallel sampling, beam search
#
# A block table is only a list of block ids, so two sequences can point at the same physical
# block. vLLM (paper section 4.4) uses that when one request decodes several sequences from one
# prompt: `fork` gives a child every block of its parent and raises their **reference counts**;
# nothing is copied. Only when a sequence is about to write into a block that others still
# share (the partly filled last block) does it get its own copy: **copy-on-write**. The copies
# a step needs are collected (`take_copies()`) and done in one call (`copy_blocks`) before the
# step writes its new K/V, as vLLM batches them into one kernel launch (paper section 5.1,
# "fused block copy"). This is vLLM v0's design; the v1 engine has no fork
# (vllm/v1/engine/parallel_sampling.py makes n samples n requests) and shares through its
# prefix cache instead (vllm/v1/core/kv_cache_manager.py; lesson 05). Its one copy-on-write
# (vLLM 0.32) is for a prefix-cache hit that ends inside a block, in hybrid models whose hash
# unit is finer than a block (vllm/v1/core/single_type_kv_cache_manager.py, `_apply_cow`).
#
# Code: `minipaged/sharing/cow.py` (`CowBlockManager`: fork, copy-on-write in append_slot,
# take_copies), `minipaged/paged/cache_ops.py` (copy_blocks), `minipaged/sharing/sequence.py`
# (sequences and groups) and `minipaged/sharing/sampling.py` (parallel sampling, beam search).
# Next: lesson 05 (prefix caching, the way vLLM v1 shares instead).

# %%
from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from minipaged import copy_blocks, reshape_and_cache
from minipaged.attention import dense_attention
from minipaged.kit.quiz.context import canonical
from minipaged.paged.paged_attention import paged_attention
from minipaged.sharing.cow import CowBlockManager
from minipaged.sharing.sampling import (
    BeamSearch,
    Candidate,
    append_group,
    blocks_with_sharing,
    blocks_without_sharing,
    free_group,
    start_parallel_sampling,
)

console = Console()
BS, HKV, H, D = 4, 2, 4, 8
rng = np.random.default_rng(0)


def show(mgr: CowBlockManager, title: str) -> None:
    t = Table(title=title, title_justify="left")
    for col in ("seq", "len", "block table", "reference counts"):
        t.add_column(col)
    for s in mgr.seq_ids:
        table = mgr.block_table(s)
        t.add_row(str(s), str(mgr.seq_len(s)), str(table),
                  str([mgr.ref_count(b) for b in table]))
    console.print(t)


# %% [markdown]
# ## A forked tree
# A prompt of 10 tokens (two full blocks and one half-full block) is forked twice.

# %%
mgr = CowBlockManager(num_blocks=16, block_size=BS)
key_cache = np.full((16, HKV, BS, D), np.nan, np.float32)  # [NB, Hkv, BS, D]
value_cache = np.full_like(key_cache, np.nan)
dense: dict[str, list[np.ndarray]] = {}

mgr.allocate("P", list(range(10)))
k, v = (rng.standard_normal((10, HKV, D)).astype(np.float32) for _ in range(2))
reshape_and_cache(k, v, key_cache, value_cache, mgr.slot_mapping("P", 0, 10))
dense["P"] = [k, v]
for child in ("A", "B"):
    mgr.fork("P", child)
    dense[child] = [k.copy(), v.copy()]
show(mgr, "after fork: every block shared three ways, no copy yet")

# %% [markdown]
# One decode step: each of the three appends a token. A and B find their last block shared and
# each gets a copy; by the time P writes, it is the only table still holding the block and writes
# in place. Until the copies are taken, each pending copy counts as one more user of its source,
# so the source cannot be freed and handed out before the copy has read it.

# %%
slots = {s: mgr.append_slot(s, 99) for s in ("A", "B", "P")}
copies = mgr.take_copies()
console.print(f"slots for the new tokens: {slots}")
console.print(f"copy-on-write copies (src -> dst): {copies}")
copy_blocks(key_cache, value_cache, copies)  # first the copies ...
for s, slot in slots.items():  # ... then the step's new K/V
    nk, nv = (rng.standard_normal((1, HKV, D)).astype(np.float32) for _ in range(2))
    reshape_and_cache(nk, nv, key_cache, value_cache, np.array([slot]))
    dense[s] = [np.concatenate([dense[s][0], nk]), np.concatenate([dense[s][1], nv])]
show(mgr, "after one step: full blocks still shared, last blocks private")

q = rng.standard_normal((3, H, D)).astype(np.float32)  # [S, H, D]
seqs = ["P", "A", "B"]
out = paged_attention(q, key_cache, value_cache, mgr.block_tables(seqs),
                      np.array([mgr.seq_len(s) for s in seqs], np.int32))
for i, s in enumerate(seqs):
    same = np.array_equal(out[i:i + 1], dense_attention(q[i:i + 1], *dense[s]))
    console.print(f"{s}: paged attention over shared blocks == dense attention on its own "
                  f"K/V: {same}")
    assert same
console.print(f"blocks held: {blocks_with_sharing(mgr, seqs)} with sharing, "
              f"{blocks_without_sharing(mgr, seqs)} without")

# %% [markdown]
# ## No cap on reference counts
# A widely repeated interview answer says vLLM caps a block's shared references at 16. Neither
# the paper (section 4.4) nor the code does: vLLM v0's reference counter only asserts that a
# count never goes below zero (vllm/core/block/common.py), and 16 is the default *block size*
# (CacheConfig.DEFAULT_BLOCK_SIZE, vllm/config/cache.py).
# minipaged has no cap either. Here one block has 101 users:

# %%
many = CowBlockManager(num_blocks=4, block_size=16)
many.allocate(0, list(range(16)))
for child in range(1, 101):
    many.fork(0, child)
console.print(f"reference count of block 0 after 100 forks: {many.ref_count(0)}")

# %% [markdown]
# ## Parallel sampling and beam search: how much sharing saves
# A toy Alpaca-like workload, run right here with the real block manager: 12 requests, prompts
# of 8-31 tokens, outputs of 20-99 (the paper's Fig. 11 reports means of about 19 and 58), BS
# = 16, samples of random length and beams with random scores. At every decode step we count
# the distinct blocks the request holds with sharing and the blocks it would hold without
# (each sequence its own), and report the saving `1 - with / without` over the whole run. The
# paper measured 6.1-9.8% for parallel sampling (n = 2, 4, 6) and 37.6-55.2% for beam search
# (width 2, 4, 6), Fig. 15. Beside the toy: the simulator's figure from the course's canonical
# run (300 Alpaca requests, the run lesson 07 and `minipaged experiment 2` print).

# %%
BS16, REQUESTS = 16, 12
work = np.random.default_rng(1)
prompts = [work.integers(0, 1000, int(work.integers(8, 32))).tolist() for _ in range(REQUESTS)]
outlens = [int(work.integers(20, 100)) for _ in range(REQUESTS)]


def parallel_saving(n: int) -> float:
    with_, without = 0, 0
    m = CowBlockManager(num_blocks=4096, block_size=BS16)
    for r, prompt in enumerate(prompts):
        group, _ = start_parallel_sampling(m, r, prompt, n)
        lens = {s: int(work.integers(outlens[r] // 2, outlens[r] + 1)) for s in group.seq_ids}
        for step in range(max(lens.values())):
            live = [s for s in group.seq_ids if lens[s] > step]
            for s in live:
                m.append_slot(s, int(work.integers(0, 1000)))
            m.take_copies()
            with_ += blocks_with_sharing(m, live)
            without += blocks_without_sharing(m, live)
        free_group(m, group)
    return 1 - with_ / without


def beam_saving(width: int) -> float:
    with_, without = 0, 0
    m = CowBlockManager(num_blocks=4096, block_size=BS16)
    for r, prompt in enumerate(prompts):
        beam = BeamSearch(m, r, prompt, width)
        for _ in range(outlens[r]):
            cands = [Candidate(s, int(t), beam.scores[s] - float(work.exponential()))
                     for s in beam.beams for t in work.integers(0, 1000, width)]
            beam.step(cands)
            m.take_copies()
            with_ += blocks_with_sharing(m, beam.beams)
            without += blocks_without_sharing(m, beam.beams)
        beam.finish()
    return 1 - with_ / without


ctx = canonical()
sim = ctx.sharing()  # experiment 2 on Alpaca, canonical run
t = Table(title="memory saved by sharing (blocks, averaged over decode steps)",
          title_justify="left")
for col in ("algorithm", "n / width", "this toy (12 requests)",
            f"simulator ({ctx.label})", "paper (read off Fig. 15, OPT-13B, Alpaca)"):
    t.add_column(col)
paper_ps = {2: "6.09%", 4: "8.53%", 6: "9.79%"}
paper_bs = {2: "37.56%", 4: "53.13%", 6: "55.16%"}
toy = {}
for n in (2, 4, 6):
    toy["parallel", n] = parallel_saving(n)
    t.add_row("parallel sampling", str(n), f"{100 * toy['parallel', n]:.1f}%",
              f"{100 * sim['parallel'][n]:.1f}%", paper_ps[n])
for w in (2, 4, 6):
    toy["beam", w] = beam_saving(w)
    t.add_row("beam search", str(w), f"{100 * toy['beam', w]:.1f}%",
              f"{100 * sim['beam'][w]:.1f}%", paper_bs[w])
console.print(t)
assert all(toy["beam", k] > toy["parallel", k] and sim["beam"][k] > sim["parallel"][k]
           for k in (2, 4, 6))
console.print("Beam search saves far more: surviving beams share most of their *generated* "
              "tokens too, while parallel samples share only the prompt.\n"
              "(The toy's scores are random and its requests few, so its figures differ from "
              "the paper's and the simulator's; the ordering is the point.)")

# %% [markdown]
# ## All or nothing for a group
# A group's decode step either gets every block it needs (new blocks and copies) or none:
# `append_group` checks `blocks_needed_to_append` first, so the scheduler can preempt the whole
# group cleanly (lesson 06).

# %%
small = CowBlockManager(num_blocks=3, block_size=4)
group, _ = start_parallel_sampling(small, "req", [1, 2], n=3)
console.print(f"3 samples sharing 1 block; one step needs "
              f"{small.blocks_needed_to_append(group.seq_ids)} new blocks (two copies; the "
              f"last writer keeps the original); free: {small.num_free_blocks}")
append_group(small, group, {s: 7 for s in group.seq_ids})
console.print(f"copies this step: {small.take_copies()}")
