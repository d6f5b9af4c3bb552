"""Interviewer drills on vLLM v1's engine and its pool: chunked prefill, one engine step, how
vLLM sizes the pool, and what tensor parallelism, an fp8 cache and MLA do to a token's KV bytes
(each makes them smaller per GPU, at its own cost).

Figures come from the scheduler with the simulator's stand-in model (``sim/executor.py``), the
calculator (``sim/memory.py``, ``minipaged kv-calc``) and the cost model (``sim/cost.py``); the
one vLLM formula the package has no function for (``capture_sizes``) is written here with where
it comes from. Every claim about vLLM names its file in vLLM 0.32.
Read before: ``drills_mechanics.py``. Read next: ``drills_systems.py``.
"""

from __future__ import annotations

from minipaged.kit.quiz.context import Answer, Context, drill, nbytes
from minipaged.kit.quiz.drills_memory import opt_13b
from minipaged.serving.memory_policy import make_policy
from minipaged.serving.scheduler import Scheduler, SchedulerConfig
from minipaged.sim import memory
from minipaged.sim.cost import CostModel
from minipaged.sim.executor import SimExecutor


def _three_requests(chunked: bool) -> dict:
    """Lesson 11's schedule: A and B (3-token prompts, 8 tokens out) decode while L (a 22-token
    prompt) arrives at step 3, budget 8 when chunked. Steps at which each request got a token,
    and the (decodes, prefill tokens) of every step that mixed both."""
    policy = make_policy("paged", num_slots=256, block_size=4, max_seq_len=64, watermark=0.0)
    s = Scheduler(policy, SchedulerConfig(max_model_len=64, chunked_prefill=chunked,
                                          max_num_batched_tokens=8 if chunked else None))
    ex = SimExecutor(opt_13b()[1], 1)
    s.add_request("A", [11, 12, 13], 8)
    s.add_request("B", [21, 22, 23], 8)
    got: dict[str, list[int]] = {"A": [], "B": [], "L": []}
    mixed, step, now = [], 0, 0.0
    while s.has_unfinished() or step <= 3:
        if step == 3:
            s.add_request("L", list(range(100, 122)), 3)
        out = s.schedule()
        res = ex.execute(out)
        now += res.duration_s
        s.update(out, res, now)
        if out.decodes and out.prefills:
            mixed.append((len(out.decodes), out.num_prefill_tokens))
        for q in out.sampled:
            got[q.group.request_id].append(step)
        step += 1
    return {"got": got, "mixed": mixed}


@drill("chunked-prefill", "什么是chunked prefill？vLLM v1怎么调度一步？",
       "What is chunked prefill, and how does vLLM v1 schedule a step?")
def chunked_prefill(ctx: Context) -> Answer:
    runs = {c: ctx.cached(("three", c), lambda c=c: _three_requests(c)) for c in (True, False)}
    gap = {c: max(b - a for a, b in zip(r["got"]["A"], r["got"]["A"][1:]))
           for c, r in runs.items()}
    d, p = runs[True]["mixed"][0]
    return Answer(
        "vLLM v1's scheduler has no prefill phase and no decode phase: each step has one token "
        "budget (max_num_batched_tokens); running requests come first, a decode costing one token, "
        "and what is left goes to the next chunk of the waiting prompts, so chunks and decodes "
        "share one forward pass (vllm/v1/core/sched/scheduler.py, schedule). A long prompt no "
        "longer stalls the requests that are decoding. Lesson 11 teaches it on minipaged's "
        "scheduler (SchedulerConfig(chunked_prefill=True)), lesson 12 what it buys in time; "
        "exercise 14 has you write the step.",
        figures=[
            ("budget 8, A and B decoding, L's 22-token prompt arrives: first mixed step",
             f"{d} decodes + {p} prefill tokens"),
            ("longest gap between two of A's tokens: chunked / v0-style steps",
             f"{gap[True]} / {gap[False]} steps"),
        ],
        commands=["python lessons/11_chunked_prefill.py",
                  "python lessons/12_chunked_prefill_latency.py", "minipaged check 14"])


def capture_sizes(max_size: int = 512) -> list[int]:
    """vLLM's default CUDA-graph capture sizes: [1, 2, 4] + range(8, 256, 8) +
    range(256, max + 1, 16) (vllm/config/compilation.py, max_cudagraph_capture_size). A formula."""
    return [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)]
            if s <= max_size]


