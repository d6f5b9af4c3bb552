# %% [markdown]
# # Lesson 03: paging the KV cache
#
# Lesson 02 reserved one contiguous region per request and lost most of the memory to
# reservations it could not size right. Paging (vLLM section 4.2-4.3) borrows the operating
# system's answer: cut the cache into fixed-size **physical blocks** of `block_size` (BS) token
# slots, give each sequence a **block table** that maps its *logical* block i (token positions
# i*BS .. i*BS+BS-1) to any free physical block, and take a new block only when the last one is
# full. A sequence then wastes at most BS - 1 slots, whatever its final length.
#
# Five words that must not blur: *token position* p (0, 1, 2, ... in the sequence), *logical
# block* p // BS, *physical block* (a row of the cache array), *slot* (p % BS inside the block,
# or the global slot number `physical_block * BS + offset`), *reference count* (how many block
# tables point at a physical block; lesson 04 makes it larger than 1).
#
# Code: `minipaged/paged/block_allocator.py`, `minipaged/paged/block_manager.py`
# (`BlockManager`), `minipaged/paged/cache_ops.py`, `minipaged/paged/paged_attention.py`.
# Next: lesson 04 (sharing blocks: copy-on-write).

# %%
from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from minipaged import OutOfBlocksError, reshape_and_cache
from minipaged.attention import dense_attention
from minipaged.paged.block_manager import BlockManager
from minipaged.paged.paged_attention import paged_attention

console = Console()
BS, NB = 4, 12  # tiny on purpose, so that every block fits on the screen


def show_tables(mgr: BlockManager, title: str) -> None:
    t = Table(title=title, title_justify="left")
    t.add_column("seq")
    t.add_column("len", justify="right")
    t.add_column("block table (logical i -> physical)")
    t.add_column("unfilled slots", justify="right")
    for s in mgr.seq_ids:
        n, table = mgr.seq_len(s), mgr.block_table(s)
        t.add_row(str(s), str(n), "  ".join(f"{i}->{b}" for i, b in enumerate(table)),
                  str(len(table) * BS - n))
    console.print(t)
    console.print(f"free physical blocks: {mgr.num_free_blocks} of {mgr.num_blocks}\n")


# %% [markdown]
# ## Block tables grow on demand
# Three prompts of 5, 3 and 8 tokens arrive. Each gets ceil(len / BS) blocks, whichever are
# free; nothing is reserved for the tokens they will generate.

# %%
mgr = BlockManager(num_blocks=NB, block_size=BS)
prompts = {"A": [11, 12, 13, 14, 15], "B": [21, 22, 23], "C": list(range(31, 39))}
for seq_id, prompt in prompts.items():
    mgr.allocate(seq_id, prompt)
show_tables(mgr, "after the prompts (prefill)")

# %% [markdown]
# Now decode: every step appends one token to every sequence. `append_slot` returns the slot
# where the new token's K/V go; a sequence gets a new block only when its last one is full
# (B at position 3 still fits in its block; C, exactly full, needs one at once).

# %%
for step in range(4):
    slots = {s: mgr.append_slot(s, 100 + step) for s in mgr.seq_ids}
    news = [s for s in mgr.seq_ids if mgr.seq_len(s) % BS == 1]
    console.print(f"decode step {step}: slots {slots}; new block for {news or 'nobody'}")
show_tables(mgr, "after 4 decode steps")

# %% [markdown]
# ## Slot mapping
# The kernel that stores K/V (`reshape_and_cache`) only needs, per token, its global slot:
# `slot = block_table[p // BS] * BS + p % BS`.

# %%
table = mgr.block_table("A")
slots = mgr.slot_mapping("A", 0, mgr.seq_len("A"))
t = Table(title="sequence A: where each token position lives", title_justify="left")
for col in ("position p", "logical block p//BS", "physical block", "offset p%BS", "slot"):
    t.add_column(col, justify="right")
