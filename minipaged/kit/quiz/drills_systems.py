"""Interviewer drills on what serving systems built around PagedAttention since the paper.

Speculative decoding's rollback, sliding-window and hybrid managers, KV offloading and
disaggregated prefill, beam search outside the engine core, and the critiques (vAttention; the
cost of the indirection). ``DRILLS`` here gathers them after ``drills_engine.py``'s: all the
systems drills, in quiz order. Figures come from the block managers, the calculator and the
cost model; the one vLLM formula the package has no function for (``window_blocks``) is written
here with where it comes from. Every claim about vLLM names its file in vLLM 0.32.
Read before: ``drills_engine.py``. Read next: ``glossary.py``.
"""

from __future__ import annotations

from minipaged import KVCacheManager
from minipaged._checks import cdiv
from minipaged.kit.quiz import drills_engine
from minipaged.kit.quiz.context import Answer, Context, drill, nbytes, pct
from minipaged.sim import memory
from minipaged.sim.cost import CostModel


@drill("spec-decode", "投机解码时KV cache怎么处理被拒绝的token？",
       "Speculative decoding: what happens to the KV slots of rejected tokens?")
def spec_decode(ctx: Context) -> Answer:
    m = KVCacheManager(8, 16)
    m.allocate("r", list(range(30)))
    held = [len(m.block_table("r"))]
    for t in range(5):                      # k = 5 draft tokens: 5 lookahead slots
        m.append_slot("r", 100 + t)
    held.append(len(m.block_table("r")))
    m.rollback("r", 3)                      # the target model accepts 2 of them
    held.append(len(m.block_table("r")))
    return Answer(
        "A draft (a small model, n-gram lookup, EAGLE heads) proposes k tokens; the target model "
        "scores all k in one forward pass, which needs a slot for every draft token (lookahead "
        "slots) and writes their K/V; it accepts a prefix of them and samples one more. The "
        "rejected tokens' slots must come back. minipaged's KVCacheManager.rollback(seq_id, n) "
        "gives them back and frees blocks left empty; a shared block is copied before the next "
        "write. vLLM v1 allocates the draft tokens' slots in allocate_slots (num_lookahead_tokens "
        "too), caches only verified tokens (vllm/v1/core/kv_cache_manager.py), and on rejection "
        "moves num_computed_tokens back, keeping the blocks for the next step "
        "(vllm/v1/core/sched/scheduler.py, update_from_output).",
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


@drill("sliding-window", "滑动窗口注意力和混合模型的KV cache怎么管理？",
       "How are sliding-window and hybrid models' KV caches managed?")
def sliding_window(ctx: Context) -> Answer:
    full = cdiv(32768, 16)
    win = window_blocks(32768, 1024, 16)
    hybrid = (full + 5 * win) / 6
    return Answer(
        "A sliding-window layer attends to the last W tokens only, so blocks wholly before the "
        "window can be freed while the request runs: vLLM's SlidingWindowManager frees them and "
        "puts the null block in their table entries "
        "(vllm/v1/core/single_type_kv_cache_manager.py). A hybrid model mixes layer types (Gemma "
        "3: five 1024-token sliding-window layers per full one, arXiv 2503.19786): vLLM groups the "
        "layers by type, gives each group its own block table from one shared pool with one page "
        "size, and a request's blocks per group follow that group's rule "
        "(vllm/v1/core/kv_cache_coordinator.py HybridKVCacheCoordinator; "
        "vllm/v1/core/kv_cache_utils.py). minipaged has full attention only.",
        figures=[
            ("32K context, BS 16: blocks per full-attention layer", f"{full:,}"),
            ("  per 1024-token sliding-window layer", f"{win:,}"),
            ("  5 window : 1 full layers, per layer on average",
             f"{hybrid:,.0f} ({pct(hybrid / full)} of full attention)"),
        ],
        commands=["minipaged kv-calc --context-len 32768"])


@drill("offload-disagg", "KV offloading和PD分离和swap是什么关系？",
       "How do KV offloading and disaggregated prefill relate to swapping?")
def offload_disagg(ctx: Context) -> Answer:
    p = memory.kv_preset("llama-3-8b")
    cost = CostModel.for_preset(p)
    kv = 2048 * p.kv_bytes_per_token
    return Answer(
        "v0's swap moved a preempted group's blocks to CPU memory and back; the v1 engine only "
        "recomputes. What moves KV now is a connector beside the engine "
        "(vllm/distributed/kv_transfer/kv_connector/v1/): KV offloading copies blocks to CPU "
        "memory or storage and loads them back on a prefix hit, like swap but for reuse, not "
        "preemption (offloading_connector.py, vllm/v1/kv_offload/); disaggregated prefill runs "
        "prompts on prefill instances and ships their KV to decode instances (nixl/ connector), so "
        "long prefills never stall decodes (DistServe, arXiv 2401.09670; Splitwise, arXiv "
        "2311.18677). Both pay bytes for compute, the trade the paper's Fig. 19 measured for swap.",
        figures=[
            ("Llama-3-8B, a 2048-token prompt: KV bytes", nbytes(kv)),
            ("  over PCIe at the cost model's 25 GB/s", f"{1e3 * kv / p.gpu.pcie_bw:.1f} ms"),
            ("  recomputed: one prefill step (cost model)",
             f"{1e3 * cost.step_time(2048, 2048):.1f} ms"),
        ],
        commands=[ctx.sim_command(kv_cache_gb=2, preemption_mode="swap"),
                  "minipaged kv-calc --model llama-3-8b"])


@drill("beam-outside", "vLLM v1里束搜索是怎么实现的？", "How does vLLM v1 run beam search?")
def beam_outside(ctx: Context) -> Answer:
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
        "The paper's engine (early vLLM v0) ran beam search inside: beams were sequences of one "
        "group, forked with copy-on-write. The v1 engine core has no beams: LLM.beam_search "
        "(vllm/entrypoints/generate/beam_search/offline.py) sends one max_tokens=1 request per "
        "beam and step, asks for 2 x beam_width logprobs, keeps the best beams itself, and relies "
        "on prefix caching to find the shared history again: full blocks come back by hash, the "
        "partly filled last block is computed again every step. minipaged keeps the paper's way "
        "(sharing/sampling.py BeamSearch: fork and copy-on-write).",
        figures=[
            (f"a beam of {len(beam)} tokens at BS 16, sent again: tokens found / computed",
             f"{found} / {len(beam) - found}"),
            ("  with fork and copy-on-write: tokens computed",
             str(cow.seq_len("beam") - before)),
        ],
        commands=["minipaged demo beam", "minipaged demo cow-prefix"])


