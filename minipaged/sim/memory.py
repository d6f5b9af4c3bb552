"""How many tokens fit: KV bytes per token, token slots, blocks, and the block table's own size.

What this teaches: the KV cache budget of a real deployment is simple arithmetic, and the
interview answer's block-table figures can be checked with it. Paper: section 3 (800 KB per
token of OPT-13B) and section 6.1 (Table 1: OPT-13B on one A100-40GB leaves about 12 GB for the
KV cache, about 15.7K token slots).
Read next: ``cost.py``. ``minipaged kv-calc`` prints these figures.

    KV bytes per token = 2 (K and V) x num_layers x num_kv_heads x head_size x bytes per element
    token slots        = KV cache bytes // KV bytes per token
    blocks             = token slots // block_size
    block table bytes  = ceil(context_len / block_size) x entry_bytes, per request
                         (vLLM's tables are int32: entry_bytes = 4)

Units: "GB" in the paper's Table 1 is GiB (12 GiB / 800 KiB = 15,728 slots, the paper's 15.7K).

Three things change the bytes per token (``minipaged kv-calc --tp / --kv-dtype / --model``):
    tensor parallelism  each of TP GPUs holds the K/V of its own KV heads: max(1, Hkv // TP)
                        of them, so when TP > Hkv every GPU holds one head and the heads are
                        replicated (vLLM: vllm/config/model.py ModelConfig.get_num_kv_heads;
                        vllm/model_executor/layers/linear.py QKVParallelLinear). vLLM also
                        requires TP to divide H, and Hkv and TP to divide one another.
    the KV dtype        fp16 / bf16: 2 bytes per element, fp8: 1 (vllm/config/cache.py
                        cache_dtype; "auto" keeps the model's dtype). Weights are unchanged.
    MLA (DeepSeek-V2/V3) one latent vector per token per layer instead of K and V per head:
                        (kv_lora_rank + qk_rope_head_dim) x num_layers x bytes per element
                        (DeepSeek-V2, arXiv 2405.04434, section 2.1, Table 1: (d_c + d_h^R) l
                        elements). vLLM stores it as one "KV head" of head size 512 + 64 = 576
                        with no separate V (vllm/config/model.py get_num_kv_heads returns 1 for
                        MLA; vllm/v1/kv_cache_interface.py MLAAttentionSpec), so every TP rank
                        holds the whole latent: TP does not divide it.
The budget of a preset is per GPU. ``KV_PRESETS`` adds models the simulator has no cost model
for (an 8-GPU DeepSeek-V2); ``PRESETS`` are the single-GPU ones the simulator runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from minipaged._checks import cdiv, check_choice, check_float, check_int

GiB = 1024**3

# Bytes per element of the KV cache (vllm/config/cache.py CacheDType: "float16", "bfloat16",
# "fp8" = "fp8_e4m3", "fp8_e5m2"; an fp8 cache stores one byte per element plus scales).
KV_DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp8": 1}


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
    kv_lora_rank: int = 0        # MLA only (both 0 otherwise): the latent's width ...
    qk_rope_head_dim: int = 0    # ... and the decoupled RoPE key's, cached beside it

    def __post_init__(self) -> None:
        for f in ("num_layers", "num_heads", "num_kv_heads", "head_size", "dtype_bytes",
                  "max_model_len", "kv_lora_rank", "qk_rope_head_dim"):
            low = 0 if f in ("kv_lora_rank", "qk_rope_head_dim") else 1
            object.__setattr__(self, f, check_int(f, getattr(self, f), low=low))  # as a Python int
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if (self.kv_lora_rank == 0) != (self.qk_rope_head_dim == 0):
            raise ValueError(f"kv_lora_rank={self.kv_lora_rank} and qk_rope_head_dim="
                             f"{self.qk_rope_head_dim}: an MLA model needs both, others neither")

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def kv_bytes_per_token(self) -> int:
        """On one GPU holding the whole model, in the model's dtype."""
        return self.kv_bytes_per_token_per_gpu()

    def kv_heads_per_gpu(self, tp: int = 1) -> int:
        """KV heads each of ``tp`` GPUs holds: max(1, Hkv // TP), replicated when TP > Hkv
        (vllm/config/model.py get_num_kv_heads); 1 for MLA, the latent. vLLM refuses a TP that
        does not divide H (verify_with_parallel_config), or where neither of Hkv and TP
        divides the other (QKVParallelLinear's divide); so does this."""
        tp = check_int("tp", tp, low=1)
        if self.num_heads % tp:
            raise ValueError(f"tp={tp} must divide the {self.num_heads} query heads of "
                             f"{self.name} (vLLM refuses it too)")
        if self.is_mla:
            return 1
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise ValueError(f"tp={tp} and the {self.num_kv_heads} KV heads of {self.name}: "
                             f"one must divide the other (vLLM refuses it too)")
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token_per_gpu(self, tp: int = 1, dtype_bytes: int | None = None) -> int:
        """KV bytes one token takes on each of ``tp`` GPUs, ``dtype_bytes`` per element (None:
        the model's dtype). MLA: (kv_lora_rank + qk_rope_head_dim) x layers x bytes, on every
        GPU; otherwise 2 (K and V) x layers x KV heads per GPU x head_size x bytes."""
        heads = self.kv_heads_per_gpu(tp)
        b = check_int("dtype_bytes", self.dtype_bytes if dtype_bytes is None else dtype_bytes,
                      low=1)
        if self.is_mla:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.num_layers * b
        return 2 * self.num_layers * heads * self.head_size * b

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
    # DeepSeek-V2 (arXiv 2405.04434, its hyper-parameters; config.json): 60 layers, 128 heads of
    # d_h = 128, MLA with kv_lora_rank 512 and qk_rope_head_dim 64; 236B parameters (21B active
    # per token: the cost of a step is not modelled here), 128K context.
    "deepseek-v2": ModelSpec("deepseek-v2", 60, 128, 128, 128, 236e9, 2, 131072,
                             kv_lora_rank=512, qk_rope_head_dim=64),
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
    kv_cache_bytes: int                        # per GPU
    tp: int = 1                                # GPUs the model is sharded over (tensor parallel)
    kv_dtype_bytes: int | None = None          # None: the model's dtype
    gpu_memory_utilization: float | None = None  # set: the budget follows vLLM's rule

    @property
    def kv_bytes_per_token(self) -> int:
        """Per GPU, with this preset's TP and KV dtype."""
        return self.model.kv_bytes_per_token_per_gpu(self.tp, self.kv_dtype_bytes)

    @property
    def num_token_slots(self) -> int:
        """Tokens the TP group holds: each GPU holds its share of every token's K/V."""
        return self.kv_cache_bytes // self.kv_bytes_per_token

    def num_blocks(self, block_size: int) -> int:
        return self.num_token_slots // check_int("block_size", block_size, low=1)


