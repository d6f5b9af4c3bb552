"""SPOILER: reference solution of exercise 01 (bytes of KV per token, slots per GPU).

Try the exercise first: exercises/01_kv_bytes.py, graded by `minipaged check 1`.
"""

from __future__ import annotations

EXERCISE = "01_kv_bytes"


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_size: int,
                       bytes_per_element: int) -> int:
    for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads),
                        ("head_size", head_size), ("bytes_per_element", bytes_per_element)):
        if value < 1:
            raise ValueError(f"{name}={value} must be >= 1")
    return 2 * num_layers * num_kv_heads * head_size * bytes_per_element


def num_token_slots(kv_cache_bytes: int, bytes_per_token: int) -> int:
    if kv_cache_bytes < 0:
        raise ValueError(f"kv_cache_bytes={kv_cache_bytes} must be >= 0")
    if bytes_per_token < 1:
        raise ValueError(f"bytes_per_token={bytes_per_token} must be >= 1")
    return kv_cache_bytes // bytes_per_token


def num_blocks(kv_cache_bytes: int, bytes_per_token: int, block_size: int) -> int:
    if block_size < 1:
        raise ValueError(f"block_size={block_size} must be >= 1")
    return num_token_slots(kv_cache_bytes, bytes_per_token) // block_size
