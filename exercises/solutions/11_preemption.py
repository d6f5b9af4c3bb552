"""SPOILER: reference solution of exercise 11 (preemption decision).

Try the exercise first: exercises/11_preemption.py, graded by `minipaged check 11`.
"""

from __future__ import annotations

EXERCISE = "11_preemption"


def blocks_for_step(seq_lens, block_size):
    return sum(1 for n in seq_lens if n % block_size == 0)


def choose_victims(groups, num_free_blocks, block_size):
    order = sorted(range(len(groups)), key=lambda i: (groups[i]["arrival"], i))
    kept = [groups[i] for i in order]
    need = sum(blocks_for_step(g["seq_lens"], block_size) for g in kept)
    free = num_free_blocks
    victims = []
    while kept and need > free:
        g = kept.pop()
        victims.append(g["id"])
        free += g["num_blocks"]
        need -= blocks_for_step(g["seq_lens"], block_size)
    return victims


def swap_or_recompute(num_blocks, block_bytes, num_tokens, pcie_bytes_per_s,
                      prefill_tokens_per_s):
    if pcie_bytes_per_s <= 0 or prefill_tokens_per_s <= 0:
        raise ValueError(f"rates must be > 0, got pcie_bytes_per_s={pcie_bytes_per_s}, "
                         f"prefill_tokens_per_s={prefill_tokens_per_s}")
    swap = 2 * num_blocks * block_bytes / pcie_bytes_per_s
    recompute = num_tokens / prefill_tokens_per_s
    return "swap" if swap < recompute else "recompute"
