"""Interviewer drills on what serving systems built around PagedAttention since the paper.

Chunked prefill, vLLM v1's engine, how vLLM sizes its block pool, tensor parallelism, an fp8
cache, MLA's latent KV, speculative decoding's rollback, sliding-window and hybrid managers, KV
offloading and disaggregated prefill, beam search outside the engine core, and the critiques
(vAttention; the cost of the indirection). Every figure is computed as it prints: by the
calculator (``sim/memory.py``, ``minipaged kv-calc``), the cost model, the scheduler and the
block managers; the few vLLM formulas the package has no function for are small functions
here that say where they come from. Every claim about vLLM names its file in vLLM 0.32.
Read before: ``drills_mechanics.py``.
"""

from __future__ import annotations

from minipaged._checks import cdiv
from minipaged.kit.quiz.context import Answer, Context, Drill, nbytes, pct


def _three_requests(chunked: bool) -> dict:
    """Lesson 11's schedule: A and B (3-token prompts, 8 tokens out) decode while L (a 22-token
    prompt) arrives at step 3, budget 8 when chunked. Steps at which each request got a token,
    and the (decodes, prefill tokens) of every step that mixed both."""
    from minipaged.serving.memory_policy import make_policy
    from minipaged.serving.scheduler import Scheduler, SchedulerConfig
    from minipaged.sim.cost import CostModel
    from minipaged.sim.executor import SimExecutor
    from minipaged.sim.memory import preset

    policy = make_policy("paged", num_slots=256, block_size=4, max_seq_len=64, watermark=0.0)
    s = Scheduler(policy, SchedulerConfig(max_model_len=64, chunked_prefill=chunked,
                                          max_num_batched_tokens=8 if chunked else None))
    ex = SimExecutor(CostModel.for_preset(preset("opt-13b")), 1)
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


def chunked_prefill(ctx: Context) -> Answer:
    runs = {c: ctx.cached(("three", c), lambda c=c: _three_requests(c)) for c in (True, False)}
    gap = {c: max(b - a for a, b in zip(r["got"]["A"], r["got"]["A"][1:]))
           for c, r in runs.items()}
    d, p = runs[True]["mixed"][0]
    return Answer(
        text=(
            "vLLM v1's scheduler has no prefill phase and no decode phase: each step has one "
            "token budget (max_num_batched_tokens); running requests come first, a decode "
            "costing one token, and what is left goes to the next chunk of the waiting "
            "prompts, so chunks and decodes share one forward pass "
            "(vllm/v1/core/sched/scheduler.py, schedule). A long prompt no longer stalls the "
            "requests that are decoding. Lesson 11 teaches it on minipaged's scheduler "
            "(SchedulerConfig(chunked_prefill=True)); exercise 14 has you write the step."),
        figures=[
            ("budget 8, A and B decoding, L's 22-token prompt arrives: first mixed step",
             f"{d} decodes + {p} prefill tokens"),
            ("longest gap between two of A's tokens: chunked / v0-style steps",
             f"{gap[True]} / {gap[False]} steps"),
        ],
        commands=["python lessons/11_chunked_prefill.py", "minipaged check 14"])


def capture_sizes(max_size: int = 512) -> list[int]:
    """vLLM's default CUDA-graph capture sizes: [1, 2, 4] + range(8, 256, 8) +
    range(256, max + 1, 16) (vllm/config/compilation.py, max_cudagraph_capture_size). A formula."""
    return [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)]
            if s <= max_size]