for p, slot in enumerate(slots.tolist()):
    t.add_row(str(p), str(p // BS), str(table[p // BS]), str(p % BS), str(slot))
console.print(t)

# %% [markdown]
# ## Writing and reading K/V through the table
# The cache is `[NB, Hkv, BS, D]` for K and for V. We write every sequence's K/V where the slot
# mapping says, then read each sequence back through its block table: the logical K/V come out
# exactly as written, although they are scattered over the physical blocks.

# %%
HKV, D = 2, 8
rng = np.random.default_rng(0)
key_cache = np.full((NB, HKV, BS, D), np.nan, dtype=np.float32)  # [NB, Hkv, BS, D]
value_cache = np.full_like(key_cache, np.nan)
dense = {}
for s in mgr.seq_ids:
    n = mgr.seq_len(s)
    k = rng.standard_normal((n, HKV, D)).astype(np.float32)  # [T, Hkv, D]
    v = rng.standard_normal((n, HKV, D)).astype(np.float32)
    reshape_and_cache(k, v, key_cache, value_cache, mgr.slot_mapping(s, 0, n))
    dense[s] = (k, v)

for s, (k, v) in dense.items():
    table, n = mgr.block_table(s), mgr.seq_len(s)
    pos = np.arange(n)
    k_back = key_cache[np.asarray(table)[pos // BS], :, pos % BS, :]  # [T, Hkv, D]
    v_back = value_cache[np.asarray(table)[pos // BS], :, pos % BS, :]
    same = np.array_equal(k_back, k) and np.array_equal(v_back, v)
    console.print(f"seq {s}: {n} tokens read back through blocks {table}: identical = {same}")
    assert same

# %% [markdown]
# ## Paged attention equals dense attention
# Decode attention reads each sequence's K/V through its block table. Gathering them and
# running the dense oracle gives the same numbers **bit for bit**; walking the blocks one by one,
# as vLLM's GPU kernel does (csrc/attention/attention_kernels.cuh), here with the online softmax
# (that kernel, and minipaged's CUDA v1-v4, keep the logits in shared memory instead; only v0
# runs the online softmax), equals the dense oracle tiled by BS, bit for bit, and the plain
# oracle within float rounding.

# %%
H = 4  # query heads: 2 per KV head (grouped-query attention)
seqs = mgr.seq_ids
q = rng.standard_normal((len(seqs), H, D)).astype(np.float32)  # [S, H, D]
tables = mgr.block_tables(seqs)                                 # [S, MB] int32, -1 padded
seq_lens = np.array([mgr.seq_len(s) for s in seqs], dtype=np.int32)
out_gather = paged_attention(q, key_cache, value_cache, tables, seq_lens, method="gather")
out_online = paged_attention(q, key_cache, value_cache, tables, seq_lens, method="online")
t = Table(title="paged vs dense attention, per sequence", title_justify="left")
for col in ("seq", "gather == dense", "online == dense(tile=BS)", "max |online - dense|"):
    t.add_column(col)
for i, s in enumerate(seqs):
    k, v = dense[s]
    ref = dense_attention(q[i:i + 1], k, v)
    ref_tiled = dense_attention(q[i:i + 1], k, v, tile=BS)
    eq_g = np.array_equal(out_gather[i:i + 1], ref)
    eq_o = np.array_equal(out_online[i:i + 1], ref_tiled)
    assert eq_g and eq_o
    t.add_row(str(s), str(eq_g), str(eq_o),
              f"{np.abs(out_online[i:i + 1] - ref).max():.1e}")
console.print(t)

# %% [markdown]
# ## Where the memory goes
# The same five categories as lesson 02. Paging has no external fragmentation (any free block
# serves any sequence). The unfilled slots of a sequence's last block are *reserved* for tokens
# it will still produce, and *internal fragmentation* only if it ends before filling them;
# `usage()` is not told the final lengths here, so it counts them all as internal fragmentation
# (the worst case, every request ending now): below one block per sequence.

# %%
u = mgr.usage()
fr = u.fractions()
t = Table(title=f"paged cache: {u.total} slots = {NB} blocks x BS={BS}", title_justify="left")
t.add_column("category")
t.add_column("slots", justify="right")
t.add_column("share", justify="right")
for cat, slots_in in u.as_dict().items():
    if cat != "total":
        t.add_row(cat, str(slots_in), f"{100 * fr[cat]:.1f}%")
console.print(t)
used = u.used
console.print(f"of the {used} slots in use, {100 * u.token / used:.1f}% hold token states "
              f"(at most {len(mgr.seq_ids)} x (BS-1) = {len(mgr.seq_ids) * (BS - 1)} "
              "slots can be unfilled)")
# The two claims above, checked: no external fragmentation, under one block unfilled per sequence.
assert u.external_fragmentation == 0
assert u.used - u.token <= len(mgr.seq_ids) * (BS - 1)

# %% [markdown]
# ## Running out of blocks
# When no block is left, the manager says how many were needed and how many were free, and
# changes nothing: the scheduler (lesson 06) can preempt someone and retry.

# %%
try:
    mgr.allocate("D", list(range(4 * NB)))
except OutOfBlocksError as e:
    console.print(f"[bold red]OutOfBlocksError[/]: {e}  (needed={e.needed}, free={e.free})")
    assert "D" not in mgr.seq_ids
else:
    raise AssertionError("a 48-token prompt cannot fit in 12 blocks of 4 slots")
for s in list(mgr.seq_ids):
    mgr.free(s)
console.print(f"after freeing everything: {mgr.num_free_blocks} of {mgr.num_blocks} blocks free")
