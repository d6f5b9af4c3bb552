"""Hidden cases for exercises 06 (paged attention by gathering) and 07 (online softmax).

The oracle is the package's ``dense_attention`` (minipaged/attention.py) run on each sequence's
logical K/V, kept by the grader in a plain contiguous array; a plain NumPy softmax stands in
while that module is absent. Every unused slot of the pool holds NaN, so reading one shows up.

Tolerance: the learner's code may sum in a different order than the oracle, so results are
compared with |got - want| <= 1e-9 * (1 + |want|) in float64 (about a million times the
rounding error of these sizes) and 2e-5 in float32.
"""

from __future__ import annotations

import numpy as np

from minipaged.kit.grader.core import Exercise, expect, expect_raises


def _dense(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float | None) -> np.ndarray:
    """Decode attention of one sequence: q [H, D], k/v [Tk, Hkv, D] -> [H, D]."""
    try:
        from minipaged.attention import dense_attention
    except ImportError:
        h, d = q.shape
        g = h // k.shape[1]
        sc = 1.0 / np.sqrt(d) if scale is None else scale
        logits = np.einsum("hd,thd->ht", q, np.repeat(k, g, axis=1)) * sc
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        return np.einsum("ht,thd->hd", p, np.repeat(v, g, axis=1)).astype(q.dtype)
    return dense_attention(q[None], k, v, scale=scale, causal=True)[0]