def default_kv_cache_bytes(model: ModelSpec, gpu: GPUSpec, *,
                           gpu_memory_utilization: float = 0.9, tp: int = 1) -> int:
    """vLLM's rule, per GPU: the KV cache gets what is left of ``gpu_memory_utilization`` x GPU
    memory after this GPU's 1/TP of the weights. vLLM also subtracts the activation peak of a
    profiling run (vllm/v1/worker/gpu_worker.py determine_available_memory); this ignores it
    (small at these batch sizes). 0.9 was vLLM's default; vLLM 0.32 has 0.92
    (vllm/config/cache.py)."""
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization={gpu_memory_utilization} must be in (0, 1]")
    model.kv_heads_per_gpu(tp)  # a TP the model cannot be sharded over is refused here
    left = int(gpu.mem_bytes * gpu_memory_utilization - model.weight_bytes / tp)
    if left <= 0:
        raise ValueError(f"model {model.name} ({model.weight_bytes / tp / GiB:.1f} GiB of "
                         f"weights per GPU at tp={tp}) leaves no KV cache on {gpu.name}")
    return left


def _rule(model: str, gpu: str, tp: int = 1) -> MemoryPreset:
    """A preset whose budget follows ``default_kv_cache_bytes`` (0.9 of memory)."""
    m, g = MODELS[model], GPUS[gpu]
    return MemoryPreset(m, g, default_kv_cache_bytes(m, g, tp=tp), tp, None, 0.9)


PRESETS = {
    # The paper's setting (Table 1): 12 GB (GiB) left for the KV cache, about 15.7K slots.
    "opt-13b": MemoryPreset(MODELS["opt-13b"], GPUS["a100-40gb"], 12 * GiB),
    "llama-3-8b": _rule("llama-3-8b", "h100-80gb"),
}
KV_PRESETS = {
    **PRESETS,
    # 472 GB of bf16 weights: 8 H100-80GB with tensor parallelism, 59 GB of weights each.
    "deepseek-v2": _rule("deepseek-v2", "h100-80gb", tp=8),
}