def v1_engine(ctx: Context) -> Answer:
    from minipaged.sim.memory import block_table_bytes

    sizes = capture_sizes()
    padded = {n: next((s for s in sizes if s >= n), None) for n in (37, 300, 600)}
    return Answer(
        text=(
            "One step of vLLM v1: the scheduler gives each request some tokens within one "
            "token budget, prefill chunks and decodes mixed. The model runner keeps a "
            "persistent batch: request state and a zero-filled int32 block table "
            "[max_num_reqs, cdiv(max_model_len, BS)] in buffers allocated once and updated "
            "in place (vllm/v1/worker/gpu_input_batch.py, vllm/v1/worker/block_table.py; "
            "CpuGpuBuffer in vllm/v1/utils.py). "
            "Attention is one varlen FlashAttention call for all the step's tokens: queries "
            "packed by cu_seqlens_q, K/V read from the paged cache through block_table and "
            "seqused_k (vllm/v1/attention/backends/flash_attn.py; kernel block sizes: "
            "multiples of 16). A CUDA graph replays kernels recorded with fixed addresses and "
            "shapes, so every input lives in a fixed buffer, the block table at its full "
            "width, and a step's token count is padded up to a captured size "
            "(vllm/config/compilation.py, cudagraph_capture_sizes); above the largest, the "
            "step runs without a graph (vllm/v1/cudagraph_dispatcher.py). "
            "minipaged builds its tables per step (KVCacheManager.block_tables) and has no "
            "graphs."),
        figures=[
            ("CUDA-graph sizes captured by default (max 512)", f"{len(sizes)}"),
            *((f"a step of {n} tokens runs the graph of", "no graph" if s is None else str(s))
              for n, s in padded.items()),
            ("persistent table, 256 requests x 8192 tokens / BS 16, int32",
             nbytes(256 * block_table_bytes(8192, 16))),
        ],
        commands=["minipaged kv-calc --model llama-3-8b --context-len 8192 --num-requests 256",
                  "python lessons/11_chunked_prefill.py"])


def num_gpu_blocks(ctx: Context) -> Answer:
    from minipaged.sim.memory import default_kv_cache_bytes, kv_preset

    p = kv_preset("llama-3-8b")
    block = 16 * p.kv_bytes_per_token
    budgets = {u: default_kv_cache_bytes(p.model, p.gpu, gpu_memory_utilization=u)
               for u in (0.9, 0.92)}
    return Answer(
        text=(
            "vLLM measures instead of guessing. Each worker runs a profiling forward pass of "
            "max_num_batched_tokens dummy tokens, measures what it needs besides the KV cache "
            "(weights, the activation peak, non-torch memory; CUDA-graph memory too when "
            "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS is set), and gives the KV cache "
            "gpu_memory_utilization x total memory minus that (vllm/v1/worker/gpu_worker.py, "
            "determine_available_memory; 0.92 by default in vllm/config/cache.py; "
            "kv_cache_memory_bytes replaces the rule). The bytes become "
            "num_blocks = available // bytes per block (vllm/v1/core/kv_cache_utils.py, "
            "get_kv_cache_config_from_groups), the smallest over the workers, and one block is "
            "kept as the null block (vllm/v1/core/block_pool.py). minipaged's presets use the "
            "same rule without a profile (activations taken as 0) and with 0.9."),
        figures=[
            *((f"Llama-3-8B on an H100-80GB at {u}: blocks of 16 (activations 0)",
               f"{b // block:,} ({nbytes(b)})") for u, b in budgets.items()),
            ("each GiB the profile run finds costs", f"{(1 << 30) // block:,} blocks"),
        ],
        commands=["minipaged kv-calc --model llama-3-8b"])


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


def spec_decode(ctx: Context) -> Answer:
    from minipaged import KVCacheManager

    m = KVCacheManager(8, 16)
    m.allocate("r", list(range(30)))
    held = [len(m.block_table("r"))]
    for t in range(5):                      # k = 5 draft tokens: 5 lookahead slots
        m.append_slot("r", 100 + t)
    held.append(len(m.block_table("r")))
    m.rollback("r", 3)                      # the target model accepts 2 of them
    held.append(len(m.block_table("r")))
    return Answer(
        text=(
            "A draft (a small model, n-gram lookup, EAGLE heads) proposes k tokens; the target "
            "model scores all k in one forward pass, which needs a slot for every draft token "
            "(lookahead slots) and writes their K/V; it accepts a prefix of them and samples "
            "one more. The rejected tokens' slots must come back. minipaged's "
            "KVCacheManager.rollback(seq_id, n) gives them back and frees blocks left empty; "
            "a shared block is copied before the next write. vLLM v1 allocates the draft "
            "tokens' slots in allocate_slots (num_lookahead_tokens too), caches only verified "
            "tokens (vllm/v1/core/kv_cache_manager.py), and on rejection moves "
            "num_computed_tokens back, keeping the blocks for the next step "
            "(vllm/v1/core/sched/scheduler.py, update_from_output)."),
        figures=[("30 tokens at BS 16: blocks held / with 5 drafts / 3 rejected, rolled back",
                  " / ".join(map(str, held))),
                 ("free blocks after the rollback", f"{m.num_free_blocks} of {m.num_blocks}")],
        commands=["python -m pytest -q tests/test_rollback.py tests/test_rollback_stateful.py"])


