// cache_kernels.cu: writing K/V into the paged cache, and copy-on-write of whole blocks.
//
// Where this sits: the GPU twins of minipaged/paged/cache_ops.py (read that first). Paper: vLLM
// section 5, kernel-level optimizations (fused reshape and block write: new tokens' K/V to the
// slots the block table of section 4.2 names; fused block copy: the copy-on-write copies of
// section 4.4 batched into one launch). paged_attention.cu reads what these kernels wrote.
// Read next: common.cuh, then kernels.py.
//
// Napkin math:
//   reshape_and_cache, decode step of S=64 sequences, Hkv=8, D=128, fp16: reads and writes
//     2 (K,V) * 64 * 8 * 128 * 2 B = 256 KiB each way: ~0.1 us of bandwidth at an H200's
//     4.8 TB/s, so the launch overhead (~3-5 us) dominates. That is why it is one launch per
//     step, for all tokens of all sequences, and why vLLM skips padding tokens (slot < 0) in
//     the kernel rather than compacting them on the host (minipaged's launcher checks the slots
//     on the host first, cache_checks.py, then the kernel skips them too).
//   copy_blocks, N pairs, Hkv=8, BS=16, D=128, fp16: 2 (K,V) * Hkv * BS * D * 2 B = 64 KiB read
//     and 64 KiB written per pair. A beam search step copying 100 blocks reads 6.25 MiB: a few
//     microseconds of bandwidth, one launch.
#include "common.cuh"

namespace mp {

// One thread block per token: token t's K and V ([Hkv, D] each) go to slot slot_mapping[t],
// i.e. physical block slot / BS, offset slot % BS. Grid: (T); block: up to 256 threads.
template <typename scalar_t>
__global__ void reshape_and_cache_kernel(
    const scalar_t* __restrict__ key,         // [T, Hkv, D]
    const scalar_t* __restrict__ value,       // [T, Hkv, D]
    scalar_t* __restrict__ key_cache,         // [NB, Hkv, BS, D]
    scalar_t* __restrict__ value_cache,       // [NB, Hkv, BS, D]
    const long long* __restrict__ slot_mapping,  // [T]  (negative: padding, skip)
    int num_kv_heads, int head_size, int block_size) {
  const long long token = blockIdx.x;
  const long long slot = slot_mapping[token];
  if (slot < 0) return;  // the whole block returns: no barrier in this kernel, so that is fine
  const long long block = slot / block_size, offset = slot % block_size;
  const int n = num_kv_heads * head_size;
  // consecutive threads copy consecutive elements: coalesced reads and (per head) writes
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int h = i / head_size, d = i % head_size;
    const long long dst = ((block * num_kv_heads + h) * block_size + offset) * head_size + d;
    key_cache[dst] = key[token * n + i];
    value_cache[dst] = value[token * n + i];
  }
}

// One thread block per (src, dst) pair: copy physical block src to dst, in K and in V.
// Grid: (N); block: up to 256 threads. The launcher rejects pairs that overlap (a dst that is
// another pair's src, or two pairs writing one dst): blocks run in no particular order.
template <typename scalar_t>
__global__ void copy_blocks_kernel(
    scalar_t* __restrict__ key_cache,         // [NB, Hkv, BS, D]
    scalar_t* __restrict__ value_cache,       // [NB, Hkv, BS, D]
    const long long* __restrict__ block_mapping,  // [N, 2]  (src, dst)
    int block_numel) {                        // Hkv * BS * D
  const long long src = block_mapping[2 * blockIdx.x], dst = block_mapping[2 * blockIdx.x + 1];
  for (int i = threadIdx.x; i < block_numel; i += blockDim.x) {
    key_cache[dst * block_numel + i] = key_cache[src * block_numel + i];
    value_cache[dst * block_numel + i] = value_cache[src * block_numel + i];
  }
}

}  // namespace mp