@drill("v1-engine", "vLLM v1引擎一步里发生了什么？CUDA graph为什么固定块表宽度？",
       "What happens in one vLLM v1 engine step? Why do CUDA graphs fix the table width?")
def v1_engine(ctx: Context) -> Answer:
    sizes = capture_sizes()
    padded = {n: next((s for s in sizes if s >= n), None) for n in (37, 300, 600)}
    return Answer(
        "One step of vLLM v1: the scheduler gives each request some tokens within one token "
        "budget, prefill chunks and decodes mixed. The model runner keeps a persistent batch: "
        "request state and a zero-filled int32 block table [max_num_reqs, cdiv(max_model_len, BS)] "
        "(its width rounded up to whole 128-token groups of blocks in vLLM 0.32, "
        "get_block_table_width) in buffers allocated once and updated in place "
        "(vllm/v1/worker/gpu_input_batch.py, vllm/v1/worker/block_table.py; CpuGpuBuffer in "
        "vllm/v1/utils.py). Attention is one varlen "
        "FlashAttention call for all the step's tokens: queries packed by cu_seqlens_q, K/V read "
        "from the paged cache through block_table and seqused_k "
        "(vllm/v1/attention/backends/flash_attn.py; kernel block sizes: multiples of 16). A CUDA "
        "graph replays kernels recorded with fixed addresses and shapes, so every input lives in a "
        "fixed buffer, the block table at its full width, and a step's token count is padded up to "
        "a captured size (vllm/config/compilation.py, cudagraph_capture_sizes); above the largest, "
        "the step runs without a graph (vllm/v1/cudagraph_dispatcher.py). minipaged builds its "
        "tables per step (KVCacheManager.block_tables) and has no graphs.",
        figures=[
            ("CUDA-graph sizes captured by default, cap 512 (1024 on data-center Blackwell)",
             f"{len(sizes)}"),
            *((f"a step of {n} tokens runs the graph of", "no graph" if s is None else str(s))
              for n, s in padded.items()),
            ("persistent table, 256 requests x 8192 tokens / BS 16, int32",
             nbytes(256 * memory.block_table_bytes(8192, 16))),
        ],
        commands=["minipaged kv-calc --model llama-3-8b --context-len 8192 --num-requests 256",
                  "python lessons/11_chunked_prefill.py"])


@drill("num-gpu-blocks", "vLLM怎么决定num_gpu_blocks？", "How does vLLM decide num_gpu_blocks?")
def num_gpu_blocks(ctx: Context) -> Answer:
    p = memory.kv_preset("llama-3-8b")
    block = 16 * p.kv_bytes_per_token
    budgets = {u: memory.default_kv_cache_bytes(p.model, p.gpu, gpu_memory_utilization=u)
               for u in (0.9, 0.92)}
    return Answer(
        "vLLM measures instead of guessing. Each worker runs a profiling forward pass of "
        "max_num_batched_tokens dummy tokens, measures what it needs besides the KV cache "
        "(weights, the activation peak, non-torch memory; CUDA-graph memory too unless "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0, vllm/envs.py), and gives the KV cache "
        "gpu_memory_utilization x total memory minus that (vllm/v1/worker/gpu_worker.py, "
        "determine_available_memory; 0.92 by default in vllm/config/cache.py; "
        "kv_cache_memory_bytes replaces the rule). The bytes become num_blocks = available // "
        "bytes per block (vllm/v1/core/kv_cache_utils.py, get_kv_cache_config_from_groups), the "
        "smallest over the workers, and one block is kept as the null block "
        "(vllm/v1/core/block_pool.py). minipaged's presets use the same rule without a profile "
        "(activations taken as 0) and with 0.9.",
        figures=[
            *((f"Llama-3-8B on an H100-80GB at {u}: blocks of 16 (activations 0)",
               f"{b // block:,} ({nbytes(b)})") for u, b in budgets.items()),
            ("each GiB the profile run finds costs", f"{(1 << 30) // block:,} blocks"),
        ],
        commands=["minipaged kv-calc --model llama-3-8b"])


@drill("tp-kv-heads", "张量并行怎么切分KV cache？KV头比GPU少怎么办？",
       "How does tensor parallelism shard the KV cache? Fewer KV heads than GPUs?")
