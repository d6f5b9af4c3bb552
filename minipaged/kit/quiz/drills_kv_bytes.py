"""Interviewer drills on the bytes of a token's KV: tensor parallelism, an fp8 cache, MLA.

Three ways a serving system makes each token's KV smaller on a GPU, and what each costs: split
the KV heads over tensor-parallel GPUs (until there are fewer heads than GPUs), store K and V in
one byte per element (at some accuracy), or cache DeepSeek's compressed latent instead of K and
V (which tensor parallelism then cannot divide). Every figure is computed as it prints, by the
calculator (``sim/memory.py``, ``minipaged kv-calc``) and the cost model (``sim/cost.py``).
Every claim about vLLM names its file in vLLM 0.32.
Read before: ``drills_engine.py``. Read next: ``drills_systems.py``.
"""

from __future__ import annotations

from minipaged.kit.quiz.context import Answer, Context, Drill, nbytes


def tp_kv_heads(ctx: Context) -> Answer:
    from minipaged.sim.memory import kv_preset

    figures = []
    for tp in (1, 2, 8, 16):
        p = kv_preset("llama-3-8b", tp=tp)
        figures.append((f"Llama-3-8B, TP {tp}: KV heads / KV bytes per token per GPU",
                        f"{p.model.kv_heads_per_gpu(tp)} / {nbytes(p.kv_bytes_per_token)}"))
    figures.append(("  token slots at TP 1 / TP 8",
                    f"{kv_preset('llama-3-8b').num_token_slots:,} / "
                    f"{kv_preset('llama-3-8b', tp=8).num_token_slots:,}"))
    return Answer(
        text=(
            "Tensor parallelism splits attention by heads: each of TP GPUs computes its share "
            "of the query heads and keeps the K/V of its own KV heads, so a token's KV bytes "
            "per GPU divide by TP, and so does the block size in bytes; each GPU has its own "
            "pool with the same block ids. With fewer KV heads than GPUs each GPU holds one "
            "and heads are replicated: max(1, Hkv // TP) (vllm/config/model.py, "
            "get_num_kv_heads; vllm/model_executor/layers/linear.py, QKVParallelLinear), so "
            "past TP = Hkv the KV cache stops shrinking per GPU. More GPUs also leave more "
            "memory per GPU after the weights: the token slots grow faster than TP."),
        figures=figures,
        commands=["minipaged kv-calc --model llama-3-8b --tp 8",
                  "minipaged kv-calc --model llama-3-8b --tp 16"])


def fp8_kv(ctx: Context) -> Answer:
    from minipaged.sim.cost import CostModel
    from minipaged.sim.memory import kv_preset

    figures = []
    for dtype in ("fp16", "fp8"):
        p = kv_preset("llama-3-8b", kv_dtype=dtype)
        t = CostModel.for_preset(p, kv_bytes_per_token=p.kv_bytes_per_token).step_time(
            32, 32 * 4096)
        figures.append((f"Llama-3-8B {dtype}: KV per token / token slots / decode step of 32 "
                        f"x 4K", f"{nbytes(p.kv_bytes_per_token)} / {p.num_token_slots:,} / "
                        f"{1e3 * t:.1f} ms"))
    return Answer(
        text=(
            "An fp8 KV cache stores K and V in one byte per element instead of two "
            "(--kv-cache-dtype fp8 = fp8_e4m3, or fp8_e5m2: vllm/config/cache.py, "
            "cache_dtype): twice the tokens in the same memory, and half the KV bytes a decode "
            "step reads. K and V are scaled into fp8's range by per-layer scales, and the "
            "kernel applies them as it reads (k_descale / v_descale in "
            "vllm/v1/attention/backends/flash_attn.py). The cost is accuracy, model by model; "
            "the weights keep their dtype. Decode time "
            "falls less than KV bytes do, as the weights are read every step too."),
        figures=figures,
        commands=["minipaged kv-calc --model llama-3-8b --kv-dtype fp8"])


def mla(ctx: Context) -> Answer:
    from minipaged.sim.memory import kv_preset

    p = kv_preset("deepseek-v2")
    m = p.model
    mha = 2 * m.num_layers * m.num_kv_heads * m.head_size * m.dtype_bytes
    groups = (m.kv_lora_rank + m.qk_rope_head_dim) / (2 * m.head_size)
    return Answer(
        text=(
            "Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1) caches "
            "one compressed latent per token and layer, kv_lora_rank = 512 elements, plus a "
            "64-element key carrying RoPE (qk_rope_head_dim), instead of K and V for 128 "
            "heads: (d_c + d_h^R) x layers elements, the paper's Table 1. Keys and values are "
            "expanded from the latent inside attention. vLLM stores it as one KV head of size "
            "576 with no separate V (vllm/config/model.py, get_num_kv_heads returns 1 for "
            "MLA; vllm/v1/kv_cache_interface.py, MLAAttentionSpec), so every tensor-parallel "
            "rank holds the whole latent: TP does not divide it."),
        figures=[
            ("DeepSeek-V2 latent per token (60 layers, bf16)", nbytes(m.kv_bytes_per_token)),
            ("  K and V of 128 heads of 128 instead (MHA)", nbytes(mha)),
            ("  ratio / equal to GQA with this many groups",
             f"{mha / m.kv_bytes_per_token:.1f}x / {groups:.2f}"),
            (f"per GPU at TP {p.tp} (H100-80GB): budget / token slots",
             f"{nbytes(p.kv_cache_bytes)} / {p.num_token_slots:,}"),
        ],
        commands=["minipaged kv-calc --model deepseek-v2",
                  "minipaged kv-calc --model deepseek-v2 --tp 16"])


DRILLS: tuple[Drill, ...] = (
    Drill("tp-kv-heads", "interviewer", "张量并行怎么切分KV cache？KV头比GPU少怎么办？",
          "How does tensor parallelism shard the KV cache? Fewer KV heads than GPUs?",
          tp_kv_heads),
    Drill("fp8-kv", "interviewer", "FP8 KV cache带来什么，代价是什么？",
          "What does an fp8 KV cache buy, and what does it cost?", fp8_kv),
    Drill("mla", "interviewer", "DeepSeek的MLA把每个token的KV缩到多少？",
          "How small does DeepSeek's MLA make the KV of a token?", mla),
)