def window_blocks(context_len: int, window: int, block_size: int) -> int:
    """Blocks a sliding-window layer still holds: the tokens before the window are skipped,
    max(0, L - W + 1), and their whole blocks freed (vllm/v1/core/single_type_kv_cache_manager.py
    SlidingWindowManager.get_num_skipped_tokens, remove_skipped_blocks). A formula."""
    skipped = max(0, context_len - window + 1)
    return cdiv(context_len, block_size) - skipped // block_size


def sliding_window(ctx: Context) -> Answer:
    full = cdiv(32768, 16)
    win = window_blocks(32768, 1024, 16)
    hybrid = (full + 5 * win) / 6
    return Answer(
        text=(
            "A sliding-window layer attends to the last W tokens only, so blocks wholly "
            "before the window can be freed while the request runs: vLLM's "
            "SlidingWindowManager frees them and puts the null block in their table entries "
            "(vllm/v1/core/single_type_kv_cache_manager.py). A hybrid model mixes layer types "
            "(Gemma 3: five 1024-token sliding-window layers per full one, arXiv 2503.19786): "
            "vLLM groups the layers by type, gives each group its own block table from one "
            "shared pool with one page size, and a request's blocks per group follow that "
            "group's rule (vllm/v1/core/kv_cache_coordinator.py HybridKVCacheCoordinator; "
            "vllm/v1/core/kv_cache_utils.py). minipaged has full attention only."),
        figures=[
            ("32K context, BS 16: blocks per full-attention layer", f"{full:,}"),
            ("  per 1024-token sliding-window layer", f"{win:,}"),
            ("  5 window : 1 full layers, per layer on average",
             f"{hybrid:,.0f} ({pct(hybrid / full)} of full attention)"),
        ],
        commands=["minipaged kv-calc --context-len 32768"])


def offload_disagg(ctx: Context) -> Answer:
    from minipaged.sim.cost import CostModel
    from minipaged.sim.memory import kv_preset

    p = kv_preset("llama-3-8b")
    cost = CostModel.for_preset(p)
    kv = 2048 * p.kv_bytes_per_token
    return Answer(
        text=(
            "v0's swap moved a preempted group's blocks to CPU memory and back; the v1 engine "
            "only recomputes. What moves KV now is a connector beside the engine "
            "(vllm/distributed/kv_transfer/kv_connector/v1/): KV offloading copies blocks to "
            "CPU memory or storage and loads them back on a prefix hit, like swap but for "
            "reuse, not preemption (offloading_connector.py, vllm/v1/kv_offload/); "
            "disaggregated prefill runs prompts on prefill instances and ships their KV to "
            "decode instances (nixl/ connector), so long prefills never stall decodes "
            "(DistServe, arXiv 2401.09670; Splitwise, arXiv 2311.18677). Both pay bytes for "
            "compute, the trade the paper's Fig. 19 measured for swap."),
        figures=[
            ("Llama-3-8B, a 2048-token prompt: KV bytes", nbytes(kv)),
            ("  over PCIe at the cost model's 25 GB/s", f"{1e3 * kv / p.gpu.pcie_bw:.1f} ms"),
            ("  recomputed: one prefill step (cost model)",
             f"{1e3 * cost.step_time(2048, 2048):.1f} ms"),
        ],
        commands=[ctx.sim_command(kv_cache_gb=2, preemption_mode="swap"),
                  "minipaged kv-calc --model llama-3-8b"])


def beam_outside(ctx: Context) -> Answer:
    from minipaged import KVCacheManager

    beam = list(range(37))                       # a beam of 37 tokens, at BS 16
    v1 = KVCacheManager(32, 16, enable_prefix_caching=True)
    v1.allocate("step 1", beam[:-1])             # last step's request sampled token 37 ...
    v1.free("step 1")
    found = v1.allocate("step 2", beam)          # ... and this step's request carries it
    cow = KVCacheManager(32, 16)
    cow.allocate("beam", beam[:-1])
    cow.fork("beam", "sibling")
    before = cow.seq_len("beam")
    cow.append_slot("beam", beam[-1])            # fork + copy-on-write: only the new token
    return Answer(
        text=(
            "The paper's engine (early vLLM v0) ran beam search inside: beams were sequences "
            "of one group, forked with copy-on-write. The v1 engine core has no beams: "
            "LLM.beam_search (vllm/entrypoints/generate/beam_search/offline.py) sends one "
            "max_tokens=1 request per beam and step, asks for 2 x beam_width logprobs, keeps "
            "the best beams itself, and relies on prefix caching to find the shared history "
            "again: full blocks come back by hash, the partly filled last block is computed "
            "again every step. minipaged keeps the paper's way (sharing/sampling.py "
            "BeamSearch: fork and copy-on-write)."),
        figures=[
            (f"a beam of {len(beam)} tokens at BS 16, sent again: tokens found / computed",
             f"{found} / {len(beam) - found}"),
            ("  with fork and copy-on-write: tokens computed",
             str(cow.seq_len("beam") - before)),
        ],
        commands=["minipaged demo beam", "minipaged demo cow-prefix"])


