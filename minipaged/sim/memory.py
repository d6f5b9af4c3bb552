"""How many tokens fit: KV bytes per token, token slots, blocks, and the block table's own size.

What this teaches: the KV cache budget of a real deployment is simple arithmetic, and the
interview answer's block-table figures can be checked with it. Paper: section 3 (Table 1: OPT-13B on
one A100-40GB leaves about 12 GB for the KV cache, about 15.7K token slots, 800 KB per token).
Read next: ``cost.py``. ``minipaged kv-calc`` prints these figures.

    KV bytes per token = 2 (K and V) x num_layers x num_kv_heads x head_size x bytes per element
    token slots        = KV cache bytes // KV bytes per token
    blocks             = token slots // block_size
    block table bytes  = ceil(context_len / block_size) x entry_bytes, per request
                         (vLLM's tables are int32: entry_bytes = 4)

Units: "GB" in the paper's Table 1 is GiB (12 GiB / 800 KiB = 15,728 slots, the paper's 15.7K).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GiB = 1024**3


@dataclass(frozen=True)
class ModelSpec:
    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    num_params: float            # for weight bytes (cost model) and the default KV budget
    dtype_bytes: int = 2         # fp16 / bf16
    max_model_len: int = 2048

    def __post_init__(self) -> None:
        for f in ("num_layers", "num_heads", "num_kv_heads", "head_size", "dtype_bytes",
                  "max_model_len"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{f}={v!r} must be an int >= 1")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_size * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.dtype_bytes


@dataclass(frozen=True)
class GPUSpec:
    name: str
    mem_bytes: int
    mem_bw: float           # bytes/s of HBM, datasheet
    flops: float            # dense fp16 tensor FLOP/s, datasheet
    pcie_bw: float = 25e9   # bytes/s host <-> device, effective (PCIe 4.0 x16)


MODELS = {
    # OPT-13B: 40 layers, hidden 5120 = 40 heads x 128, no GQA (the paper's main model).
    "opt-13b": ModelSpec("opt-13b", 40, 40, 40, 128, 13e9, 2, 2048),
    # Llama-3-8B: 32 layers, 32 query heads, 8 KV heads (GQA), head 128, 8K context.
    "llama-3-8b": ModelSpec("llama-3-8b", 32, 32, 8, 128, 8.03e9, 2, 8192),
}
GPUS = {
    "a100-40gb": GPUSpec("a100-40gb", 40 * GiB, 1.555e12, 312e12),
    "a100-80gb": GPUSpec("a100-80gb", 80 * GiB, 2.039e12, 312e12),
    "h100-80gb": GPUSpec("h100-80gb", 80 * GiB, 3.35e12, 989e12),
}


@dataclass(frozen=True)
class MemoryPreset:
    """A model on a GPU with a KV cache budget: the simulator's memory."""

    model: ModelSpec
    gpu: GPUSpec
    kv_cache_bytes: int

    @property
    def num_token_slots(self) -> int:
        return self.kv_cache_bytes // self.model.kv_bytes_per_token

    def num_blocks(self, block_size: int) -> int:
        check_block_size(block_size)
        return self.num_token_slots // block_size


def check_block_size(block_size: int) -> None:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size={block_size!r} must be an int >= 1")


def default_kv_cache_bytes(model: ModelSpec, gpu: GPUSpec, *,
                           gpu_memory_utilization: float = 0.9) -> int:
    """vLLM's rule: the KV cache gets what is left of ``gpu_memory_utilization`` x GPU memory
    after the weights (activation memory is ignored: it is small at these batch sizes)."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization={gpu_memory_utilization} must be in (0, 1]")
    left = int(gpu.mem_bytes * gpu_memory_utilization - model.weight_bytes)
    if left <= 0:
        raise ValueError(f"model {model.name} ({model.weight_bytes / GiB:.1f} GiB of weights) "
                         f"leaves no KV cache on {gpu.name}")
    return left


PRESETS = {
    # The paper's setting (Table 1): 12 GB (GiB) left for the KV cache, about 15.7K slots.
    "opt-13b": MemoryPreset(MODELS["opt-13b"], GPUS["a100-40gb"], 12 * GiB),
    "llama-3-8b": MemoryPreset(MODELS["llama-3-8b"], GPUS["h100-80gb"],
                               default_kv_cache_bytes(MODELS["llama-3-8b"], GPUS["h100-80gb"])),
}


def preset(name: str, *, kv_cache_gb: float | None = None) -> MemoryPreset:
    """A preset by name, optionally with its KV cache budget replaced (in GiB)."""
    if name not in PRESETS:
        raise ValueError(f"model={name!r} is not one of {sorted(PRESETS)}")
    p = PRESETS[name]
    if kv_cache_gb is not None:
        if not kv_cache_gb > 0:
            raise ValueError(f"kv_cache_gb={kv_cache_gb} must be > 0")
        p = MemoryPreset(p.model, p.gpu, int(kv_cache_gb * GiB))
    return p


def block_table_bytes(context_len: int, block_size: int, *, entry_bytes: int = 4) -> int:
    """Bytes of one request's block table: one entry per logical block."""
    check_block_size(block_size)
    if context_len < 0:
        raise ValueError(f"context_len={context_len} must be >= 0")
    if entry_bytes < 1:
        raise ValueError(f"entry_bytes={entry_bytes} must be >= 1")
    return math.ceil(context_len / block_size) * entry_bytes


def kv_calc(p: MemoryPreset, *, block_size: int = 16, context_len: int = 2048,
            num_requests: int = 1000, entry_bytes: int = 4) -> dict:
    """Every figure ``minipaged kv-calc`` prints, as a dict."""
    bt = block_table_bytes(context_len, block_size, entry_bytes=entry_bytes)
    return {
        "model": p.model.name, "gpu": p.gpu.name,
        "kv_bytes_per_token": p.model.kv_bytes_per_token,
        "kv_cache_bytes": p.kv_cache_bytes,
        "token_slots": p.num_token_slots,
        "block_size": block_size,
        "num_blocks": p.num_blocks(block_size),
        "block_bytes": p.model.kv_bytes_per_token * block_size,
        "context_len": context_len,
        "blocks_per_request": math.ceil(context_len / block_size),
        "kv_bytes_per_request": p.model.kv_bytes_per_token * context_len,
        "entry_bytes": entry_bytes,
        "block_table_bytes_per_request": bt,
        "num_requests": num_requests,
        "block_table_bytes_total": bt * num_requests,
        "requests_that_fit": p.num_token_slots // max(context_len, 1),
    }


__all__ = ["ModelSpec", "GPUSpec", "MemoryPreset", "MODELS", "GPUS", "PRESETS", "preset",
           "block_table_bytes", "kv_calc", "default_kv_cache_bytes"]
