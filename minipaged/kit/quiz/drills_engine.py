"""Interviewer drills on vLLM v1's engine: chunked prefill, one engine step, the size of the pool.

How vLLM v1 schedules a step (one token budget, prefill chunks beside decodes), what one engine
step does around the paged cache (the persistent batch, one varlen FlashAttention call, CUDA
graphs that fix the block table's width), and how vLLM decides how many blocks its pool has.
Every figure is computed as it prints: by the scheduler with the simulator's stand-in model
(``sim/executor.py``), the calculator (``sim/memory.py``, ``minipaged kv-calc``), and the one
vLLM formula the package has no function for (``capture_sizes``), written here with where it
comes from. Every claim about vLLM names its file in vLLM 0.32.
Read before: ``drills_mechanics.py``. Read next: ``drills_kv_bytes.py``.
"""

from __future__ import annotations

from minipaged.kit.quiz.context import Answer, Context, Drill, nbytes


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


DRILLS: tuple[Drill, ...] = (
    Drill("chunked-prefill", "interviewer", "什么是chunked prefill？vLLM v1怎么调度一步？",
          "What is chunked prefill, and how does vLLM v1 schedule a step?", chunked_prefill),
    Drill("v1-engine", "interviewer", "vLLM v1引擎一步里发生了什么？CUDA graph为什么固定块表宽度？",
          "What happens in one vLLM v1 engine step? Why do CUDA graphs fix the table width?",
          v1_engine),
    Drill("num-gpu-blocks", "interviewer", "vLLM怎么决定num_gpu_blocks？",
          "How does vLLM decide num_gpu_blocks?", num_gpu_blocks),
)
