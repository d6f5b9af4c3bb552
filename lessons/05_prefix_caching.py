# %% [markdown]
# # Lesson 05: prefix caching, and how vLLM v1 replaced fork and copy-on-write
#
# Lesson 04 shared blocks *inside* one request, by fork. Many requests also share a prefix:
# the same system prompt, the same few-shot examples, the same document. vLLM (v0's automatic
# prefix caching and v1's prefix cache) and nano-vllm find those blocks again by content: every
# **full** block gets a hash chained from its parent block's hash and its own token ids
# (vllm/v1/core/kv_cache_utils.py, hash_block_tokens; vLLM adds extra keys such as LoRA ids),
# and a table maps hash -> physical block. A new prompt walks its chain and reuses the longest
# run of cached blocks; the model computes K/V only for the rest. At least the last prompt token
# is always recomputed, since its logits choose the first new token (vllm/v1/core/
# kv_cache_manager.py, get_computed_blocks). Freed blocks keep their K/V and hash in one free
# queue in eviction order (least recently used first) and are evicted only when a block is
# actually needed (vllm/v1/core/block_pool.py). Which system checks what on a hit:
#
# - vLLM looks a hit up by hash alone (block_pool.py, get_cached_block) and relies on a strong
#   hash: SHA-256 by default since v0.10.2 (docs/design/prefix_caching.md); vLLM 0.32 offers
#   sha256, sha256_cbor and the faster, non-cryptographic xxhash and xxhash_cbor
#   (vllm/config/cache.py, prefix_caching_hash_algo); earlier releases defaulted to Python's
#   built-in hash.
# - nano-vllm also compares the cached block's token ids (nanovllm/engine/block_manager.py).
# - minipaged compares the token ids too (sharing/prefix_cache.py, lookup), so a weak or
#   colliding `hash_fn` costs a hit instead of serving K/V computed for other tokens.
#
# Code: `minipaged/sharing/prefix_cache.py` (`PrefixCachingBlockManager`, allocate with
# `enable_prefix_caching=True`). Next: lesson 06 (scheduling and preemption).

# %%
from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from minipaged import reshape_and_cache
from minipaged.paged.paged_attention import paged_attention
from minipaged.sharing.prefix_cache import PrefixCachingBlockManager
from minipaged.sharing.sampling import append_group, free_group, start_parallel_sampling

console = Console()
BS = 16
rng = np.random.default_rng(0)
SYSTEM = rng.integers(0, 32000, 100).tolist()  # one shared system prompt: 6 full blocks + 4


def question() -> list[int]:
    return rng.integers(0, 32000, int(rng.integers(5, 40))).tolist()


# %% [markdown]
# ## A shared system prompt across many requests
# 40 requests, each the same 100-token system prompt plus its own question. The first pays for
# everything; every later one finds the system prompt's 6 full blocks in the cache.

# %%
mgr = PrefixCachingBlockManager(num_blocks=512, block_size=BS, enable_prefix_caching=True)
prompt_tokens = computed_tokens = 0
rows = []
for r in range(40):
    prompt = SYSTEM + question()
    hit = mgr.allocate(r, prompt)
    prompt_tokens += len(prompt)
    computed_tokens += hit
    if r < 4:
        rows.append((r, len(prompt), hit, mgr.block_table(r)[:8]))
    if r % 2:
        mgr.free(r)  # half of them finish at once: their blocks stay cached
t = Table(title="first requests", title_justify="left")
for col in ("request", "prompt tokens", "already computed", "block table (first 8)"):
    t.add_column(col)
for row in rows:
    t.add_row(*map(str, row))
console.print(t)
console.print(f"prompt tokens whose K/V came from the cache: {computed_tokens} of "
              f"{prompt_tokens} ({100 * computed_tokens / prompt_tokens:.1f}%); the cache "
              f"holds {len(mgr.allocator.cached_blocks())} hashed blocks, "
              f"{mgr.allocator.num_cached_free_blocks} of them free (LRU queue)")

# %% [markdown]
# ## A hit computes exactly what a cold run computes
# K/V of a token depend on its whole prefix, which is why the hash is chained. We give every
# token K/V determined by its prefix (as a model would), run one request cold in an empty
# cache and the same request after another one warmed the cache: the hit writes only the
# tokens after the cached blocks, and attention comes out bit-identical.

# %%
HKV, H, D = 2, 4, 8


