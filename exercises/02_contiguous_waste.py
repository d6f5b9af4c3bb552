"""Exercise 02: where the memory goes when each request reserves one contiguous region.

Lesson: lessons/02_*.py (the contiguous cache and its waste).  Check: minipaged check 2

Before vLLM, serving systems (the paper's Orca baselines) reserved, for each request, one
contiguous region of KV slots when the request started. The region's size follows a policy:

    "max"     max_seq_len slots (the model's maximum length, e.g. 2048)
    "pow2"    the prompt, plus the output length rounded up to a power of two, capped at
              max_seq_len: prompt_len + next_pow2(final_len - prompt_len). The paper (section
              6.1): it "over-reserves the space for outputs by at most 2x"; an output of 25
              reserves 32 (so a prompt of 100 with an output of 25 reserves 132 slots)
    "oracle"  exactly the final length (impossible in practice: nobody knows it in advance)

At any moment a request of current length ``current_len`` (prompt + tokens generated so far)
and final length ``final_len`` splits its slots into the paper's categories (Fig. 2):

    token                   current_len             slots holding K/V now
    reserved                final_len - current_len slots that future tokens will fill
    internal_fragmentation  size - final_len        slots that will never be used

A paged cache holds only ceil(current_len / block_size) blocks; the unfilled slots of the last
block are "reserved" up to final_len and "internal_fragmentation" beyond it.
"""

from __future__ import annotations

EXERCISE = "02_contiguous_waste"


def reservation_size(policy: str, prompt_len: int, final_len: int, max_seq_len: int) -> int:
    """Return the number of slots a contiguous cache reserves for one request of
    ``prompt_len`` prompt tokens that will end with ``final_len`` tokens.

    policy: "max" | "pow2" | "oracle" (see the module docstring).
    Invariants: final_len <= result <= max_seq_len.
    Errors: ValueError for an unknown policy (name it), unless
    1 <= prompt_len <= final_len <= max_seq_len.
    Hint: the next power of two of n >= 1 is 1 << (n - 1).bit_length(); an output of 0
    tokens needs no slot.
    """
    raise NotImplementedError


def contiguous_breakdown(policy: str, prompt_len: int, current_len: int, final_len: int,
                         max_seq_len: int) -> dict[str, int]:
    """Return {"token": .., "reserved": .., "internal_fragmentation": ..} for one request.

    Invariants: the three counts are >= 0 and add up to reservation_size(policy, ...).
    Errors: ValueError unless prompt_len <= current_len <= final_len (and as in
    reservation_size).
    Hint: the three categories are differences of current_len, final_len and the size.
    """
    raise NotImplementedError


def paged_breakdown(current_len: int, final_len: int, block_size: int) -> dict[str, int]:
    """The same three categories for a paged cache that holds ceil(current_len / block_size)
    blocks of ``block_size`` slots.

    Invariants: counts >= 0, they add up to blocks * block_size, and internal fragmentation
    is always < block_size (at most one partly filled block per sequence).
    Errors: ValueError unless 1 <= current_len <= final_len and block_size >= 1.
    Hint: the allocated slots beyond current_len are "reserved" only up to final_len.
    """
    raise NotImplementedError
