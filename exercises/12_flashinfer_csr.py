"""Exercise 12: from a padded block table to FlashInfer's CSR page table, and back.

Lesson: lessons/07_*.py (block size and block-table memory).  Check: minipaged check 12

vLLM's kernels take one padded int32 array block_tables [S, MB] plus seq_lens [S]. FlashInfer
stores the same mapping as a block-sparse matrix in CSR (compressed sparse row) form:

    kv_indptr        int32 [S + 1]    sequence s owns kv_indices[kv_indptr[s]:kv_indptr[s+1]]
    kv_indices       int32 [total]    the physical pages (blocks), sequence after sequence
    kv_last_page_len int32 [S]        tokens in each sequence's last page, 1 .. page_size

    seq_len = page_size * (num_pages - 1) + last_page_len

CSR stores no padding: its size is the number of pages in use, not S * MB.
"""

from __future__ import annotations

import numpy as np

EXERCISE = "12_flashinfer_csr"


def block_table_to_csr(block_tables: np.ndarray, seq_lens: np.ndarray,
                       block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Return (kv_indptr, kv_indices, kv_last_page_len), all int32.

    Only the first ceil(seq_len / BS) entries of each row are pages; the rest is padding.
    Errors: ValueError when a seq_len < 1 (FlashInfer's last_page_len must be >= 1) or a row
    holds fewer than ceil(seq_len / BS) entries.
    Hint: pages = -(-seq_lens // BS); indptr = concatenate([0], cumsum(pages));
    last = seq_lens - BS * (pages - 1).
    """
    raise NotImplementedError


def csr_to_block_table(kv_indptr: np.ndarray, kv_indices: np.ndarray,
                       kv_last_page_len: np.ndarray, block_size: int,
                       pad: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """The inverse: return (block_tables int32 [S, MB], seq_lens int32 [S]) with MB the
    largest page count (at least 1) and ``pad`` after each row's pages.

    Errors: ValueError when kv_indptr is not non-decreasing from 0 to len(kv_indices), when a
    sequence has no page, or kv_last_page_len does not hold one entry per sequence, each in
    1 .. block_size.
    """
    raise NotImplementedError
