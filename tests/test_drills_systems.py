"""The systems drills (``minipaged/kit/quiz/drills_systems.py``, which gathers those of
``drills_engine.py``): what interviews ask beyond the paper, each answer computed by the
package.

What is promised, and tested here:
- one drill per topic (chunked prefill, the v1 engine, num_gpu_blocks, TP, fp8, MLA,
  speculative decoding, sliding-window / hybrid, offloading / disaggregation, beam search,
  alternatives), each in the quiz, with Chinese and English wording and commands;
- every figure follows the package: the numbers are checked against hand arithmetic, and a
  patched package function changes what prints;
- every sentence about vLLM cites a file (a ``vllm/`` path); where vLLM is installed, each
  cited path and the names quoted next to it exist in its source.
"""

from __future__ import annotations

import re

from minipaged.kit.quiz import DRILLS, Context, drills_systems
from minipaged.kit.quiz.drills_engine import capture_sizes
from minipaged.kit.quiz.drills_systems import window_blocks

SMALL = Context(num_requests=30, seed=0)
KEYS = ["chunked-prefill", "v1-engine", "num-gpu-blocks", "tp-kv-heads", "fp8-kv", "mla",
        "spec-decode", "sliding-window", "offload-disagg", "beam-outside", "alternatives"]


def figures(key: str) -> dict[str, str]:
    drill = next(d for d in drills_systems.DRILLS if d.key == key)
    return dict(drill.answer(SMALL).figures)


def test_every_topic_has_a_drill_in_the_quiz():
    assert [d.key for d in drills_systems.DRILLS] == KEYS
    assert set(drills_systems.DRILLS) <= set(DRILLS)


def test_the_vllm_formulas():
    sizes = capture_sizes()
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-2:] == [496, 512] and len(sizes) == 51
    assert capture_sizes(256)[-1] == 256
    assert window_blocks(32768, 1024, 16) == 2048 - (32768 - 1024 + 1) // 16 == 64
    assert window_blocks(100, 200, 16) == 7          # all inside the window: nothing freed
    assert window_blocks(1024, 1024, 16) == 64       # one token skipped: no whole block yet


def test_figures_match_hand_arithmetic():
    f = figures("chunked-prefill")
    assert f["budget 8, A and B decoding, L's 22-token prompt arrives: first mixed step"] == \
        "2 decodes + 6 prefill tokens"                # 2 decodes, the budget's rest to L
    chunked, v0 = f["longest gap between two of A's tokens: chunked / v0-style steps"].split(" / ")
    assert int(chunked) == 1 < int(v0.split()[0])     # chunking never stalls A
    f = figures("v1-engine")
    assert f["a step of 37 tokens runs the graph of"] == "40"
    assert f["a step of 300 tokens runs the graph of"] == "304"
    assert f["a step of 600 tokens runs the graph of"] == "no graph"
    assert f["persistent table, 256 requests x 8192 tokens / BS 16, int32"] == "512.00 KiB"
    f = figures("num-gpu-blocks")
    assert f["each GiB the profile run finds costs"] == f"{2**30 // (16 * 128 * 1024)} blocks"
    assert f["Llama-3-8B on an H100-80GB at 0.9: blocks of 16 (activations 0)"].startswith(
        f"{int(80 * 2**30 * 0.9 - 8.03e9 * 2) // (16 * 128 * 1024):,} ")
    f = figures("tp-kv-heads")
    assert f["Llama-3-8B, TP 2: KV heads / KV bytes per token per GPU"] == "4 / 64.00 KiB"
    assert f["Llama-3-8B, TP 8: KV heads / KV bytes per token per GPU"] == "1 / 16.00 KiB"
    assert f["Llama-3-8B, TP 16: KV heads / KV bytes per token per GPU"] == "1 / 16.00 KiB"
    f = figures("fp8-kv")
    assert f["Llama-3-8B fp8: KV per token / token slots / decode step of 32 x 4K"].startswith(
        "64.00 KiB / ")
    f = figures("mla")
    assert f["DeepSeek-V2 latent per token (60 layers, bf16)"] == "67.50 KiB"   # 576 x 60 x 2
    assert f["  K and V of 128 heads of 128 instead (MHA)"] == "3.75 MiB"       # 2 x 128^2 x 120
    assert f["  ratio / equal to GQA with this many groups"] == "56.9x / 2.25"
    f = figures("spec-decode")
    assert f["30 tokens at BS 16: blocks held / with 5 drafts / 3 rejected, rolled back"] == \
        "2 / 3 / 2"
    f = figures("sliding-window")
    assert f["  per 1024-token sliding-window layer"] == "64"
    assert f["  5 window : 1 full layers, per layer on average"] == "395 (19.3% of full attention)"
    f = figures("offload-disagg")
    assert f["Llama-3-8B, a 2048-token prompt: KV bytes"] == "256.00 MiB"
    pcie_ms = 1e3 * 2048 * 128 * 1024 / 25e9
    assert f["  over PCIe at the cost model's 25 GB/s"] == f"{pcie_ms:.1f} ms"
    f = figures("beam-outside")
    assert f["a beam of 37 tokens at BS 16, sent again: tokens found / computed"] == "32 / 5"
    assert f["  with fork and copy-on-write: tokens computed"] == "1"
    f = figures("alternatives")
    assert f["Llama-3-8B, one layer's K: tokens per 2 MiB page / per block"] == "1,024 / 16"