def tp_kv_heads(ctx: Context) -> Answer:
    figures = []
    for tp in (1, 2, 8, 16):
        p = memory.kv_preset("llama-3-8b", tp=tp)
        figures.append((f"Llama-3-8B, TP {tp}: KV heads / KV bytes per token per GPU",
                        f"{p.model.kv_heads_per_gpu(tp)} / {nbytes(p.kv_bytes_per_token)}"))
    figures.append(("  token slots at TP 1 / TP 8",
                    f"{memory.kv_preset('llama-3-8b').num_token_slots:,} / "
                    f"{memory.kv_preset('llama-3-8b', tp=8).num_token_slots:,}"))
    return Answer(
        "Tensor parallelism splits attention by heads: each of TP GPUs computes its share of the "
        "query heads and keeps the K/V of its own KV heads, so a token's KV bytes per GPU divide "
        "by TP, and so does the block size in bytes; each GPU has its own pool with the same block "
        "ids. With fewer KV heads than GPUs each GPU holds one and heads are replicated: max(1, "
        "Hkv // TP) (vllm/config/model.py, get_num_kv_heads; vllm/model_executor/layers/linear.py, "
        "QKVParallelLinear), so past TP = Hkv the KV cache stops shrinking per GPU. More GPUs also "
        "leave more memory per GPU after the weights: the token slots grow faster than TP.",
        figures=figures,
        commands=["minipaged kv-calc --model llama-3-8b --tp 8",
                  "minipaged kv-calc --model llama-3-8b --tp 16"])


@drill("fp8-kv", "FP8 KV cache带来什么，代价是什么？",
       "What does an fp8 KV cache buy, and what does it cost?")
def fp8_kv(ctx: Context) -> Answer:
    figures = []
    for dtype in ("fp16", "fp8"):
        p = memory.kv_preset("llama-3-8b", kv_dtype=dtype)
        t = CostModel.for_preset(p, kv_bytes_per_token=p.kv_bytes_per_token).step_time(
            32, 32 * 4096)
        figures.append((f"Llama-3-8B {dtype}: KV per token / token slots / decode step of 32 "
                        f"x 4K", f"{nbytes(p.kv_bytes_per_token)} / {p.num_token_slots:,} / "
                        f"{1e3 * t:.1f} ms"))
    return Answer(
        "An fp8 KV cache stores K and V in one byte per element instead of two (--kv-cache-dtype "
        "fp8 = fp8_e4m3, or fp8_e5m2: vllm/config/cache.py, cache_dtype): twice the tokens in the "
        "same memory, and half the KV bytes a decode step reads. K and V are scaled into fp8's "
        "range by per-layer scales, and the kernel applies them as it reads (k_descale / v_descale "
        "in vllm/v1/attention/backends/flash_attn.py). The cost is accuracy, model by model; the "
        "weights keep their dtype. Decode time falls less than KV bytes do, as the weights are "
        "read every step too.",
        figures=figures,
        commands=["minipaged kv-calc --model llama-3-8b --kv-dtype fp8"])


@drill("mla", "DeepSeek的MLA把每个token的KV缩到多少？",
       "How small does DeepSeek's MLA make the KV of a token?")
def mla(ctx: Context) -> Answer:
    p = memory.kv_preset("deepseek-v2")
    m = p.model
    mha = 2 * m.num_layers * m.num_kv_heads * m.head_size * m.dtype_bytes
    groups = (m.kv_lora_rank + m.qk_rope_head_dim) / (2 * m.head_size)
    return Answer(
        "Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1) caches one "
        "compressed latent per token and layer, kv_lora_rank = 512 elements, plus a 64-element key "
        "carrying RoPE (qk_rope_head_dim), instead of K and V for 128 heads: (d_c + d_h^R) x "
        "layers elements, the paper's Table 1. Keys and values are expanded from the latent inside "
        "attention. vLLM stores it as one KV head of size 576 with no separate V "
        "(vllm/config/model.py, get_num_kv_heads returns 1 for MLA; vllm/v1/kv_cache_interface.py, "
        "MLAAttentionSpec), so every tensor-parallel rank holds the whole latent: TP does not "
        "divide it.",
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


DRILLS = (chunked_prefill, v1_engine, num_gpu_blocks, tp_kv_heads, fp8_kv, mla)
