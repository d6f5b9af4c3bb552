"""How long one scheduler step takes on a GPU: a roofline cost model.

What this teaches: why a bigger batch means more throughput. A decode step of a large model is
bound by *memory traffic*: every step reads all the weights once, whatever the batch size, plus
every running sequence's KV cache. Batching 32 sequences instead of 8 costs little more time
than reading the weights, so throughput grows almost linearly with the batch, and the batch is
limited by KV cache memory. That is the whole case for PagedAttention (paper sections 2.3 and 3).
Read next: ``executor.py``.

Assumptions (each one a simplification; the figures are estimates, not measurements):
    1. Weights: each step reads every weight once from HBM: ``weight_bytes / (mem_bw x mem_eff)``.
    2. KV reads: attention reads the K and V of every token in every scheduled sequence's context,
       once per step: ``sum(context_len) x kv_bytes_per_token / (mem_bw x mem_eff)``.
    3. Compute: each token processed (prefill or decode) costs ``2 x num_params`` FLOPs (one
       multiply-add per weight), at ``flops x compute_eff``. Attention FLOPs are left out (small
       next to the weights at these lengths).
    4. Memory traffic and compute overlap: a step takes the larger of the two (a roofline), plus
       a fixed per-step overhead for scheduling, sampling and kernel launches.
    5. Paging costs: a paged kernel pays a fixed cost per block it reads (block-table lookup,
       one more short memory transaction, loop overhead), modelled as ``block_overhead_tokens``
       tokens' worth of extra KV traffic per block. Default 4: at block size 16 that is 25%
       more attention time, the paper's measured 20-26% (Fig. 18a); at block size 1 it is 5x.
       This is what makes very small blocks slow; fragmentation makes very large ones wasteful.
    6. Swapping moves blocks over PCIe at ``pcie_bw`` and pays ``swap_latency_s`` per copy; a
       block is ``copies_per_block`` copies (vLLM v0 copies each layer's K and V block
       separately: 2 x num_layers; vllm/worker/cache_engine.py swap_in / swap_out loop over the
       layers, vllm/attention/ops/paged_attn.py swap_blocks copies K, then V), so small blocks
       mean many small copies, the reason swapping suffers at small block sizes in the paper's
       Fig. 19 (section 7.3).
    7. Recomputation has no cost of its own: the re-prefilled tokens are ordinary prefill tokens.
The efficiencies are our choice (typical achieved fractions of the datasheet), not fitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from minipaged.sim.memory import MemoryPreset


@dataclass(frozen=True)
class CostModel:
    weight_bytes: float
    kv_bytes_per_token: int
    flops_per_token: float
    mem_bw: float
    flops: float
    pcie_bw: float
    mem_eff: float = 0.7
    compute_eff: float = 0.5
    step_overhead_s: float = 0.003
    swap_latency_s: float = 5e-6
    copies_per_block: int = 1
    block_overhead_tokens: float = 4.0

    @classmethod
    def for_preset(cls, p: MemoryPreset, **overrides) -> CostModel:
        kw = dict(weight_bytes=p.model.weight_bytes, kv_bytes_per_token=p.model.kv_bytes_per_token,
                  flops_per_token=2.0 * p.model.num_params, mem_bw=p.gpu.mem_bw,
                  flops=p.gpu.flops, pcie_bw=p.gpu.pcie_bw,
                  copies_per_block=2 * p.model.num_layers)
        kw.update(overrides)
        return cls(**kw)

    def step_time(self, num_tokens: int, sum_context: int, *, blocks_read: int = 0,
                  blocks_swapped: int = 0, block_bytes: int = 0) -> float:
        """Seconds for one step that computes ``num_tokens`` tokens (prefill + decode) over
        contexts adding up to ``sum_context`` tokens held in ``blocks_read`` KV blocks (0 for a
        contiguous cache), and swaps ``blocks_swapped`` blocks of ``block_bytes`` each."""
        if num_tokens == 0 and blocks_swapped == 0:
            return 0.0
        kv_tokens = sum_context + blocks_read * self.block_overhead_tokens
        t_mem = (self.weight_bytes + kv_tokens * self.kv_bytes_per_token) / (
            self.mem_bw * self.mem_eff)
        t_compute = num_tokens * self.flops_per_token / (self.flops * self.compute_eff)
        t = max(t_mem, t_compute) + self.step_overhead_s if num_tokens else 0.0
        if blocks_swapped:
            t += blocks_swapped * (self.copies_per_block * self.swap_latency_s
                                   + block_bytes / self.pcie_bw)
        return t
