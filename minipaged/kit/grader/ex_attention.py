"""Hidden cases for exercises 06 (paged attention by gathering) and 07 (online softmax).

The oracle is the package's ``dense_attention`` (``minipaged/attention.py``) run on each
sequence's logical K/V, kept by the grader in a plain contiguous array. Every unused slot of the
pool holds NaN, so reading one shows up in the output. Exercise 07's caches serve one block per
read (``OneBlockAtATime``), so a gather of the whole sequence fails, naming the learner's line.

Tolerance: the learner's code may sum in another order than the oracle, so results are compared
with |got - want| <= tol * (1 + |want|), tol = 1e-9 in float64 (about a million times the
rounding error of these sizes) and 2e-5 in float32.
"""

from __future__ import annotations

import linecache
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from minipaged._checks import cdiv
from minipaged.attention import dense_attention
from minipaged.kit.grader.core import CaseFailure, Exercise, equal, rejects


def random_block_tables(rng: np.random.Generator, need, num_blocks: int) -> np.ndarray:
    """Padded block tables [S, MB], int32: row s holds need[s] distinct random blocks of a pool
    of num_blocks, then -1 padding (0 to 2 spare columns beyond the longest row)."""
    perm = rng.permutation(num_blocks)
    tables = np.full((len(need), max(need) + int(rng.integers(0, 3))), -1, dtype=np.int32)
    for s, n in enumerate(need):
        tables[s, :n], perm = perm[:n], perm[n:]
    return tables