def preset(name: str, *, kv_cache_gb: float | None = None) -> MemoryPreset:
    """A single-GPU preset the simulator can run (``PRESETS``), optionally with its KV cache
    budget replaced (in GiB)."""
    check_choice("model", name, sorted(PRESETS))
    return kv_preset(name, kv_cache_gb=kv_cache_gb)


def kv_preset(name: str, *, kv_cache_gb: float | None = None, tp: int | None = None,
              kv_dtype: str | None = None) -> MemoryPreset:
    """A preset of ``KV_PRESETS`` for the arithmetic of ``kv-calc``: sharded over ``tp`` GPUs
    (a budget set by vLLM's rule is recomputed with 1/TP of the weights per GPU; a fixed one,
    the paper's 12 GiB, stays), with a KV dtype of ``KV_DTYPE_BYTES``, or with its per-GPU
    budget replaced (in GiB)."""
    check_choice("model", name, sorted(KV_PRESETS))
    p = KV_PRESETS[name]
    if tp is not None:
        p.model.kv_heads_per_gpu(tp)  # a TP vLLM would refuse is refused first
    if tp is not None and tp != p.tp:
        budget = p.kv_cache_bytes if p.gpu_memory_utilization is None else \
            default_kv_cache_bytes(p.model, p.gpu, tp=tp,
                                   gpu_memory_utilization=p.gpu_memory_utilization)
        p = replace(p, kv_cache_bytes=budget, tp=tp)
    if kv_dtype is not None:
        check_choice("kv_dtype", kv_dtype, sorted(KV_DTYPE_BYTES))
        p = replace(p, kv_dtype_bytes=KV_DTYPE_BYTES[kv_dtype])
    if kv_cache_gb is not None:
        if not 0 < check_float("kv_cache_gb", kv_cache_gb) <= 2**40:  # int(gb * GiB) stays finite
            raise ValueError(f"kv_cache_gb={kv_cache_gb} must be > 0 and <= 2**40 (GiB)")
        p = replace(p, kv_cache_bytes=int(kv_cache_gb * GiB), gpu_memory_utilization=None)
    return p


def block_table_bytes(context_len: int, block_size: int, *, entry_bytes: int = 4) -> int:
    """Bytes of one request's block table: one entry per logical block."""
    block_size = check_int("block_size", block_size, low=1)
    context_len = check_int("context_len", context_len, low=0)
    return cdiv(context_len, block_size) * check_int("entry_bytes", entry_bytes, low=1)


def kv_calc(p: MemoryPreset, *, block_size: int = 16, context_len: int = 2048,
            num_requests: int = 1000, entry_bytes: int = 4) -> dict:
    """Every figure ``minipaged kv-calc`` prints, as a dict. Bytes are per GPU (one GPU of the
    preset's TP group); token slots and requests are the group's."""
    bt = block_table_bytes(context_len, block_size, entry_bytes=entry_bytes)
    per_token = p.kv_bytes_per_token
    return {
        "model": p.model.name, "gpu": p.gpu.name,
        "tp": p.tp,
        "mla": p.model.is_mla,
        "kv_heads_per_gpu": p.model.kv_heads_per_gpu(p.tp),
        "kv_dtype_bytes": p.model.dtype_bytes if p.kv_dtype_bytes is None else p.kv_dtype_bytes,
        "kv_bytes_per_token": per_token,
        "kv_cache_bytes": p.kv_cache_bytes,
        "token_slots": p.num_token_slots,
        "block_size": block_size,
        "num_blocks": p.num_blocks(block_size),
        "block_bytes": per_token * block_size,
        "context_len": context_len,
        "blocks_per_request": cdiv(context_len, block_size),
        "kv_bytes_per_request": per_token * context_len,
        "entry_bytes": entry_bytes,
        "block_table_bytes_per_request": bt,
        "num_requests": num_requests,
        "block_table_bytes_total": bt * num_requests,
        "requests_that_fit": p.num_token_slots // max(context_len, 1),
    }


__all__ = ["ModelSpec", "GPUSpec", "MemoryPreset", "MODELS", "GPUS", "PRESETS", "KV_PRESETS",
           "KV_DTYPE_BYTES", "preset", "kv_preset", "block_table_bytes", "kv_calc",
           "default_kv_cache_bytes"]