def alternatives(ctx: Context) -> Answer:
    from minipaged.sim.cost import CostModel
    from minipaged.sim.memory import kv_preset

    c = CostModel.for_preset(kv_preset("opt-13b"))
    m = kv_preset("llama-3-8b").model
    per_layer_k = m.num_kv_heads * m.head_size * m.dtype_bytes
    return Answer(
        text=(
            "The indirection costs: the paper's paged kernel was 20-26% slower than "
            "FasterTransformer's attention (section 7.1, Fig. 18a), from table lookups, extra "
            "branches and variable lengths, on attention only. vAttention (Prabhu et al., "
            "arXiv 2405.04437) keeps each request's KV contiguous in virtual memory and maps "
            "physical memory in on demand with CUDA's virtual memory APIs, so unmodified "
            "kernels run on it; its critique is that paging needs rewritten kernels and a "
            "memory manager. Its own costs: physical memory is mapped in pages (2 MiB with "
            "CUDA's default granularity; the paper adds smaller ones) and virtual space is "
            "reserved up front. Today's fast kernels (FlashAttention, FlashInfer) read paged "
            "caches natively."),
        figures=[
            ("cost model: extra KV traffic of a paged read at BS 16 (set by Fig. 18a)",
             f"+{pct(c.block_overhead_tokens / 16)}"),
            ("Llama-3-8B, one layer's K: tokens per 2 MiB page / per block",
             f"{(2 << 20) // per_layer_k:,} / 16"),
        ],
        commands=["minipaged bench attention --help", "minipaged bench kernel --help"])


DRILLS: tuple[Drill, ...] = (
    Drill("chunked-prefill", "interviewer", "什么是chunked prefill？vLLM v1怎么调度一步？",
          "What is chunked prefill, and how does vLLM v1 schedule a step?", chunked_prefill),
    Drill("v1-engine", "interviewer", "vLLM v1引擎一步里发生了什么？CUDA graph为什么固定块表宽度？",
          "What happens in one vLLM v1 engine step? Why do CUDA graphs fix the table width?",
          v1_engine),
    Drill("num-gpu-blocks", "interviewer", "vLLM怎么决定num_gpu_blocks？",
          "How does vLLM decide num_gpu_blocks?", num_gpu_blocks),
    Drill("tp-kv-heads", "interviewer", "张量并行怎么切分KV cache？KV头比GPU少怎么办？",
          "How does tensor parallelism shard the KV cache? Fewer KV heads than GPUs?",
          tp_kv_heads),
    Drill("fp8-kv", "interviewer", "FP8 KV cache带来什么，代价是什么？",
          "What does an fp8 KV cache buy, and what does it cost?", fp8_kv),
    Drill("mla", "interviewer", "DeepSeek的MLA把每个token的KV缩到多少？",
          "How small does DeepSeek's MLA make the KV of a token?", mla),
    Drill("spec-decode", "interviewer", "投机解码时KV cache怎么处理被拒绝的token？",
          "Speculative decoding: what happens to the KV slots of rejected tokens?",
          spec_decode),
    Drill("sliding-window", "interviewer", "滑动窗口注意力和混合模型的KV cache怎么管理？",
          "How are sliding-window and hybrid models' KV caches managed?", sliding_window),
    Drill("offload-disagg", "interviewer", "KV offloading和PD分离和swap是什么关系？",
          "How do KV offloading and disaggregated prefill relate to swapping?",
          offload_disagg),
    Drill("beam-outside", "interviewer", "vLLM v1里束搜索是怎么实现的？",
          "How does vLLM v1 run beam search?", beam_outside),
    Drill("alternatives", "interviewer", "PagedAttention有什么代价？vAttention怎么批评它？",
          "What does PagedAttention cost, and what does vAttention criticise?", alternatives),
)