def kv_of(tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    k = np.empty((len(tokens), HKV, D), np.float32)  # [T, Hkv, D]
    v = np.empty_like(k)
    for p in range(len(tokens)):
        g = np.random.default_rng(hash(tuple(tokens[:p + 1])) & 0xFFFFFFFF)
        k[p], v[p] = g.standard_normal((2, HKV, D))
    return k, v


def run(warm: bool) -> np.ndarray:
    m = PrefixCachingBlockManager(num_blocks=32, block_size=BS, enable_prefix_caching=True)
    kc = np.full((32, HKV, BS, D), np.nan, np.float32)  # [NB, Hkv, BS, D]
    vc = np.full_like(kc, np.nan)
    requests = [SYSTEM + [7, 7, 7], SYSTEM + [1, 2, 3, 4]] if warm else [SYSTEM + [1, 2, 3, 4]]
    for i, tokens in enumerate(requests):
        done = m.allocate(i, tokens)
        k, v = kv_of(tokens)
        reshape_and_cache(k[done:], v[done:], kc, vc, m.slot_mapping(i, done, len(tokens)))
    last = len(requests) - 1
    q = np.ones((1, H, D), np.float32)
    console.print(f"  {'warm' if warm else 'cold'} run: {done} of {len(requests[-1])} prompt "
                  "tokens came from the cache")
    return paged_attention(q, kc, vc, m.block_tables([last]),
                           np.array([m.seq_len(last)], np.int32))


cold, warm = run(False), run(True)
console.print(f"attention output identical: {np.array_equal(cold, warm)}")
assert np.array_equal(cold, warm)

# %% [markdown]
# ## The LRU queue under pressure
# The same kind of traffic with three different system prompts, but a pool too small to keep
# everything: each request finishes before the next arrives, so its blocks join the LRU queue.
# A smaller pool evicts more, and the hit rate falls.

# %%
systems = [rng.integers(0, 32000, 100).tolist() for _ in range(3)]
order = rng.integers(0, 3, 300)
t = Table(title="300 requests, 3 system prompts, requests one at a time", title_justify="left")
for col in ("pool (blocks)", "hit rate (prompt tokens)", "evictions"):
    t.add_column(col, justify="right")
for nb in (10, 16, 24, 48):
    m = PrefixCachingBlockManager(num_blocks=nb, block_size=BS, enable_prefix_caching=True)
    hit = total = 0
    for r, s in enumerate(order):
        prompt = systems[s] + question()
        hit += m.allocate(r, prompt)
        total += len(prompt)
        m.free(r)
    t.add_row(str(nb), f"{100 * hit / total:.1f}%", str(m.allocator.evictions))
console.print(t)
console.print("With 10 blocks one system prompt (6 full blocks) barely fits next to a request's "
              "own blocks; with 24 the three (18 blocks) mostly stay cached, and evictions hit "
              "the requests' private tails.")

# %% [markdown]
# ## v0's fork versus v1's prefix cache on the same workload
# Parallel sampling, n = 4, for 8 concurrent requests. vLLM v0 forks: all four samples share
# every prompt block including the partial last one, until each writes into it ("v0 CoW", with
# automatic prefix caching off, v0's default). v1 has no fork: the samples are four requests
# (vllm/v1/engine/parallel_sampling.py fans them out); they share the prompt's full blocks
# through the cache, but each gets (and recomputes) its own partial last block ("v1 cache").
# v1 also shares the system prompt *between* requests, which fork alone cannot do. So "v0 =
# copy-on-write, v1 = prefix cache" holds only with a qualifier: vLLM v0 had automatic prefix
# caching too (`enable_prefix_caching`, vllm/core/block/prefix_caching_block.py), beside
# fork and copy-on-write, and minipaged, like that v0 manager, can do both at once ("fork +
# cache"). We count blocks in use at every step.

# %%


def workload(shared_system: bool, prefix: bool, by_fork: bool) -> tuple[int, float, int, int]:
    g = np.random.default_rng(5)
    m = PrefixCachingBlockManager(num_blocks=2048, block_size=BS, enable_prefix_caching=prefix)
    groups, lens = [], {}
    recomputed = 0
    for r in range(8):
        head = SYSTEM if shared_system else g.integers(0, 32000, 100).tolist()
        prompt = head + g.integers(0, 32000, int(g.integers(5, 40))).tolist()
        group, computed = start_parallel_sampling(m, r, prompt, n=4, by_fork=by_fork)
        recomputed += sum(len(prompt) - c for c in computed.values())
        groups.append(group)
        lens[r] = int(g.integers(20, 80))
    after_prefill = m.num_blocks - m.num_free_blocks
    used = []
    for step in range(max(lens.values())):
        for r, group in enumerate(groups):
            if group.seq_ids and step == lens[r]:
                free_group(m, group)
            elif group.seq_ids:
                append_group(m, group, {s: int(g.integers(0, 32000)) for s in group.seq_ids})
        m.take_copies()
        used.append(m.num_blocks - m.num_free_blocks)
    return after_prefill, float(np.mean(used)), max(used), recomputed


MODES = {"v0 CoW": (False, True), "v1 cache": (True, False), "fork + cache": (True, True)}
t = Table(title="parallel sampling n=4, 8 requests: blocks in use", title_justify="left")
for col in ("prompts", "mode", "after prefill", "mean", "peak", "prompt tokens computed"):
    t.add_column(col, justify="right")
results = {}
for shared in (False, True):
    for mode, (prefix, by_fork) in MODES.items():
        results[shared, mode] = first, mean, peak, recomputed = workload(shared, prefix, by_fork)
        t.add_row("shared system" if shared else "distinct", mode,
                  str(first), f"{mean:.1f}", str(peak), str(recomputed))
console.print(t)
# The claims below are checked on the figures just computed.
assert results[False, "v0 CoW"] == results[False, "fork + cache"]
assert results[False, "v0 CoW"][0] < results[False, "v1 cache"][0]
assert results[True, "fork + cache"][0] < results[True, "v1 cache"][0] < results[True, "v0 CoW"][0]
best = results[True, "fork + cache"]
assert all(best[i] <= results[True, m][i] for m in MODES for i in (1, 2, 3))
console.print("Distinct prompts: right after prefill v0 holds fewer blocks (one partial prompt "
              "block per request, not one per sample) and computes each prompt once; from the "
              "first decode step on, every sample owns its last block in both modes, and the "
              "cache adds nothing to forking. A shared system prompt: the cache wins, because "
              "it shares the prompt across requests; fork + cache holds the fewest blocks and "
              "computes the fewest tokens, sharing within the request and across requests.")
