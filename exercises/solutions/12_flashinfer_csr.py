"""SPOILER: reference solution of exercise 12 (padded block table <-> FlashInfer CSR).

Try the exercise first: exercises/12_flashinfer_csr.py, graded by `minipaged check 12`.
"""

from __future__ import annotations

import numpy as np

EXERCISE = "12_flashinfer_csr"


def block_table_to_csr(block_tables, seq_lens, block_size):
    tables = np.asarray(block_tables)
    lens = np.asarray(seq_lens, dtype=np.int64)
    if lens.size and lens.min() < 1:
        raise ValueError(f"seq_lens must be >= 1, got {lens.tolist()}")
    pages = -(-lens // block_size)
    if pages.size and pages.max() > tables.shape[1]:
        raise ValueError(f"a sequence needs {int(pages.max())} pages; rows hold {tables.shape[1]}")
    indptr = np.concatenate([[0], np.cumsum(pages)]).astype(np.int32)
    indices = np.concatenate([tables[s, :p] for s, p in enumerate(pages)] +
                             [np.zeros(0, np.int32)]).astype(np.int32)
    last = (lens - block_size * (pages - 1)).astype(np.int32)
    return indptr, indices, last


def csr_to_block_table(kv_indptr, kv_indices, kv_last_page_len, block_size, pad=-1):
    indptr = np.asarray(kv_indptr, dtype=np.int64)
    indices = np.asarray(kv_indices)
    last = np.asarray(kv_last_page_len, dtype=np.int64)
    pages = np.diff(indptr)
    if indptr[0] != 0 or indptr[-1] != len(indices) or (pages < 0).any():
        raise ValueError(f"kv_indptr={indptr.tolist()} must rise from 0 to "
                         f"len(kv_indices)={len(indices)}")
    if (pages < 1).any():
        raise ValueError("every sequence needs at least one page")
    if last.shape != pages.shape or (last < 1).any() or (last > block_size).any():
        raise ValueError(f"kv_last_page_len={last.tolist()} must lie in 1..{block_size}")
    mb = max(int(pages.max()) if pages.size else 0, 1)
    tables = np.full((len(pages), mb), pad, dtype=np.int32)
    for s in range(len(pages)):
        tables[s, :pages[s]] = indices[indptr[s]:indptr[s + 1]]
    lens = (block_size * (pages - 1) + last).astype(np.int32)
    return tables, lens
