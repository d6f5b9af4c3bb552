"""Paged attention: attention that reads K and V through block tables (vLLM paper, section 4.1).

What this teaches (lesson 03): position p of sequence s lives in physical block
``block_tables[s, p // BS]`` of the pool ``key_cache, value_cache [NB, Hkv, BS, D]``, at slot
``p % BS``; attention is unchanged, only the addressing is. ``paged_attention`` is decode (one
query per sequence), ``paged_prefill_attention`` several new tokens per sequence (a prompt, a
chunk, the rest after a prefix-cache hit). ``method="gather"`` fetches each sequence's K/V
through its table and runs the oracle's kernel: bit for bit ``dense_attention(q,
*gather_kv(...))``. ``method="online"`` walks the table one block at a time, as vLLM's CUDA
kernel does (csrc/attention/attention_kernels.cuh), with the online softmax (vLLM's kernel
keeps the logits in shared memory instead): bit for bit ``dense_attention(..., tile=BS)``.
Bit for bit needs the oracle's per-head shapes, so the gather path loops over sequences (padding
them to one length would change the row sums); online decode is vectorised across sequences,
every tile being exactly BS keys. No loop runs per token.

Invariants (checked before any arithmetic; tests/test_paged_attention*.py): only the first
ceil(seq_lens[s] / BS) entries of row s are read; free blocks and slots past seq_lens[s] may hold
anything, NaN included, without changing an output; moving blocks and rewriting the tables to
match leaves every output bit-identical.

Read before: ``attention.py``, ``paged/block_manager.py``, ``paged/cache_ops.py``. Read next:
``sharing/cow.py`` (stage 4: sharing blocks). ``cuda/`` (lesson 08) does this walk on a GPU.
"""

from __future__ import annotations

import numpy as np

from minipaged._checks import cdiv, check_block_tables, check_dtype, check_int_array, check_query
from minipaged.attention import (
    _from_heads,
    _to_heads,
    accumulation_dtype,
    check_scale,
    online_init,
    online_step,
    plain_softmax,
    row_limits,
)
from minipaged.paged.cache_ops import check_caches

METHODS = ("gather", "online")

# The gather path fetches K and V a few KV heads at a time, about this many bytes of K, so they
# are still in cache when the GEMMs read them (gathering all heads at once measured 2x slower:
# S=32, H=32, Hkv=8, D=128, BS=16, ctx 4096, float32, one thread).
GATHER_CHUNK_BYTES = 1 << 20


def _check_caches(key_cache: np.ndarray, value_cache: np.ndarray) -> tuple[int, ...]:
    # The checks of every cache op, plus what the arithmetic needs: a float dtype, C order.
    check_caches(key_cache, value_cache)
    for name, c in (("key_cache", key_cache), ("value_cache", value_cache)):
        check_dtype(f"{name}.dtype", c.dtype)
        if not c.flags.c_contiguous:
            raise ValueError(f"{name} must be C-contiguous (the one cache layout "
                             "[NB, Hkv, BS, D]); got a strided view")
    if min(key_cache.shape) < 1:
        raise ValueError(f"key_cache.shape={key_cache.shape} has an empty dimension")
    return key_cache.shape


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method={method!r}; expected one of {METHODS}")


def _gather_attention(qh: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray,
                      blocks: np.ndarray, L: int, limits: np.ndarray,
                      bufs: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Gather path for one sequence: qh [Hkv, R, D] -> [Hkv, R, D], a few KV heads at a time.
    A cache read as [NB*Hkv, BS*D] has head h of block b in row b*Hkv + h, so a chunk's K (or
    V) is one np.take of whole rows into a reused buffer, which read as [h, nb*BS, D] holds each
    head's keys in logical order; slots past L are sliced off."""
    NB, Hkv, BS, D = key_cache.shape
    flats = [c.reshape(NB * Hkv, BS * D) for c in (key_cache, value_cache)]  # views (C order)
    hc = bufs[0].shape[0] // blocks.shape[0]                                 # heads per chunk
    out = np.empty_like(qh)
    for h0 in range(0, Hkv, hc):
        h1 = min(h0 + hc, Hkv)
        rows = (blocks[None, :] * Hkv + np.arange(h0, h1)[:, None]).ravel()   # [h * nb]
        kv = []
        for flat, buf in zip(flats, bufs):
            # mode="clip": the rows are valid, and "raise" would make np.take buffer its output
            np.take(flat, rows, axis=0, out=buf[:rows.size], mode="clip")
            x = buf[:rows.size].reshape(h1 - h0, -1, D)[:, :L]                 # [h, L, D]
            kv.append(x if x.dtype == qh.dtype else x.astype(qh.dtype))
        out[h0:h1] = plain_softmax(qh[h0:h1], kv[0], kv[1], limits)
    return out


