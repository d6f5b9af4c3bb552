# %% [markdown]
# # Lesson 01: attention, and why decode needs a KV cache
#
# A decoder produces one token per step. At each step the new token's query attends over the
# keys and values of **every token so far**. A token's key and value depend only on it and the
# tokens before it (causal attention), so they never change once computed: recomputing them at every
# step is pure waste, and keeping them is the **KV cache**. The catch, and the subject of the
# whole course, is its size: it grows by a fixed number of bytes per token per sequence, and it
# is what limits how many requests a GPU can serve at once (vLLM paper, sections 2.2-3).
#
# Code: `minipaged/attention.py` (the dense oracle). Next: lesson 02 (a contiguous KV cache and
# the memory it wastes).

# %%
from __future__ import annotations

import numpy as np
from rich.console import Console
from rich.table import Table

from minipaged.attention import dense_attention

console = Console()
rng = np.random.default_rng(0)

# %% [markdown]
# ## Attention in one picture: causal with an offset, grouped-query heads
#
# `dense_attention(q, k, v)` takes T queries `[T, H, D]` and Tk keys/values `[Tk, Hkv, D]`.
# The queries are the *last* T positions, so query t sees keys `0 .. Tk - T + t`. Prefill is
# T == Tk (a triangle), decode is T == 1 (one row that sees everything). With grouped-query
# attention, H query heads share Hkv < H KV heads: query head h reads KV head `h // (H // Hkv)`.

# %%
T, Tk = 3, 6
vis = Table(title=f"which keys each query sees (T={T} new queries, Tk={Tk} keys)",
            title_justify="left")
vis.add_column("query (position)")
for j in range(Tk):
    vis.add_column(f"k{j}", justify="center")
for t in range(T):
    pos = Tk - T + t
    vis.add_row(f"q{t} (pos {pos})", *["#" if j <= pos else "." for j in range(Tk)])
console.print(vis)

# %% [markdown]
# ## The same answer with and without a cache, at very different costs
#
# A one-layer toy model: each token's hidden state x `[d]` is projected to q, k, v by three
# matrices. *Without* a cache, each decode step recomputes k and v for every token so far;
# *with* a cache it computes them for the new token only and appends them. We generate the
# same continuation both ways and count the K/V projections (one projection = one token's k
# and v, for one layer).

# %%
H, HKV, D = 4, 2, 8
d_model = H * D
Wq = rng.standard_normal((d_model, H * D)) / np.sqrt(d_model)
Wk = rng.standard_normal((d_model, HKV * D)) / np.sqrt(d_model)
Wv = rng.standard_normal((d_model, HKV * D)) / np.sqrt(d_model)
Wo = rng.standard_normal((H * D, d_model)) / np.sqrt(d_model)
prompt = rng.standard_normal((5, d_model))  # [P, d_model] the prompt's hidden states
steps = 12


def project_kv(x):
    """x [n, d_model] -> k, v [n, Hkv, D], projected one token at a time, so that the cached and
    the recomputed K/V are the same numbers bit for bit (a batched GEMM may round differently)."""
    k = np.stack([row @ Wk for row in x]).reshape(len(x), HKV, D)
    v = np.stack([row @ Wv for row in x]).reshape(len(x), HKV, D)
    return k, v


def step(x_new, k, v):
    """Attention output for the newest token -> the next token's hidden state."""
    q = (x_new @ Wq).reshape(1, H, D)
    return (dense_attention(q, k, v).reshape(1, H * D) @ Wo)[0]


def generate(use_cache):
    xs, projections, per_step = list(prompt), 0, []
    cache_k, cache_v = project_kv(prompt)
    projections += len(prompt)                     # prefill: every prompt token once
    for _ in range(steps):
        if use_cache:
            k, v = cache_k, cache_v
        else:
            k, v = project_kv(np.array(xs))            # recompute everything so far
            projections += len(xs)
            per_step.append(len(xs))
        x_next = step(xs[-1], k, v)
        xs.append(x_next)
        if use_cache:                                  # the new token's k, v: computed once
            kn, vn = project_kv(x_next[None])
            cache_k, cache_v = np.concatenate([cache_k, kn]), np.concatenate([cache_v, vn])
            projections += 1
            per_step.append(1)
    return np.array(xs[len(prompt):]), projections, per_step


