# %% [markdown]
# # Lesson 08: the paged attention kernel, and how a GPU runs it
# requires: cuda-cpu
#
# Lessons 03-05 computed paged attention in NumPy: gather each sequence's K/V through its block
# table, or walk the table block by block with the online softmax (`method="online"`). A GPU
# does the walk with thousands of threads at once. This lesson runs the real CUDA kernel,
# `minipaged/cuda/paged_attention.cu`, and shows what each piece of the GPU does with it.
#
# No GPU here? The same `.cu` text is compiled by g++ against `minipaged/cuda/emu/cuda_emu.h`, a
# small header that emulates CUDA's execution model on the CPU: every CUDA thread becomes a
# *fiber* (a function with its own stack that runs until it must wait for others). Slow, but
# faithful to the rules, and it can *trace* what each warp does. With CuPy and a GPU, the last
# cell runs the same kernel on the device.
#
# The words (CUDA's, not ours):
# - **grid**: all the thread blocks of one launch; in v1 (traced below) one block per (query
#   head, sequence).
# - **thread block**: threads (here 128) that share **shared memory** and meet at `__syncthreads()`.
# - **warp**: 32 consecutive threads of a block that run each instruction together unless their
#   branches diverge; its **lanes** can read each other's registers with `__shfl_xor_sync`.
#
# The kernel file climbs like llm.c's dev/cuda files: version 0 is one thread per (sequence,
# head), obviously right and slow; v1 is the design of vLLM's legacy (v0 engine) paged kernel
# (one thread block per head; csrc/attention/attention_kernels.cuh); v2 cuts long contexts into
# partitions; v3 and v4 (the same kernel with GROUP = 8) give one block to each *KV* head and up
# to 8 of its query heads, so that under GQA every K/V byte is read once (when H/Hkv <= 8), not
# H/Hkv times. Every version is checked against the NumPy oracle, and the later ones against v0.
#
# Code: `minipaged/cuda/`: paged_attention_v0.cu (version 0), paged_attention.cu (versions 1 to
# 4, with the napkin math), paged_attention_reduce.cu (v2/v4's merge). Paper: vLLM sections 4.1
# (PagedAttention) and 5.1 (its kernel). Next: lesson 09 (a model end to end).

# %%
from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from minipaged.cuda import KernelError, checks
from minipaged.cuda import paged_attention as kernel_attention
from minipaged.cuda.emu import cpu_build
from minipaged.cuda.kernels import attention_names
from minipaged.paged.paged_attention import paged_attention as numpy_attention

console = Console()
rng = np.random.default_rng(0)

# 2 sequences of 70 and 20 tokens, 4 query heads sharing 2 KV heads (GQA), D=64, BS=16.
S, H, HKV, D, BS = 2, 4, 2, 64, 16
lens = np.array([70, 20], np.int32)
NB = 12
q = rng.standard_normal((S, H, D)).astype(np.float32)                 # [S, H, D]
key_cache = rng.standard_normal((NB, HKV, BS, D)).astype(np.float32)  # [NB, Hkv, BS, D]
value_cache = rng.standard_normal((NB, HKV, BS, D)).astype(np.float32)
physical = rng.permutation(NB)
block_tables = np.full((S, 5), -1, np.int32)                          # [S, MB]
block_tables[0, :5] = physical[:5]   # ceil(70 / 16) = 5 blocks
block_tables[1, :2] = physical[5:7]  # ceil(20 / 16) = 2 blocks
console.print(f"block tables (logical -> physical):\n{block_tables}")

# %% [markdown]
# ## The launch: grid, blocks, warps, thread groups
# In v1, one thread block computes one query head of one sequence: grid = (H, S) = (4, 2), 8
# blocks of 128 threads = 4 warps each. The 4 warps take the sequence's *logical* KV blocks in turn
# (warp w reads blocks w, w+4, ...), following the block table to the physical block. Inside a
# warp, the 32 lanes split into BS = 16 *thread groups* of 2 lanes: each group computes one
# token's q.k (each lane half of the 64 products, then one shuffle adds the halves). The logits
# go to shared memory, so the softmax can see all of them.

