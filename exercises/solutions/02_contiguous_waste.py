"""SPOILER: reference solution of exercise 02 (contiguous reservation waste).

Try the exercise first: exercises/02_contiguous_waste.py, graded by `minipaged check 2`.
"""

from __future__ import annotations

EXERCISE = "02_contiguous_waste"


def reservation_size(policy: str, prompt_len: int, final_len: int, max_seq_len: int) -> int:
    if not 1 <= prompt_len <= final_len:
        raise ValueError(f"need 1 <= prompt_len <= final_len, got prompt_len={prompt_len}, "
                         f"final_len={final_len}")
    if final_len > max_seq_len:
        raise ValueError(f"final_len={final_len} exceeds max_seq_len={max_seq_len}")
    if policy == "max":
        return max_seq_len
    if policy == "pow2":
        output = final_len - prompt_len
        rounded = 1 << (output - 1).bit_length() if output > 0 else 0
        return min(prompt_len + rounded, max_seq_len)
    if policy == "oracle":
        return final_len
    raise ValueError(f"policy={policy!r} is unknown; expected 'max', 'pow2' or 'oracle'")


def _check_lens(current_len: int, final_len: int) -> None:
    if not 1 <= current_len <= final_len:
        raise ValueError(f"need 1 <= current_len <= final_len, got current_len={current_len}, "
                         f"final_len={final_len}")


def contiguous_breakdown(policy: str, prompt_len: int, current_len: int, final_len: int,
                         max_seq_len: int) -> dict[str, int]:
    _check_lens(current_len, final_len)
    if current_len < prompt_len:
        raise ValueError(f"current_len={current_len} is shorter than prompt_len={prompt_len}")
    size = reservation_size(policy, prompt_len, final_len, max_seq_len)
    return {"token": current_len, "reserved": final_len - current_len,
            "internal_fragmentation": size - final_len}


def paged_breakdown(current_len: int, final_len: int, block_size: int) -> dict[str, int]:
    _check_lens(current_len, final_len)
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")
    allocated = -(-current_len // block_size) * block_size
    useful = min(allocated, final_len)
    return {"token": current_len, "reserved": useful - current_len,
            "internal_fragmentation": allocated - useful}
