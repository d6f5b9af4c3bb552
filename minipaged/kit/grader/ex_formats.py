"""Hidden cases for exercises 12 (FlashInfer's CSR page table) and 13 (a two-level block table).

Exercise 13's byte counts are checked against the formulas, and one case pins a figure that is
easy to get wrong: at 128K tokens, block size 16 and int32 entries a flat row is 8192 x 4 B =
32 KiB per request (64 KiB only with 8-byte entries).
"""

from __future__ import annotations

import numpy as np

from minipaged._checks import cdiv
from minipaged.kit.grader.core import Exercise, agree, equal, rejects
from minipaged.kit.grader.ex_attention import random_block_tables

EX_12 = Exercise("12_flashinfer_csr", "padded block table <-> FlashInfer's CSR page table",
                 ("block_table_to_csr", "csr_to_block_table"))


def _random_batch(rng):
    bs, s = int(rng.choice([1, 4, 16])), int(rng.integers(1, 6))
    lens = rng.integers(1, 6 * bs + 1, size=s).astype(np.int32)
    pages = cdiv(lens, bs)
    tables = random_block_tables(rng, pages, int(pages.sum()) + 5)
    ptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    idx = np.concatenate([tables[i, :p] for i, p in enumerate(pages)]).astype(np.int32)
    return tables, lens, bs, pages, (ptr, idx, (lens - bs * (pages - 1)).astype(np.int32))


@EX_12.case("padded -> CSR on random batches (exact, int32)",
            hint="a row's pages are its first ceil(seq_len / BS) entries, whatever follows "
                 "them; indptr is the running total of page counts, starting at 0")
def _to_csr(m):
    rng = np.random.default_rng(30)
    for _ in range(50):
        tables, lens, bs, pages, want = _random_batch(rng)
        for s, p in enumerate(pages):  # padding is arbitrary: -1 here, 0s or stale ids there
            if rng.random() < 0.5:
                tables[s, p:] = 0 if rng.random() < 0.5 else rng.integers(
                    0, int(pages.sum()) + 5, size=tables.shape[1] - p)
        inputs = dict(block_tables=tables, seq_lens=lens, block_size=bs)
        got = m.block_table_to_csr(tables, lens, bs)
        for name, g, w in zip(("kv_indptr", "kv_indices", "kv_last_page_len"), got, want):
            equal(np.asarray(g), w, f"wrong {name}", inputs)
            equal(str(np.asarray(g).dtype), "int32", f"{name} must be int32", inputs)


@EX_12.case("CSR -> padded round-trips",
            hint="the widest row sets MB; seq_len = BS * (pages - 1) + last_page_len")
def _from_csr(m):
    rng = np.random.default_rng(31)
    for i in range(50):
        tables, lens, bs, pages, (ptr, idx, last) = _random_batch(rng)
        pad = {} if i % 2 else {"pad": 0}
        inputs = dict(kv_indptr=ptr, kv_indices=idx, kv_last_page_len=last, block_size=bs, **pad)
        got_t, got_l = (np.asarray(x) for x in m.csr_to_block_table(ptr, idx, last, bs, **pad))
        want_t = tables[:, :int(pages.max())]
        want_t[want_t < 0] = pad.get("pad", -1)
        equal(got_t, want_t, "wrong block_tables", inputs)
        equal(got_l, lens, "wrong seq_lens", inputs)
        for name, got in (("block_tables", got_t), ("seq_lens", got_l)):
            equal(str(got.dtype), "int32", f"{name} must be int32", inputs)


@EX_12.case("bad inputs are rejected",
            hint="check lengths and ranges of every argument before building the output")
def _csr_bad(m):
    i32 = lambda *v: np.array(v, np.int32)  # noqa: E731
    for call, what, inputs in (
            (lambda: m.block_table_to_csr(i32([0]), i32(0), 4),
             "seq_len 0 has no last page (FlashInfer needs 1..page_size)", dict(seq_lens=[0])),
            (lambda: m.block_table_to_csr(i32([0]), i32(-3), 4),
             "seq_len -3 must be rejected (a seq_len < 1, not only 0)", dict(seq_lens=[-3])),
            (lambda: m.block_table_to_csr(i32([0]), i32(9), 4),
             "9 tokens need 3 pages but the row holds 1",
             dict(block_tables=[[0]], seq_lens=[9], block_size=4)),
            (lambda: m.csr_to_block_table(i32(0, 2), i32(3, 4), i32(5), 4),
             "last_page_len 5 > page size 4 must be rejected",
             dict(kv_last_page_len=[5], block_size=4)),
            (lambda: m.csr_to_block_table(i32(0, 2), i32(3, 4), i32(0), 4),
             "last_page_len 0 must be rejected (a last page holds 1 .. page size tokens)",
             dict(kv_last_page_len=[0], block_size=4)),
            (lambda: m.csr_to_block_table(i32(0, 3), i32(3, 4), i32(1), 4),
             "kv_indptr ending at 3 with 2 indices must be rejected",
             dict(kv_indptr=[0, 3], kv_indices=[3, 4])),
            (lambda: m.csr_to_block_table(i32(1, 2), i32(3, 4), i32(1), 4),
             "kv_indptr starting at 1, not 0, must be rejected",
             dict(kv_indptr=[1, 2], kv_indices=[3, 4])),
            (lambda: m.csr_to_block_table(i32(0, 0, 2), i32(3, 4), i32(1, 1), 4),
             "sequence 0 owns no page (kv_indptr[0] == kv_indptr[1]) and must be rejected",
             dict(kv_indptr=[0, 0, 2], kv_indices=[3, 4], kv_last_page_len=[1, 1])),
            (lambda: m.csr_to_block_table(i32(0, 3, 2), i32(3, 4), i32(1, 1), 4),
             "kv_indptr [0, 3, 2] falls and must be rejected (sequence 1 would own -1 pages)",
             dict(kv_indptr=[0, 3, 2], kv_indices=[3, 4], kv_last_page_len=[1, 1])),
            (lambda: m.csr_to_block_table(i32(0, 1, 2), i32(3, 4), i32(1), 4),
             "one kv_last_page_len for two sequences must be rejected (NumPy would broadcast "
             "it)", dict(kv_indptr=[0, 1, 2], kv_indices=[3, 4], kv_last_page_len=[1]))):
        rejects(call, ValueError, what, inputs)