# %%
table = Table(title="launch geometry", title_justify="left")
table.add_column("what")
table.add_column("value", justify="right")
group = max(32 // BS, 1)
rows = [("grid (heads, sequences)", f"({H}, {S})"), ("threads per block", "128 = 4 warps"),
        ("lanes per token (thread group)", f"32 / BS = {group}"),
        ("tokens per warp at a time", f"{32 // group}"),
        ("shared memory (v1), bytes", f"{checks.dynamic_smem(1, int(lens.max()), BS, D):,}: "
         f"logits {-(-int(lens.max()) // BS) * BS * 4}, later 4 warps' outputs {4 * D * 4:,}"),
        ("query heads per KV head (GQA)", f"{H // HKV}: head h reads KV head h // {H // HKV}")]
for r in rows:
    table.add_row(*r)
console.print(table)

# %% [markdown]
# ## A trace of what each warp did
# The harness records every `MP_TRACE` point in the kernel and, from lane 0 of each warp, every
# barrier and shuffle. Here is thread block (head 0, sequence 0): 70 tokens, 5 logical blocks.

# %%
with cpu_build.tracing() as events:
    out = kernel_attention(q, key_cache, value_cache, block_tables, lens, backend="cpu",
                           version=1)

mine = [e for e in events if e.block == (0, 0, 0)]
BARRIERS = ["query in shared memory", "block max", "block sum", "logits done",
            "warps' outputs posted"]
table = Table(title="thread block (head 0, seq 0): what each warp did", title_justify="left")
table.add_column("warp")
table.add_column("K blocks read (logical -> physical)")
table.add_column("shuffles", justify="right")
table.add_column("barriers", justify="right")
timeline = []  # warp 0's steps in order
for w in range(4):
    steps = [e for e in mine if e.thread == 32 * w]  # lane 0 speaks for its warp
    reads = [e.value for e in steps if e.what == "warp reads K of logical block"]
    shuffles = sum(e.what.startswith("__shfl") for e in steps)
    barriers = sum(e.what == "__syncthreads()" for e in steps)
    table.add_row(str(w), ", ".join(f"{b} -> {block_tables[0, b]}" for b in reads),
                  str(shuffles), str(barriers))
    # The paragraph printed below, checked on this trace: warps take logical blocks in turn,
    # one shuffle per block read, 5 for the max and 5 for the sum, 5 barriers.
    assert reads == list(range(w, 5, 4)), (w, reads)
    assert shuffles == len(reads) + 2 * 5 and barriers == len(BARRIERS), (w, shuffles, barriers)
    if w == 0:
        nbar = 0
        for e in steps:
            if e.what == "__syncthreads()":
                timeline.append(f"[bold]barrier ({BARRIERS[nbar]})[/]")
                nbar += 1
            elif e.what.startswith("__shfl"):
                timeline.append(f"shfl xor {e.value}")
            else:
                timeline.append(f"read K block {e.value}")
console.print(table)
console.print("warp 0, step by step: " + " > ".join(timeline))
console.print(
    "Reading a KV block costs one shuffle here (two lanes per token: xor 1 adds the halves). "
    "The max is reduced with 5 shuffles (lanes 16, 8, 4, 2, 1 apart), posted to shared memory "
    "and read back after a barrier; the same for the sum. Then each warp accumulates V over its "
    "own blocks (no shuffles: lane l owns output dimensions l, l+32); after a barrier (every "
    "warp is done with the logits) the warps post their partial outputs in the logits' buffer, "
    "and a last barrier lets them be added in a fixed order.")

# %% [markdown]
# ## Same answer as the NumPy oracle
# Different summation order, so not bit-equal to NumPy, but within float32 rounding. (Within
# the kernel, any placement of the blocks gives the same bits: tests/test_cuda_cpu.py.)

# %%
expected = numpy_attention(q, key_cache, value_cache, block_tables, lens)
console.print(f"max |kernel - numpy| = {np.abs(out - expected).max():.2e}  "
              f"(output {out.shape}, {out.dtype})")
# float32 outputs of size ~1 summed over <= 70 keys in another order: a few ulps (~1e-7 each)
assert np.abs(out - expected).max() < 1e-5

# %% [markdown]
# ## Version 2: partitions for long contexts
# With few sequences, v1 gives the GPU only H*S thread blocks. v2 cuts each context into
# partitions of 512 tokens: one block per (head, sequence, partition), then a small reduce
# kernel rescales each partition's result by exp(local max - global max) and combines them,
# the online softmax at partition granularity.

# %%
long_lens = np.array([1300], np.int32)
nblocks = -(-1300 // BS)
big_k = rng.standard_normal((nblocks, HKV, BS, D)).astype(np.float32)
big_v = rng.standard_normal((nblocks, HKV, BS, D)).astype(np.float32)
big_tables = rng.permutation(nblocks).astype(np.int32)[None, :]
qq = q[:1]
with cpu_build.tracing() as events:
    v2 = kernel_attention(qq, big_k, big_v, big_tables, long_lens, backend="cpu", version=2)
v1 = kernel_attention(qq, big_k, big_v, big_tables, long_lens, backend="cpu", version=1)
blocks_seen = sorted({e.block for e in events if e.what == "warp reads K of logical block"})
console.print(f"v2 thread blocks that read K (head, seq, partition): {blocks_seen[:3]} ... "
              f"{len(blocks_seen)} in all = {H} heads x ceil(1300 / 512) = 3 partitions")
console.print(f"max |v1 - v2| = {np.abs(v1 - v2).max():.2e}")
assert len(blocks_seen) == H * -(-1300 // 512) and {b[2] for b in blocks_seen} == {0, 1, 2}
assert np.abs(v1 - v2).max() < 1e-5  # same arithmetic, partials combined in another order

# %% [markdown]
# ## Versions 3 and 4: one thread block per KV head (GQA)
# In v1 the 2 query heads that share a KV head run in 2 thread blocks, and each block reads that
# KV head's K and V: every byte twice (H/Hkv times in general; 4 times for Llama-3-8B). v3 gives
# one block to each (KV head, sequence); a lane loads its piece of a key once and multiplies it
# with both queries. The trace counts who read which K block.

# %%
reads = {}
for version in (1, 3):
    with cpu_build.tracing() as events:
        got = kernel_attention(q, key_cache, value_cache, block_tables, lens, backend="cpu",
                               version=version)
    reads[version] = sum(e.what == "warp reads K of logical block" and e.thread % 32 == 0
                         for e in events)
    err = np.abs(got - expected).max()
    console.print(f"v{version}: {reads[version]} warp reads of K blocks, "
                  f"max |v{version} - numpy| = {err:.1e}")
    assert err < 1e-5
# 5 + 2 logical blocks per KV head: v1 reads them once per query head (H = 4), v3 once per KV
# head (Hkv = 2)
assert reads == {1: H * 7, 3: HKV * 7}, reads
console.print(f"v3 reads K {reads[1] // reads[3]}x less: H/Hkv = {H // HKV}. Without a choice "
              "(version=None) the launcher takes v3 or v4 whenever H > Hkv.")

# %% [markdown]
# ## Registers and spills, from the compiler the GPU uses
# On a GPU, CuPy compiles this text with NVRTC. NVRTC is a library, so it runs here too (with
# `python -m pip install -e ".[test]"`): ptxas reports per kernel how many registers each thread
# needs (which caps how many blocks share an SM) and whether any value spilled to slow local
# memory. CI fails on any spill (tests/test_cuda_nvrtc.py). Full table:
# `python -m minipaged.cuda.report`.

# %%
try:
    from minipaged.cuda import report

    names = attention_names("float16", 128, 16)
    stats = {k.name: k for k in report.kernel_stats(groups=[names])}
except Exception as e:  # noqa: BLE001 - no CuPy or no NVRTC: say so and go on
    console.print(f"NVRTC is not available here ({type(e).__name__}); install "
                  "'minipaged\\[test]' to see ptxas' report")
else:
    table = Table(title="fp16, D=128, BS=16, sm_90 (NVRTC)", title_justify="left")
    for col in ("version", "registers", "spilled bytes", "static smem", "blocks/SM"):
        table.add_column(col, justify="right")
    for key, name in names.items():
        k = stats[name]
        table.add_row(key, str(k.registers), str(k.spill_stores + k.spill_loads), str(k.smem),
                      str(k.blocks_per_sm()))
    console.print(table)
    assert all(k.spill_stores + k.spill_loads == 0 for k in stats.values())

# %% [markdown]
# ## What the harness catches
# A `__shfl_xor_sync` inside an `if` that splits a warp is undefined behaviour in CUDA: on a GPU
# it may hang or return garbage. The emulator checks that every lane of a warp reaches the
# same shuffle, every thread the same barrier, and that nobody exits while others wait.
# `minipaged/cuda/emu/broken_kernels.cu` has one bug per kernel; here is bug 2.

# %%
lib = cpu_build.load()
buf = np.zeros(2, np.float32)
try:
    cpu_build.check(lib, lib.mp_broken(2, 64, buf.ctypes.data))
except KernelError as e:
    console.print(f"[red]KernelError:[/] {e}")
else:
    raise AssertionError("the harness should have reported the divergent shuffle of bug 2")

# %% [markdown]
# ## On a real GPU
# With CuPy and a CUDA device, the same kernel text is compiled by NVRTC and launched there.

# %%
try:
    import cupy

    have_gpu = cupy.cuda.runtime.getDeviceCount() > 0
except Exception:  # noqa: BLE001 - no CuPy, no driver or no device all mean "no GPU"
    have_gpu = False
if have_gpu:
    on_gpu = kernel_attention(*(cupy.asarray(a) for a in (q, key_cache, value_cache,
                                                          block_tables, lens)), backend="cupy")
    console.print(f"GPU: max |gpu - cpu harness| = {np.abs(on_gpu.get() - out).max():.2e}")
else:
    console.print("No GPU here: the CPU harness above ran the very same kernel text. On a GPU, "
                  "`minipaged gpu-check` checks and measures every version.")