def make_batch(rng: np.random.Generator, dtype=np.float64, *, max_len: int = 70):
    """A random decode batch in a paged pool, plus each sequence's K/V kept contiguously."""
    hkv = int(rng.choice([1, 2, 4]))
    h = hkv * int(rng.choice([1, 2, 4]))
    d = int(rng.choice([4, 8, 16]))
    bs = int(rng.choice([1, 2, 4, 8, 16]))
    s_count = int(rng.integers(1, 5))
    seq_lens = rng.integers(1, max_len + 1, size=s_count).astype(np.int32)
    need = [-(-int(n) // bs) for n in seq_lens]
    nb = sum(need) + int(rng.integers(0, 4))
    perm = rng.permutation(nb)
    mb = max(need) + int(rng.integers(0, 3))
    tables = np.full((s_count, mb), -1, dtype=np.int32)
    kc = np.full((nb, hkv, bs, d), np.nan, dtype=dtype)
    vc = np.full((nb, hkv, bs, d), np.nan, dtype=dtype)
    ks, vs, used = [], [], 0
    for s, n in enumerate(seq_lens):
        blocks = perm[used:used + need[s]]
        used += need[s]
        tables[s, :need[s]] = blocks
        k = rng.standard_normal((int(n), hkv, d)).astype(dtype)
        v = rng.standard_normal((int(n), hkv, d)).astype(dtype)
        for t in range(int(n)):
            kc[blocks[t // bs], :, t % bs] = k[t]
            vc[blocks[t // bs], :, t % bs] = v[t]
        ks.append(k)
        vs.append(v)
    q = rng.standard_normal((s_count, h, d)).astype(dtype)
    return q, kc, vc, tables, seq_lens, ks, vs


def _compare(got, want, dtype, message, inputs) -> None:
    got = np.asarray(got)
    expect(got.shape == want.shape, message + ": wrong output shape", inputs=inputs,
           expected=want.shape, got=got.shape)
    tol = 1e-9 if dtype == np.float64 else 2e-5
    err = np.abs(got.astype(np.float64) - want) / (1 + np.abs(want))
    ok = bool(np.all(np.isfinite(got))) and float(err.max()) <= tol
    if not ok:
        idx = np.unravel_index(int(np.nanargmax(np.where(np.isfinite(err), err, np.inf))),
                               err.shape)
        expect(False, f"{message}: output differs at [s, h, d] = {list(map(int, idx))} "
               f"(NaN means an unused slot or padding entry was read)", inputs=inputs,
               expected=float(want[idx]), got=float(got[idx]))


def _batch_inputs(q, kc, tables, seq_lens):
    return dict(S_H_D=q.shape, NB_Hkv_BS_D=kc.shape, block_tables=tables, seq_lens=seq_lens)


def _attention_cases(ex: Exercise, fn_name: str) -> None:
    @ex.case("a single sequence in one block (no GQA)")
    def _single(m):
        rng = np.random.default_rng(10)
        q = rng.standard_normal((1, 2, 4))
        k = rng.standard_normal((3, 2, 4))
        v = rng.standard_normal((3, 2, 4))
        kc = np.full((2, 2, 4, 4), np.nan)
        vc = np.full((2, 2, 4, 4), np.nan)
        kc[1, :, :3] = k.transpose(1, 0, 2)
        vc[1, :, :3] = v.transpose(1, 0, 2)
        tables = np.array([[1, -1]], np.int32)
        lens = np.array([3], np.int32)
        got = getattr(m, fn_name)(q, kc, vc, tables, lens)
        want = _dense(q[0], k, v, None)[None]
        _compare(got, want, np.float64, "one sequence of 3 tokens in block 1",
                 _batch_inputs(q, kc, tables, lens))

    @ex.case("random batches: GQA, ragged lengths, scattered blocks, NaN garbage (float64)")
    def _random(m):
        rng = np.random.default_rng(11)
        for _ in range(25):
            q, kc, vc, tables, lens, ks, vs = make_batch(rng)
            want = np.stack([_dense(q[s], ks[s], vs[s], None) for s in range(len(lens))])
            got = getattr(m, fn_name)(q, kc, vc, tables, lens)
            _compare(got, want, np.float64, "random batch", _batch_inputs(q, kc, tables, lens))

    @ex.case("float32 and an explicit scale")
    def _f32(m):
        rng = np.random.default_rng(12)
        for _ in range(10):
            q, kc, vc, tables, lens, ks, vs = make_batch(rng, np.float32)
            want = np.stack([_dense(q[s].astype(np.float64), ks[s].astype(np.float64),
                                    vs[s].astype(np.float64), 0.3) for s in range(len(lens))])
            got = getattr(m, fn_name)(q, kc, vc, tables, lens, scale=0.3)
            expect(np.asarray(got).dtype == np.float32, "output dtype must be query's dtype",
                   expected="float32", got=str(np.asarray(got).dtype))
            _compare(got, want, np.float32, "float32 batch, scale=0.3",
                     _batch_inputs(q, kc, tables, lens))

    @ex.case("H not a multiple of Hkv is rejected")
    def _bad_heads(m):
        q = np.zeros((1, 3, 4))
        kc = np.zeros((1, 2, 4, 4))
        expect_raises(lambda: getattr(m, fn_name)(q, kc, kc, np.array([[0]], np.int32),
                                                  np.array([2], np.int32)),
                      ValueError, "H=3 query heads over Hkv=2 KV heads must be rejected",
                      inputs=dict(H=3, Hkv=2))


EX_06 = Exercise(
    "06_paged_gather", "paged attention by gathering through the block table",
    ("gather_kv", "paged_attention_gather"),
    hint="gather: key_cache[row[:n]].transpose(0, 2, 1, 3).reshape(n * BS, Hkv, D)[:seq_len]; "
         "then dense attention per sequence, with np.repeat over heads for GQA.")


@EX_06.case("gather_kv returns the logical K/V in token order")
def _gather(m):
    rng = np.random.default_rng(13)
    for _ in range(30):
        q, kc, vc, tables, lens, ks, vs = make_batch(rng)
        for s in range(len(lens)):
            k, v = m.gather_kv(kc, vc, tables[s], int(lens[s]))
            inputs = dict(NB_Hkv_BS_D=kc.shape, block_table_row=tables[s], seq_len=int(lens[s]))
            k, v = np.asarray(k), np.asarray(v)
            expect(k.shape == ks[s].shape, "wrong K shape", inputs=inputs,
                   expected=ks[s].shape, got=k.shape)
            expect(np.array_equal(k, ks[s]) and np.array_equal(v, vs[s]),
                   "gathered K/V differ from what was written (copying must be exact)",
                   inputs=inputs, expected=ks[s][:, 0, 0], got=k[:, 0, 0])


@EX_06.case("gather_kv rejects -1 or out-of-range entries inside seq_len")
def _gather_bad(m):
    kc = np.zeros((4, 1, 2, 2))
    for row, n in (([0, -1], 3), ([0, 9], 4)):
        expect_raises(lambda row=row, n=n: m.gather_kv(kc, kc, np.array(row, np.int32), n),
                      (ValueError, IndexError), "a bad entry inside seq_len must be rejected",
                      inputs=dict(NB=4, BS=2, block_table_row=row, seq_len=n))


_attention_cases(EX_06, "paged_attention_gather")


EX_07 = Exercise(
    "07_online_softmax", "paged attention block by block with the online softmax",
    ("merge_partials", "paged_attention_online"),
    hint="m = max(m_a, m_b); rescale each l by exp(its m - m); o = (l_a' o_a + l_b' o_b) / l. "
         "In the loop, only the first seq_len - i*BS slots of the last block are real tokens.")


def _partial(logits: np.ndarray, v: np.ndarray):
    m = logits.max(axis=-1)
    p = np.exp(logits - m[..., None])
    l = p.sum(axis=-1)
    return m, l, np.einsum("...n,nd->...d", p, v) / l[..., None]


@EX_07.case("merge_partials of two token sets equals the whole (and is symmetric)")
def _merge(m):
    rng = np.random.default_rng(14)
    for _ in range(30):
        h, d = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        na, nb = int(rng.integers(1, 20)), int(rng.integers(1, 20))
        logits = rng.standard_normal((h, na + nb)) * float(rng.choice([1, 10, 50]))
        v = rng.standard_normal((na + nb, d))
        ma, la, oa = _partial(logits[:, :na], v[:na])
        mb, lb, ob = _partial(logits[:, na:], v[na:])
        want = _partial(logits, v)
        for order in ((ma, la, oa, mb, lb, ob), (mb, lb, ob, ma, la, oa)):
            got = m.merge_partials(*order)
            inputs = dict(m_a=order[0], l_a=order[1], m_b=order[3], l_b=order[4],
                          o_shape=oa.shape)
            for name, g, w in zip("mlo", got, want):
                g = np.asarray(g, dtype=np.float64)
                ok = g.shape == w.shape and np.allclose(g, w, rtol=1e-12, atol=1e-12)
                expect(ok, f"merged {name} is wrong", inputs=inputs, expected=w, got=g)


_attention_cases(EX_07, "paged_attention_online")
