"""Exercise 11: when blocks run out, whom to preempt, and whether to swap or recompute.

Lesson: lessons/06_*.py (scheduling and preemption).  Check: minipaged check 11

Each decode step gives every running sequence one more token. A sequence whose tokens exactly
fill its blocks (seq_len % block_size == 0) needs one fresh block for that token. When the free
blocks cannot cover the step, vLLM (paper section 4.5) preempts whole sequence groups (all
samples or beams of one request together: all or nothing), most recently arrived first, so that
the oldest requests keep making progress (first-come-first-served). A preempted group's blocks
become free. Then it is either
- swapped: its blocks copied to a CPU block pool over PCIe now, and back in later, or
- recomputed: its blocks dropped, and prompt + generated tokens re-run later as one prefill.
"""

from __future__ import annotations

EXERCISE = "11_preemption"


def blocks_for_step(seq_lens: list[int], block_size: int) -> int:
    """Fresh blocks one decode step needs for sequences holding seq_lens tokens.

    Hint: the new token of a sequence of length n sits at position n; it opens a block when
    n % block_size == 0.
    """
    raise NotImplementedError


def choose_victims(groups: list[dict], num_free_blocks: int, block_size: int) -> list:
    """Return the ids of the groups to preempt, in the order they are preempted.

    groups: dicts {"id": .., "arrival": float, "seq_lens": [int, ...], "num_blocks": int}
    (num_blocks = blocks the group holds now, freed if it is preempted), in any order.
    Rule: while the step's need of the kept groups exceeds the free blocks, preempt the kept
    group that arrived last (its blocks become free, its need disappears). Return [] when the
    step fits. Arrival ties: the later in the input list counts as later.
    Invariant: the kept groups' need <= free blocks after preemption; groups (the list and
    its dicts) is left as it was.
    """
    raise NotImplementedError


def swap_or_recompute(num_blocks: int, block_bytes: int, num_tokens: int,
                      pcie_bytes_per_s: float, prefill_tokens_per_s: float) -> str:
    """Return "swap" when swapping costs strictly less time than recomputing, else
    "recompute".

    Costs (simple models; the lesson discusses what they leave out):
        swap      = 2 * num_blocks * block_bytes / pcie_bytes_per_s   (out now, in later)
        recompute = num_tokens / prefill_tokens_per_s                  (one prefill later)
    Errors: ValueError when a rate is <= 0.
    """
    raise NotImplementedError
