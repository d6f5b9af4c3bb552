"""Exercise 01: how many bytes one token's KV cache costs, and how many tokens fit on a GPU.

Lesson: lessons/01_*.py (attention and the KV cache).  Check: minipaged check 1

During decoding every layer keeps, for every past token, one key vector and one value vector per
KV head. That is the KV cache. Its size per token decides how many tokens (and so how many
requests) fit in the GPU memory left after the weights.

    bytes per token = 2 (K and V) x num_layers x num_kv_heads x head_size x bytes_per_element

Worked example, the vLLM paper's OPT-13B: 40 layers, 40 heads (no GQA), head size 128, fp16
(2 bytes) -> 2 x 40 x 40 x 128 x 2 = 819,200 bytes = 800 KiB per token. With 12 GiB left for the
KV cache that is about 15.7 thousand token slots.
"""

from __future__ import annotations

EXERCISE = "01_kv_bytes"


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_size: int,
                       bytes_per_element: int) -> int:
    """Return the KV cache bytes one token costs across all layers (an int).

    Task: apply the formula in the module docstring.
    Invariants: the result is exact (integer arithmetic, no floats).
    Errors: raise ValueError naming the argument when any argument is < 1.
    Hint: GQA models have fewer KV heads than query heads; only the KV heads count.
    """
    raise NotImplementedError


def num_token_slots(kv_cache_bytes: int, bytes_per_token: int) -> int:
    """Return how many whole tokens' K/V fit in ``kv_cache_bytes`` (round down; an int).

    Errors: ValueError when kv_cache_bytes < 0 or bytes_per_token < 1.
    Hint: a token that does not fit completely does not fit at all.
    """
    raise NotImplementedError


def num_blocks(kv_cache_bytes: int, bytes_per_token: int, block_size: int) -> int:
    """Return how many whole blocks of ``block_size`` token slots fit (round down; an int).

    A paged cache is carved into blocks; a block is the unit the block allocator hands out.
    Errors: ValueError when block_size < 1 (and as in num_token_slots).
    Hint: stay in integers (//); for positive integers (a // b) // c == a // (b * c), while
    float division can land one block off once the byte count passes 2**53, where floats stop
    holding every integer (far beyond any GPU today, but the grader tries such a budget).
    """
    raise NotImplementedError