EX_13 = Exercise("13_two_level_table", "a two-level block table for very long contexts",
                 ("to_two_level", "lookup", "flat_table_bytes", "two_level_table_bytes"))


@EX_13.case("lookups through the two levels equal the flat table",
            hint="logical block i lives in leaf i // leaf_size at offset i % leaf_size; the "
                 "directory says where that leaf is")
def _two_level(m):
    rng = np.random.default_rng(32)
    for _ in range(60):
        max_blocks, leaf = int(rng.integers(1, 300)), int(rng.choice([1, 4, 16, 64]))
        n = int(rng.integers(0, max_blocks + 1))
        row = [int(x) for x in rng.permutation(10_000)[:n]]
        directory, leaves = m.to_two_level(row, max_blocks, leaf)
        inputs = dict(block_table_row=row if n < 20 else f"<{n} entries>",
                      max_blocks=max_blocks, leaf_size=leaf)
        equal(len(directory), cdiv(max_blocks, leaf), "directory length", inputs)
        equal(list(directory), [i if i < cdiv(n, leaf) else -1 for i in range(len(directory))],
              "directory entries", inputs, hint="a directory entry names a leaf only where the "
              "row has one; the others say 'no leaf'")
        equal([len(x) for x in leaves], [leaf] * cdiv(n, leaf),
              "leaves: ceil(n / leaf_size) lists of leaf_size entries each", inputs)
        equal([m.lookup(directory, leaves, leaf, i) for i in range(n)], row,
              "lookups of logical blocks 0 .. n-1", inputs)
        if n < max_blocks:
            rejects(lambda d=directory, lv=leaves, lf=leaf, n=n: m.lookup(d, lv, lf, n),
                    (IndexError, ValueError), f"logical block {n} is not mapped", inputs,
                    hint="an unmapped entry holds -1, which Python would happily use as an "
                         "index: check for it")


@EX_13.case("a row longer than max_blocks, leaf_size=0 and negative blocks are rejected",
            hint="Python lists accept negative indices (directory[-1] is the last leaf): check "
                 "the range of every argument first")
def _two_level_bad(m):
    rejects(lambda: m.to_two_level([1, 2, 3], 2, 4), ValueError,
            "3 blocks in a table of max_blocks=2 must be rejected",
            dict(block_table_row=[1, 2, 3], max_blocks=2, leaf_size=4),
            hint="the directory is sized for max_blocks: a longer row does not fit in it")
    for leaf in (0, -2):
        rejects(lambda leaf=leaf: m.to_two_level([1], 4, leaf), ValueError,
                f"leaf_size={leaf} must be rejected",
                dict(block_table_row=[1], max_blocks=4, leaf_size=leaf),
                hint="a leaf of fewer than 1 entry holds nothing: check leaf_size >= 1 before "
                     "dividing by it")
    row = [5, 6, 7, 8]  # every leaf full: a wrapped-around index finds a real block
    directory, leaves = m.to_two_level(row, 4, 2)
    for bad in (-1, -3, 4):
        rejects(lambda bad=bad: m.lookup(directory, leaves, 2, bad), (IndexError, ValueError),
                f"logical block {bad} is out of range and must be rejected",
                dict(block_table_row=row, max_blocks=4, leaf_size=2, logical_block=bad))


@EX_13.case("byte counts: flat versus two-level (and the 128K-token figure)",
            hint="the flat row is sized for max_context; the two-level table pays a full "
                 "directory plus only the leaves in use")
def _bytes(m):
    equal(m.flat_table_bytes(131072, 16), 32768, "128K tokens / 16 = 8192 int32 entries = "
          "32 KiB per request (64 KiB assumes 8-byte entries)",
          dict(max_context=131072, block_size=16))
    rng = np.random.default_rng(33)
    cases = []  # (seq_len, max_context, block_size, leaf_size, entry_bytes)
    for _ in range(100):
        bs, max_ctx = int(rng.choice([8, 16, 32])), int(rng.integers(1, 200_000))
        seq, leaf = int(rng.integers(1, max_ctx + 1)), int(rng.choice([16, 64, 256]))
        cases.append((seq, max_ctx, bs, leaf, int(rng.choice([2, 4, 8]))))
    agree(m.flat_table_bytes, lambda ctx, bs, eb: cdiv(ctx, bs) * eb,
          [(c[1], c[2], c[4]) for c in cases], "wrong flat bytes")
    agree(m.two_level_table_bytes, lambda seq, ctx, bs, leaf, eb: eb * (
        cdiv(cdiv(ctx, bs), leaf) + cdiv(cdiv(seq, bs), leaf) * leaf), cases,
          "wrong two-level bytes")