@drill("alternatives", "PagedAttention有什么代价？vAttention怎么批评它？",
       "What does PagedAttention cost, and what does vAttention criticise?")
def alternatives(ctx: Context) -> Answer:
    c = CostModel.for_preset(memory.kv_preset("opt-13b"))
    m = memory.kv_preset("llama-3-8b").model
    per_layer_k = m.num_kv_heads * m.head_size * m.dtype_bytes
    return Answer(
        "The indirection costs: the paper's paged kernel was 20-26% slower than "
        "FasterTransformer's attention (section 7.1, Fig. 18a), from table lookups, extra branches "
        "and variable lengths, on attention only. vAttention (Prabhu et al., arXiv 2405.04437) "
        "keeps each request's KV contiguous in virtual memory and maps physical memory in on "
        "demand with CUDA's virtual memory APIs, so unmodified kernels run on it; its critique is "
        "that paging needs rewritten kernels and a memory manager. Its own costs: physical memory "
        "is mapped in pages (2 MiB with CUDA's default granularity; the paper adds smaller ones) "
        "and virtual space is reserved up front. Today's fast kernels (FlashAttention, FlashInfer) "
        "read paged caches natively.",
        figures=[
            ("cost model: extra KV traffic of a paged read at BS 16 (set by Fig. 18a)",
             f"+{pct(c.block_overhead_tokens / 16)}"),
            ("Llama-3-8B, one layer's K: tokens per 2 MiB page / per block",
             f"{(2 << 20) // per_layer_k:,} / 16"),
        ],
        commands=["minipaged bench attention --help", "minipaged bench kernel --help"])


DRILLS = drills_engine.DRILLS + (spec_decode, sliding_window, offload_disagg, beam_outside,
                                 alternatives)
