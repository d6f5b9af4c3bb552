"""Hidden cases for exercises 12 (FlashInfer's CSR page table) and 13 (a two-level block table).

Exercise 13's byte counts are checked against the formulas, and one case states the figure the
seed answer's follow-up 1 gets wrong: at 128K tokens, block size 16 and int32 entries a flat row
is 8192 x 4 B = 32 KiB per request (64 KiB only with 8-byte entries).
"""

from __future__ import annotations

import numpy as np

from minipaged.kit.grader.core import Exercise, expect, expect_raises

EX_12 = Exercise(
    "12_flashinfer_csr", "padded block table <-> FlashInfer's CSR page table",
    ("block_table_to_csr", "csr_to_block_table"),
    hint="pages = ceil(seq_lens / BS); kv_indptr = [0, cumsum(pages)]; kv_indices = each row's "
         "first pages[s] entries, concatenated; last_page_len = seq_lens - BS * (pages - 1).")


def _random_batch(rng):
    bs = int(rng.choice([1, 4, 16]))
    s = int(rng.integers(1, 6))
    lens = rng.integers(1, 6 * bs + 1, size=s).astype(np.int32)
    pages = -(-lens // bs)
    mb = int(pages.max()) + int(rng.integers(0, 3))
    perm = rng.permutation(int(pages.sum()) + 5).astype(np.int32)
    tables = np.full((s, mb), -1, np.int32)
    used = 0
    for i, p in enumerate(pages):
        tables[i, :p] = perm[used:used + p]
        used += p
    return tables, lens, bs, pages


@EX_12.case("padded -> CSR on random batches (exact, int32)")
def _to_csr(m):
    rng = np.random.default_rng(30)
    for _ in range(50):
        tables, lens, bs, pages = _random_batch(rng)
        want_ptr = np.concatenate([[0], np.cumsum(pages)])
        want_idx = np.concatenate([tables[i, :p] for i, p in enumerate(pages)])
        want_last = lens - bs * (pages - 1)
        got = m.block_table_to_csr(tables, lens, bs)
        inputs = dict(block_tables=tables, seq_lens=lens, block_size=bs)
        for name, g, w in zip(("kv_indptr", "kv_indices", "kv_last_page_len"), got,
                              (want_ptr, want_idx, want_last)):
            g = np.asarray(g)
            expect(g.shape == w.shape and np.array_equal(g, w), f"wrong {name}", inputs=inputs,
                   expected=w, got=g)
            expect(g.dtype == np.int32, f"{name} must be int32", inputs=inputs,
                   expected="int32", got=str(g.dtype))


@EX_12.case("CSR -> padded round-trips")
def _from_csr(m):
    rng = np.random.default_rng(31)
    for _ in range(50):
        tables, lens, bs, pages = _random_batch(rng)
        ptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
        idx = np.concatenate([tables[i, :p] for i, p in enumerate(pages)]).astype(np.int32)
        last = (lens - bs * (pages - 1)).astype(np.int32)
        got_t, got_l = (np.asarray(x) for x in m.csr_to_block_table(ptr, idx, last, bs))
        want_t = tables[:, :int(pages.max())]
        inputs = dict(kv_indptr=ptr, kv_indices=idx, kv_last_page_len=last, block_size=bs)
        expect(got_t.shape == want_t.shape and np.array_equal(got_t, want_t),
               "wrong block_tables", inputs=inputs, expected=want_t, got=got_t)
        expect(np.array_equal(got_l, lens), "wrong seq_lens", inputs=inputs, expected=lens,
               got=got_l)


@EX_12.case("bad inputs are rejected")
def _csr_bad(m):
    expect_raises(lambda: m.block_table_to_csr(np.array([[0]], np.int32),
                                               np.array([0], np.int32), 4),
                  ValueError, "seq_len 0 has no last page (FlashInfer needs 1..page_size)",
                  inputs=dict(seq_lens=[0]))
    expect_raises(lambda: m.block_table_to_csr(np.array([[0]], np.int32),
                                               np.array([9], np.int32), 4),
                  ValueError, "9 tokens need 3 pages but the row holds 1",
                  inputs=dict(block_tables=[[0]], seq_lens=[9], block_size=4))
    expect_raises(lambda: m.csr_to_block_table(np.array([0, 2], np.int32),
                                               np.array([3, 4], np.int32),
                                               np.array([5], np.int32), 4),
                  ValueError, "last_page_len 5 > page size 4 must be rejected",
                  inputs=dict(kv_last_page_len=[5], block_size=4))
    expect_raises(lambda: m.csr_to_block_table(np.array([0, 3], np.int32),
                                               np.array([3, 4], np.int32),
                                               np.array([1], np.int32), 4),
                  ValueError, "kv_indptr ending at 3 with 2 indices must be rejected",
                  inputs=dict(kv_indptr=[0, 3], kv_indices=[3, 4]))


EX_13 = Exercise(
    "13_two_level_table", "a two-level block table for very long contexts",
    ("to_two_level", "lookup", "flat_table_bytes", "two_level_table_bytes"),
    hint="directory length ceil(max_blocks / leaf_size); leaf i holds entries "
         "[i*leaf_size, (i+1)*leaf_size) of the row, padded with -1; lookup reads "
         "leaves[directory[i // leaf_size]][i % leaf_size].")


@EX_13.case("lookups through the two levels equal the flat table")
def _two_level(m):
    rng = np.random.default_rng(32)
    for _ in range(60):
        max_blocks = int(rng.integers(1, 300))
        leaf = int(rng.choice([1, 4, 16, 64]))
        n = int(rng.integers(0, max_blocks + 1))
        row = [int(x) for x in rng.permutation(10_000)[:n]]
        directory, leaves = m.to_two_level(row, max_blocks, leaf)
        inputs = dict(block_table_row=row if n < 20 else f"<{n} entries>",
                      max_blocks=max_blocks, leaf_size=leaf)
        want_dir = -(-max_blocks // leaf)
        expect(len(directory) == want_dir, "directory length", inputs=inputs,
               expected=want_dir, got=len(directory))
        expect(len(leaves) == -(-n // leaf) and all(len(x) == leaf for x in leaves),
               "leaves: ceil(n / leaf_size) lists of leaf_size entries", inputs=inputs,
               expected=(-(-n // leaf), leaf), got=(len(leaves), [len(x) for x in leaves][:5]))
        for i in range(n):
            got = m.lookup(directory, leaves, leaf, i)
            expect(got == row[i], f"lookup of logical block {i}", inputs=inputs,
                   expected=row[i], got=got)
        if n < max_blocks:
            expect_raises(lambda d=directory, lv=leaves, lf=leaf, n=n: m.lookup(d, lv, lf, n),
                          (IndexError, ValueError), f"logical block {n} is not mapped",
                          inputs=inputs)


@EX_13.case("byte counts: flat versus two-level (and the seed's 128K figure)")
def _bytes(m):
    got = m.flat_table_bytes(131072, 16)
    expect(got == 32768, "128K tokens / 16 = 8192 int32 entries = 32 KiB per request "
           "(the seed's 64 KB assumes 8-byte entries)",
           inputs=dict(max_context=131072, block_size=16), expected=32768, got=got)
    rng = np.random.default_rng(33)
    for _ in range(100):
        bs = int(rng.choice([8, 16, 32]))
        max_ctx = int(rng.integers(1, 200_000))
        seq = int(rng.integers(1, max_ctx + 1))
        leaf = int(rng.choice([16, 64, 256]))
        eb = int(rng.choice([2, 4, 8]))
        mb = -(-max_ctx // bs)
        want_flat = mb * eb
        used_blocks = -(-seq // bs)
        want_two = (-(-mb // leaf) + -(-used_blocks // leaf) * leaf) * eb
        inputs = dict(seq_len=seq, max_context=max_ctx, block_size=bs, leaf_size=leaf,
                      entry_bytes=eb)
        got = m.flat_table_bytes(max_ctx, bs, eb)
        expect(got == want_flat, "wrong flat bytes", inputs=inputs, expected=want_flat, got=got)
        got = m.two_level_table_bytes(seq, max_ctx, bs, leaf, eb)
        expect(got == want_two, "wrong two-level bytes", inputs=inputs, expected=want_two,
               got=got)