def _gather_buffers(key_cache: np.ndarray, max_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Two reusable gather buffers [hc * max_blocks, BS*D] (K and V), hc heads per chunk."""
    _, Hkv, BS, D = key_cache.shape
    per_head = max_blocks * BS * D * key_cache.itemsize
    hc = int(min(Hkv, max(1, GATHER_CHUNK_BYTES // per_head)))
    shape = (hc * max_blocks, BS * D)
    return np.empty(shape, key_cache.dtype), np.empty(shape, key_cache.dtype)


def _tile(cache: np.ndarray, ids: np.ndarray | int, pad: np.ndarray | None,
          acc: np.dtype) -> np.ndarray:
    """One block per sequence (or one block) in the accumulation dtype, with the slots past the
    sequence's length set to 0: they may hold garbage, and 0 * NaN would poison the sum."""
    t = cache[ids]                                   # [Sa, Hkv, BS, D] or [Hkv, BS, D]
    if t.dtype != acc:
        t = t.astype(acc)
    if pad is not None:
        if np.may_share_memory(t, cache):  # a view into the cache: never write the cache
            t = t.copy()
        np.copyto(t, 0, where=pad)
    return t


def gather_kv(key_cache: np.ndarray, value_cache: np.ndarray, block_table_row: np.ndarray,
              seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The logical k, v [Tk, Hkv, D] (Tk = seq_len) of one sequence, read through its block
    table row: copies of what a contiguous cache would hold, ready for ``dense_attention``."""
    NB, Hkv, BS, D = _check_caches(key_cache, value_cache)
    bt, lens = check_block_tables(block_table_row, seq_len, 1, NB, BS, single_row=True)
    L = int(lens[0])
    blocks = bt[0, :cdiv(L, BS)]
    k = key_cache[blocks].transpose(0, 2, 1, 3).reshape(-1, Hkv, D)[:L]   # [Tk, Hkv, D]
    v = value_cache[blocks].transpose(0, 2, 1, 3).reshape(-1, Hkv, D)[:L]
    return k, v


def paged_attention(query: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray,
                    block_tables: np.ndarray, seq_lens: np.ndarray, *,
                    scale: float | None = None, method: str = "gather") -> np.ndarray:
    """Decode attention: one new query per sequence over its paged K/V. query [S, H, D];
    block_tables int [S, MB] (padded with -1); seq_lens int [S] (the new token included).
    Returns [S, H, D] in query.dtype."""
    _check_method(method)
    NB, Hkv, BS, D = _check_caches(key_cache, value_cache)
    G = check_query(query, key_cache, None, "S")
    S = query.shape[0]
    bt, lens = check_block_tables(block_tables, seq_lens, S, NB, BS)
    check_scale(scale)
    if method == "gather" or S == 0:  # a prefill of one new token per sequence
        return _per_sequence(query, key_cache, value_cache, bt, lens, np.ones(S, int), scale,
                             method)
    acc = accumulation_dtype(query.dtype)
    scale = D ** -0.5 if scale is None else scale
    qh = _to_heads(query.reshape(1, S * Hkv * G, D), S * Hkv, scale, acc)
    qh = qh.reshape(S, Hkv, G, D)          # elementwise scaling: same bits as per sequence
    # Walk logical block j of every sequence at once, longest first, so the sequences that
    # still have a block j are a prefix [:n] (views, no fancy indexing).
    nblocks = cdiv(lens, BS)                                               # [S]
    order = np.argsort(-nblocks, kind="stable")
    qs, bts, ls, nbs = qh[order], bt[order], lens[order], nblocks[order]
    m, l, o = online_init((S, Hkv, G), D, acc)
    offsets = np.arange(BS)
    for j in range(int(nbs[0])):  # one iteration per logical block, never per token
        n = int(np.searchsorted(-nbs, -j, side="left"))          # sequences with nbs > j
        hidden = (j * BS + offsets)[None, :] >= ls[:n, None]     # [n, BS] past seq_len
        pad = hidden.any()
        kt = _tile(key_cache, bts[:n, j], hidden[:, None, :, None] if pad else None, acc)
        vt = _tile(value_cache, bts[:n, j], hidden[:, None, :, None] if pad else None, acc)
        mask = hidden[:, None, None, :] if pad else None
        m[:n], l[:n], o[:n] = online_step(qs[:n], kt, vt, mask, m[:n], l[:n], o[:n])
    o /= l
    oh = np.empty_like(o)
    oh[order] = o
    return oh.reshape(S, Hkv * G, D).astype(query.dtype, copy=False)


def paged_prefill_attention(query: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray,
                            block_tables: np.ndarray, seq_lens: np.ndarray,
                            query_lens: np.ndarray, *, scale: float | None = None,
                            method: str = "gather") -> np.ndarray:
    """Ragged prefill: query_lens[s] new tokens of sequence s attend causally over its cached
    prefix and themselves. query [T, H, D] packs them sequence by sequence (T = sum(query_lens));
    their K/V are in the cache and seq_lens [S] counts them. Returns [T, H, D] in query.dtype."""
    _check_method(method)
    NB, Hkv, BS, D = _check_caches(key_cache, value_cache)
    qlens = check_int_array("query_lens", query_lens, 1)
    S = qlens.shape[0]
    for s in np.flatnonzero(qlens < 1)[:1]:
        raise ValueError(f"query_lens[{s}]={qlens[s]}; every sequence needs at least 1 new token")
    check_query(query, key_cache, int(qlens.sum()), "T=sum(query_lens)")
    bt, lens = check_block_tables(block_tables, seq_lens, S, NB, BS)
    for s in np.flatnonzero(qlens > lens)[:1]:
        raise ValueError(f"query_lens[{s}]={qlens[s]} > seq_lens[{s}]={lens[s]}; seq_lens "
                         "must count the new tokens too")
    check_scale(scale)
    return _per_sequence(query, key_cache, value_cache, bt, lens, qlens, scale, method)


def _per_sequence(query: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray,
                  bt: np.ndarray, lens: np.ndarray, qlens: np.ndarray, scale: float | None,
                  method: str) -> np.ndarray:
    """Checked inputs, one sequence at a time: ragged query lengths give each its own shapes."""
    _, Hkv, BS, D = key_cache.shape
    G = query.shape[1] // Hkv
    acc = accumulation_dtype(query.dtype)
    scale = D ** -0.5 if scale is None else scale
    out = np.empty_like(query)
    nblocks = cdiv(lens, BS)
    starts = np.concatenate([[0], np.cumsum(qlens)])
    mb = int(nblocks.max(initial=1))  # initial: S may be 0
    bufs = _gather_buffers(key_cache, mb) if method == "gather" else None
    for s in range(qlens.size):
        T, L, nb = int(qlens[s]), int(lens[s]), int(nblocks[s])
        qh = _to_heads(query[starts[s]:starts[s + 1]], Hkv, scale, acc)       # [Hkv, G*T, D]
        limits = row_limits(T, L, G, True)                                     # [G*T]
        if method == "gather":
            oh = _gather_attention(qh, key_cache, value_cache, bt[s, :nb], L, limits, bufs)
        else:
            m, l, oh = online_init((Hkv, G * T), D, acc)
            for j in range(nb):  # walk the block table: one tile of BS keys per block
                keys = j * BS + np.arange(BS)
                hidden = keys[None, :] > limits[:, None]                      # [G*T, BS]
                tail = keys >= L                                               # [BS]
                pad = tail[None, :, None] if tail.any() else None
                kt = _tile(key_cache, int(bt[s, j]), pad, acc)                 # [Hkv, BS, D]
                vt = _tile(value_cache, int(bt[s, j]), pad, acc)
                m, l, oh = online_step(qh, kt, vt, hidden if hidden.any() else None, m, l, oh)
            oh /= l
        out[starts[s]:starts[s + 1]] = _from_heads(oh, T)
    return out