def test_figures_follow_the_package(monkeypatch):
    import minipaged
    from minipaged.sim import memory

    monkeypatch.setattr(minipaged.KVCacheManager, "rollback", lambda self, s, n: None)
    assert figures("spec-decode")[
        "30 tokens at BS 16: blocks held / with 5 drafts / 3 rejected, rolled back"] == "2 / 3 / 3"
    monkeypatch.setattr(memory.ModelSpec, "kv_heads_per_gpu", lambda self, tp=1: 3)
    assert figures("tp-kv-heads")[
        "Llama-3-8B, TP 8: KV heads / KV bytes per token per GPU"] == "3 / 48.00 KiB"
    real = minipaged.KVCacheManager.allocate
    monkeypatch.setattr(minipaged.KVCacheManager, "allocate",
                        lambda self, s, t: max(0, real(self, s, t) - 16))
    assert figures("beam-outside")[
        "a beam of 37 tokens at BS 16, sent again: tokens found / computed"] == "16 / 21"


VLLM_PATH = re.compile(r"vllm/[\w/]+(?:\.py|/)")

# Every vLLM file the drills cite, with what the drills say is in it (checked against the
# installed vLLM 0.32 where it is installed; a new citation must be added here).
CITED = {
    "vllm/v1/core/sched/scheduler.py": ["def schedule(", "def update_from_output(",
                                         "num_computed_tokens -= num_rejected"],
    "vllm/v1/worker/gpu_input_batch.py": ["class InputBatch"],
    "vllm/v1/worker/block_table.py": ["max_num_blocks_per_req, dtype=torch.int32",
                                      "CpuGpuBuffer"],
    "vllm/v1/utils.py": ["class CpuGpuBuffer", "self.cpu = torch.zeros("],
    "vllm/v1/attention/backends/flash_attn.py": ["cu_seqlens_q", "seqused_k", "block_table=",
                                                 "MultipleOf(16)", "k_descale", "v_descale"],
    "vllm/config/compilation.py": ["cudagraph_capture_sizes",
                                   "range(256, max_cudagraph_capture_size + 1, 16)",
                                   "capped at 512"],
    "vllm/v1/cudagraph_dispatcher.py": ["num_tokens > max_size"],
    "vllm/v1/worker/gpu_worker.py": ["def determine_available_memory(", "profile_run(",
                                     "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS",
                                     "kv_cache_memory_bytes"],
    "vllm/envs.py": ['os.getenv("VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS", "1")'],
    "vllm/config/cache.py": ["gpu_memory_utilization: float = Field(default=0.92",
                             '"fp8_e5m2"', "fp8 (=fp8_e4m3)", "cache_dtype"],
    "vllm/v1/core/kv_cache_utils.py": ["def get_kv_cache_config_from_groups(",
                                       "num_blocks = available_memory // bytes_per_block",
                                       "min_num_blocks"],
    "vllm/v1/core/block_pool.py": ["self.null_block = self.free_block_queue.popleft()"],
    "vllm/config/model.py": ["def get_num_kv_heads(",
                             "max(1, total_num_kv_heads // parallel_config.tensor_parallel_size)",
                             "if self.use_mla:"],
    "vllm/model_executor/layers/linear.py": ["class QKVParallelLinear",
                                             "num_kv_head_replicas = divide(tp_size"],
    "vllm/v1/kv_cache_interface.py": ["class MLAAttentionSpec", "head_size_v: int = 0"],
    "vllm/v1/core/kv_cache_manager.py": ["def allocate_slots(", "num_lookahead_tokens",
                                         "we only cache the verified tokens"],
    "vllm/v1/core/single_type_kv_cache_manager.py": ["class SlidingWindowManager",
                                                     "def remove_skipped_blocks(",
                                                     "replaced by null_block"],
    "vllm/v1/core/kv_cache_coordinator.py": ["class HybridKVCacheCoordinator"],
    "vllm/distributed/kv_transfer/kv_connector/v1/": ["offloading_connector.py", "nixl"],
    "vllm/v1/kv_offload/": ["cpu"],
    "vllm/entrypoints/generate/beam_search/offline.py": ["def beam_search(", "max_tokens=1",
                                                        "logprobs=2 * beam_width"],
}


def cited_paths() -> set[str]:
    return {m.group(0) for d in drills_systems.DRILLS
            for m in VLLM_PATH.finditer(d.answer(SMALL).text)}


def test_every_vllm_answer_names_its_files():
    for d in drills_systems.DRILLS:
        text = d.answer(SMALL).text
        if "vLLM" in text:
            assert VLLM_PATH.search(text), d.key
    assert cited_paths() == set(CITED), "a cited vLLM file is missing from CITED (or stale)"