def make_batch(rng: np.random.Generator, dtype=np.float64, junk: bool = False):
    """A random decode batch in a paged pool, plus each sequence's K/V kept contiguously.
    With ``junk``, the entries past a row's blocks hold random ids in [-3, NB + 3)."""
    hkv = int(rng.choice([1, 2, 4]))
    h, d = hkv * int(rng.choice([1, 2, 4])), int(rng.choice([4, 8, 16]))
    bs, s_count = int(rng.choice([1, 2, 4, 8, 16])), int(rng.integers(1, 5))
    seq_lens = rng.integers(1, 71, size=s_count).astype(np.int32)
    need = [cdiv(int(n), bs) for n in seq_lens]
    nb = sum(need) + int(rng.integers(0, 4))
    tables = random_block_tables(rng, need, nb)
    for s, n in enumerate(need if junk else []):  # the exercises say: they may hold anything
        tables[s, n:] = rng.integers(-3, nb + 3, size=tables.shape[1] - n)
    kc = np.full((nb, hkv, bs, d), np.nan, dtype=dtype)  # [NB, Hkv, BS, D]
    vc = np.full((nb, hkv, bs, d), np.nan, dtype=dtype)
    ks, vs = [], []
    for s, n in enumerate(int(n) for n in seq_lens):
        k, v = (rng.standard_normal((n, hkv, d)).astype(dtype) for _ in range(2))
        pos = np.arange(n)
        kc[tables[s, pos // bs], :, pos % bs] = k
        vc[tables[s, pos // bs], :, pos % bs] = v
        ks.append(k)
        vs.append(v)
    q = rng.standard_normal((s_count, h, d)).astype(dtype)
    return q, kc, vc, tables, seq_lens, ks, vs


class OneBlockAtATime(np.ndarray):
    """A cache [NB, Hkv, BS, D] that serves one block per read: an index (or ``take``) that
    touches two blocks or more of axis 0 at once fails the case, so a kernel that gathers a
    whole sequence shows. Every array it hands out is a plain ndarray."""

    name = "cache"

    @classmethod
    def of(cls, cache: np.ndarray, name: str) -> OneBlockAtATime:
        out = cache.view(cls)
        out.name, out.guarded = name, True
        return out

    def _refuse_many(self, blocks: np.ndarray, index: Callable[[], str]) -> None:
        blocks = np.unique(blocks)
        if getattr(self, "guarded", False) and blocks.size > 1:
            caller = sys._getframe(2)  # the learner's line (np.take: past NumPy's frames)
            while caller.f_back and "numpy" in Path(caller.f_code.co_filename).parts:
                caller = caller.f_back
            line = linecache.getline(caller.f_code.co_filename, caller.f_lineno).strip()
            raise CaseFailure(
                f"{self.name} was read {blocks.size} blocks at once; this exercise reads one "
                f"block at a time and never gathers the whole sequence",
                inputs=dict(blocks_read=blocks.tolist()[:12], index=index()[:120],
                            at=f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}: "
                               f"{line}"),
                expected="an index that touches one block", got=f"{blocks.size} blocks",
                hint="walk the block table: each step reads one physical block and merges its "
                     "partial result into the running one")

    def __getitem__(self, index):
        self._refuse_many(_blocks_read(index, self.shape[0], self.ndim), lambda: repr(index))
        out = super().__getitem__(index)
        return out.view(np.ndarray) if isinstance(out, np.ndarray) else out

    def take(self, indices, axis=None, out=None, mode="raise"):
        nb, i = self.shape[0], np.asarray(indices)
        blocks = (np.mod(i, nb) if axis in (0, -self.ndim) else
                  np.mod(i // (self.size // nb), nb) if axis is None else np.arange(nb))
        self._refuse_many(blocks.ravel(), lambda: f"take({indices!r}, axis={axis})")
        got = self.view(np.ndarray).take(indices, axis=axis, out=out, mode=mode)
        return got.view(np.ndarray) if isinstance(got, np.ndarray) else got


def _blocks_read(index, nb: int, ndim: int) -> np.ndarray:
    """The blocks (entries of axis 0) that ``array[index]`` reads."""
    parts = [k for k in (index if isinstance(index, tuple) else (index,)) if k is not None]
    if parts and parts[0] is Ellipsis:
        if len(parts) <= ndim:  # the ellipsis stands for axis 0 (and maybe more)
            return np.arange(nb)
        parts = parts[1:]
    if not parts or isinstance(parts[0], slice):
        return np.arange(nb)[parts[0] if parts else slice(None)]
    first = np.asarray(parts[0])
    if first.dtype == bool:
        return np.nonzero(first)[0] if first.ndim else np.arange(nb)
    return np.mod(first, nb).ravel() if first.dtype.kind in "iu" else np.zeros(0, np.int64)


def _check(fn, q, kc, vc, tables, lens, ks, vs, message, scale=None,
           one_block: bool = False) -> None:
    """``fn`` on the paged batch must match dense attention over each sequence's own K/V (in
    float64), within the tolerance of q's dtype, and return q's dtype. With ``one_block`` the
    caches refuse any read of more than one block at once (OneBlockAtATime)."""
    q64 = q.astype(np.float64)  # decode: one query [1, H, D] over k/v [Tk, Hkv, D] per sequence
    want = np.stack([dense_attention(q64[s:s + 1], ks[s].astype(np.float64),
                                     vs[s].astype(np.float64), scale=scale, causal=True)[0]
                     for s in range(len(lens))])
    args = (q, kc, vc, tables, lens)
    before = [a.copy() for a in args]
    if one_block:
        kc, vc = OneBlockAtATime.of(kc, "key_cache"), OneBlockAtATime.of(vc, "value_cache")
    got = fn(q, kc, vc, tables, lens, **({} if scale is None else {"scale": scale}))
    inputs = dict(S_H_D=q.shape, NB_Hkv_BS_D=kc.shape, block_tables=tables, seq_lens=lens)
    for name, now, was in zip(("query", "key_cache", "value_cache", "block_tables", "seq_lens"),
                              args, before):
        equal(now, was, f"{fn.__name__} changed its argument {name}", inputs,
              hint="the caller's arrays are the model's live state: compute on new arrays")
    nan = np.asarray(got).dtype.kind == "f" and np.isnan(got).any()
    equal(got, want, message, inputs, tol=1e-9 if q.dtype == np.float64 else 2e-5,
          hint="NaN in the output: an unused slot or a padding entry was read, or exp "
          "overflowed (subtract the largest logit first)" if nan else "")
    equal(str(np.asarray(got).dtype), str(q.dtype), "output dtype must be query's dtype", inputs)


def _attention_cases(ex: Exercise, fn_name: str, hint: str, one_block: bool = False) -> None:
    """The cases exercises 06 and 07 share; ``one_block``: the caches serve one block per read."""
    @ex.case("a single sequence in one block (no GQA)", hint=hint)
    def _single(m):
        rng = np.random.default_rng(10)
        q = rng.standard_normal((1, 2, 4))
        k, v = rng.standard_normal((3, 2, 4)), rng.standard_normal((3, 2, 4))
        kc, vc = np.full((2, 2, 4, 4), np.nan), np.full((2, 2, 4, 4), np.nan)
        kc[1, :, :3] = k.transpose(1, 0, 2)
        vc[1, :, :3] = v.transpose(1, 0, 2)
        _check(getattr(m, fn_name), q, kc, vc, np.array([[1, -1]], np.int32),
               np.array([3], np.int32), [k], [v], "one sequence of 3 tokens in block 1",
               one_block=one_block)

    @ex.case("random batches: GQA, ragged lengths, scattered blocks, NaN garbage (float64)",
             hint="query head h reads KV head h // (H // Hkv); each sequence stops at its "
                  "own seq_len, and its row's entries past its blocks hold junk half the time")
    def _random(m):
        rng = np.random.default_rng(11)
        for i in range(25):
            _check(getattr(m, fn_name), *make_batch(rng, junk=bool(i % 2)), "random batch",
                   one_block=one_block)

    @ex.case("float32 and an explicit scale",
             hint="use the scale argument when given (1/sqrt(D) only by default) and return "
                  "the query's dtype")
    def _f32(m):
        rng = np.random.default_rng(12)
        for _ in range(10):
            _check(getattr(m, fn_name), *make_batch(rng, np.float32), "float32 batch, scale=0.3",
                   scale=0.3, one_block=one_block)
        _check(getattr(m, fn_name), *make_batch(rng), "scale=0.0 is a scale too (every token "
               "weighs the same): test `scale is None`, not `not scale`", scale=0.0,
               one_block=one_block)

    @ex.case("large logits (scale=1000) do not overflow",
             hint="exp of a logit near 1000 is inf: subtract the largest logit before np.exp")
    def _large(m):
        rng = np.random.default_rng(15)
        for _ in range(5):
            _check(getattr(m, fn_name), *make_batch(rng), "scale=1000", scale=1000.0,
                   one_block=one_block)

    @ex.case("H not a multiple of Hkv, or D of query and cache differing, is rejected",
             hint="grouped-query attention needs H % Hkv == 0, and q . k needs one head size: "
                  "check both up front (NumPy broadcasts a head size of 1 without a word)")
    def _bad_heads(m):
        kc = np.zeros((1, 2, 4, 4))
        for q, what in ((np.zeros((1, 3, 4)), "H=3 query heads over Hkv=2 KV heads"),
                        (np.zeros((1, 2, 1)), "query head size D=1 over a cache with D=4")):
            rejects(lambda q=q: getattr(m, fn_name)(q, kc, kc, np.array([[0]], np.int32),
                                                    np.array([2], np.int32)),
                    ValueError, f"{what} must be rejected", dict(query_shape=q.shape,
                                                                 cache_shape=kc.shape))


EX_06 = Exercise("06_paged_gather", "paged attention by gathering through the block table",
                 ("gather_kv", "paged_attention_gather"))


@EX_06.case("gather_kv returns the logical K/V in token order",
            hint="gathered blocks are [n, Hkv, BS, D]: bring BS next to n before merging "
                 "them into tokens, then cut at seq_len (the row's entries past its blocks "
                 "hold junk half the time: use only the first n)")
def _gather(m):
    rng = np.random.default_rng(13)
    for i in range(30):
        q, kc, vc, tables, lens, ks, vs = make_batch(rng, junk=bool(i % 2))
        for s in range(len(lens)):
            inputs = dict(NB_Hkv_BS_D=kc.shape, block_table_row=tables[s], seq_len=int(lens[s]))
            k, v = m.gather_kv(kc, vc, tables[s], int(lens[s]))
            equal(np.asarray(k), ks[s], "gathered K differ from what was written", inputs)
            equal(np.asarray(v), vs[s], "gathered V differ from what was written", inputs)


@EX_06.case("gather_kv rejects seq_len=0, and -1 or out-of-range entries inside seq_len",
            hint="key_cache[-1] is a real block in NumPy: check the entries the sequence uses")
def _gather_bad(m):
    kc = np.zeros((4, 1, 2, 2))
    for row, n in (([0, -1], 3), ([0, 9], 4)):
        rejects(lambda row=row, n=n: m.gather_kv(kc, kc, np.array(row, np.int32), n),
                (ValueError, IndexError), "a bad entry inside seq_len must be rejected",
                dict(NB=4, BS=2, block_table_row=row, seq_len=n))
    rejects(lambda: m.gather_kv(kc, kc, np.array([0, 1], np.int32), 0), ValueError,
            "seq_len=0 must be rejected", dict(NB=4, BS=2, block_table_row=[0, 1], seq_len=0),
            hint="a sequence holds at least one token: check seq_len >= 1 first")


_attention_cases(EX_06, "paged_attention_gather",
                 hint="gather each sequence's K/V in token order, then dense attention per "
                      "sequence")

EX_07 = Exercise("07_online_softmax", "paged attention block by block with the online softmax",
                 ("merge_partials", "paged_attention_online"))


def _partial(logits: np.ndarray, v: np.ndarray):
    mx = logits.max(axis=-1)
    p = np.exp(logits - mx[..., None])
    total = p.sum(axis=-1)
    return mx, total, np.einsum("...n,nd->...d", p, v) / total[..., None]


@EX_07.case("merge_partials of two token sets equals the whole (and is symmetric)",
            hint="both partial sums must be rescaled to the common maximum before they are "
                 "added")
def _merge(m):
    rng = np.random.default_rng(14)
    for _ in range(30):
        h, d = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        na, nb = int(rng.integers(1, 20)), int(rng.integers(1, 20))
        logits = rng.standard_normal((h, na + nb)) * float(rng.choice([1, 10, 50]))
        v = rng.standard_normal((na + nb, d))
        a, b = _partial(logits[:, :na], v[:na]), _partial(logits[:, na:], v[na:])
        want = _partial(logits, v)
        for first, second in ((a, b), (b, a)):
            got = m.merge_partials(*first, *second)
            inputs = dict(m_a=first[0], l_a=first[1], m_b=second[0], l_b=second[1],
                          o_shape=a[2].shape)
            for name, g, w in zip("mlo", got, want):
                equal(np.asarray(g, dtype=np.float64), w, f"merged {name} is wrong", inputs,
                      tol=1e-12)


_attention_cases(EX_07, "paged_attention_online",
                 hint="only the first seq_len - i*BS slots of the last block are real tokens; "
                      "merge one block at a time", one_block=True)
