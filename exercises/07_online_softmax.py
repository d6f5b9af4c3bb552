"""Exercise 07: paged attention block by block, with the online softmax.

Lessons: lessons/03_*.py (paging) and lessons/08_*.py (the GPU kernel).  Check: minipaged check 7

A GPU kernel never builds the gathered K/V of exercise 06: it walks the block table one block at
a time. This exercise does that walk with the online softmax (FlashAttention's way, and
minipaged's version-0 CUDA kernel's), keeping per head three running values over the tokens seen
so far:

    m  the largest logit                     (so exp never overflows)
    l  sum of exp(logit - m)                 (the softmax denominator)
    o  sum of exp(logit - m) * v / l         (the output so far, already normalised)

vLLM's paged kernel, and minipaged's CUDA versions 1-4, keep every logit in shared memory
instead, and need this merge only to combine partitions (vLLM's v2 kernel, minipaged's v2 and
v4). Two partial results (m_a, l_a, o_a) and (m_b, l_b, o_b) over disjoint sets of tokens
combine exactly like this (FlashAttention; vLLM's v2 kernel reduces its partitions the same way,
csrc/attention/attention_kernels.cuh, paged_attention_v2_reduce_kernel):

    m   = max(m_a, m_b)
    l_a' = l_a * exp(m_a - m);   l_b' = l_b * exp(m_b - m)
    l   = l_a' + l_b'
    o   = (l_a' * o_a + l_b' * o_b) / l

Shapes as in exercise 06: query [S, H, D], caches [NB, Hkv, BS, D], block_tables int32 [S, MB],
seq_lens int32 [S], output [S, H, D].
"""

from __future__ import annotations

import numpy as np

EXERCISE = "07_online_softmax"


def merge_partials(m_a: np.ndarray, l_a: np.ndarray, o_a: np.ndarray, m_b: np.ndarray,
                   l_b: np.ndarray, o_b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Combine two partial softmax results; return (m, l, o).

    Shapes: m_*, l_* [...]; o_* [..., D] (the same leading shape; D last).
    Invariant: merging partials of token sets A and B gives the same (m, l, o) as computing
    over A and B together (to rounding); merging is symmetric.
    Hint: broadcast the scalar factors over D with [..., None].
    """
    raise NotImplementedError


def paged_attention_online(query: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray,
                           block_tables: np.ndarray, seq_lens: np.ndarray,
                           scale: float | None = None) -> np.ndarray:
    """Decode attention computed one KV block at a time; out [S, H, D] in query's dtype.

    Task: for each sequence, for each of its ceil(seq_len / BS) blocks, compute the block's
    partial (m, l, o) for every head from key_cache[block] / value_cache[block] (only the
    first seq_len - i*BS tokens of the last block count) and merge it into the running one.
    Invariants: within rounding of exercise 06's result, large logits too (the grader tries
    scale=1000); never read a slot past seq_len (the grader puts NaN there) nor a table entry
    past the sequence's blocks (junk ids there), and never gather the whole sequence at once
    (the grader's caches refuse an index that reads more than one block); leave every
    argument as it was.
    Errors: ValueError, as in exercise 06, when H is not a multiple of Hkv or D differs
    between query and cache.
    Hint: for one block, logits [H, n] = einsum("hd,nhd->hn", q_s, k_block) * scale with
    k_block = key_cache[b, :, :n, :] transposed to [n, Hkv, D] and repeated to H heads;
    m = logits.max(1); p = exp(logits - m[:, None]); l = p.sum(1); o = p @ v / l.
    """
    raise NotImplementedError