out_nocache, n_nocache, steps_nocache = generate(use_cache=False)
out_cache, n_cache, steps_cache = generate(use_cache=True)
same = np.array_equal(out_nocache, out_cache)
P, N = len(prompt), steps
t = Table(title=f"K/V projections to generate {N} tokens after a {P}-token prompt",
          title_justify="left")
t.add_column("")
t.add_column("K/V projections", justify="right")
t.add_column("formula", justify="left")
t.add_row("recompute every step", str(n_nocache),
          "P + sum_{i=0}^{N-1} (P + i) = P(N + 1) + N(N - 1) / 2")
t.add_row("KV cache", str(n_cache), "P + N  (each token once)")
console.print(t)
assert n_nocache == P + sum(P + i for i in range(N)) == P * (N + 1) + N * (N - 1) // 2
assert n_cache == P + N
console.print(f"identical generated states with and without the cache: [bold]{same}[/]")
assert same

# %% [markdown]
# The gap grows quadratically. For a 1000-token prompt and 1000 generated tokens, the same two
# formulas (checked above against the counts of the real run) give:

# %%
P_big = N_big = 1000
recompute_big = P_big + sum(P_big + i for i in range(N_big))
console.print(f"P={P_big}, N={N_big}: recompute every step {recompute_big:,} projections per "
              f"layer, KV cache {P_big + N_big:,} ({recompute_big / (P_big + N_big):,.0f}x more)")

# %% [markdown]
# About 1.5 million projections per layer against 2000. Serving engines therefore keep the
# cache (vLLM, and every engine the course meets), and the question becomes how much memory it
# takes.
#
# ## Bytes per token: the formula
#
# Each token stores one key and one value vector per KV head per layer:
#
#     bytes per token = 2 (K and V) x layers x KV heads x head size x bytes per element
#
# Grouped-query attention (fewer KV heads than query heads) is a direct cut in this number.

# %%
# name, layers, query heads, KV heads, head size: each model's published config.json on the
# Hugging Face Hub (facebook/opt-13b, meta-llama/Llama-2-7b-hf, meta-llama/Meta-Llama-3-8B,
# meta-llama/Meta-Llama-3-70B; head size = hidden_size / num_attention_heads)
MODELS = [
    ("OPT-13B (paper's Table 1)", 40, 40, 40, 128),
    ("Llama-2-7B", 32, 32, 32, 128),
    ("Llama-3-8B (GQA)", 32, 32, 8, 128),
    ("Llama-3-70B (GQA)", 80, 64, 8, 128),
]
FP16 = 2  # bytes per element


def kv_bytes_per_token(layers, kv_heads, head_size, elem_bytes=FP16):
    return 2 * layers * kv_heads * head_size * elem_bytes


t = Table(title="KV cache per token and per 2048-token request, float16", title_justify="left")
for col in ("model", "layers", "H / Hkv", "D", "bytes / token", "per token", "2048 tokens"):
    t.add_column(col, justify="left" if col == "model" else "right")
per_token = {}
for name, layers, h, hkv, d in MODELS:
    b = kv_bytes_per_token(layers, hkv, d)
    per_token[name] = b
    t.add_row(name, str(layers), f"{h} / {hkv}", str(d), f"{b:,}", f"{b / 1024:,.0f} KiB",
              f"{b * 2048 / 2**30:.2f} GiB")
console.print(t)
assert per_token["OPT-13B (paper's Table 1)"] == 800 * 1024      # the paper's "800 KB" (sec. 3)
assert per_token["Llama-3-8B (GQA)"] == 128 * 1024

# %% [markdown]
# The paper's example (Table 1): OPT-13B on one A100-40GB leaves about 12 GB for the KV cache
# after the weights. At 800 KiB per token (section 3) that is room for only about 15.7 thousand
# token slots, shared by every request in the batch: a handful of 2048-token requests. Lesson
# 02 shows how a contiguous cache wastes most of even that.

# %%
slots = 12 * 2**30 // per_token["OPT-13B (paper's Table 1)"]
console.print(f"12 GiB / 800 KiB per token = [bold]{slots:,}[/] token slots "
              f"= {slots // 2048} requests of 2048 tokens")
