// gqa_attention.cu: versions 3 and 4, paged attention with one thread block per KV head.
//
// Where this sits: read paged_attention.cu first; this is its v1 (v3 here) and v2 (v4 here)
// reorganised for grouped-query attention (GQA: H query heads share Hkv KV heads, G = H / Hkv
// query heads per KV head; Llama-3-8B has H=32, Hkv=8, G=4). Paper: vLLM section 4.1 (the
// kernel); GQA: Ainslie et al., EMNLP 2023. Read next: cache_kernels.cu.
// Compile: as paged_attention.cu (kernels.nvcc_source() instantiates both files).
//
// The idea: v1 and v2 give every query head its own thread block, so under GQA the G blocks of
// one KV head each read that head's K and V: G reads of every byte (vLLM's paged kernel does
// the same, csrc/attention/attention_kernels.cuh, one block per (head, sequence, partition)).
// Here one block takes one KV head of one sequence (of one partition, v4) and computes all of
// its query heads (up to GROUP = 8 per block; a larger G takes ceil(G / 8) blocks) from each K
// and V load: a lane loads its 16-byte piece of a key once and multiplies it with G queries;
// it loads a value once and adds it to G outputs. The arithmetic per byte rises G-fold (still
// far below the compute limit: 16 FLOP/byte at G=4) and the bytes fall G-fold.
//   v3 (PARTITION_SIZE == 0): the whole context in one pass. Grid (Hkv * ceil(G/8), S).
//   v4 (PARTITION_SIZE == 512): per partition, then paged_attention.cu's reduce kernel, which
//     combines partial results row by row (a row is one query head of one sequence) and so
//     does not care which block produced them. Grid (Hkv * ceil(G/8), S, partitions).
// The launcher (checks.choose_version) uses them whenever H > Hkv, v3 or v4 by vLLM's rule.
// Verdicts (not timed on a GPU yet; `minipaged gpu-check` measures both against v1/v2 and a
// copy): v3 pays G times the logits' shared memory (G * ctx * 4 bytes: 64 KiB for G=4 at 4K
// tokens, so one to three blocks per SM); v4 keeps it at G * 2 KiB and is the one expected
// to reach the copy-bandwidth target.
//
// Napkin math (decode, S=32, H=32, Hkv=8, G=4, D=128, fp16, context 4096, an H200):
//   unique K/V bytes: 2 * S * Hkv * ctx * D * 2 B = 537 MB. v1/v2 pull them through L2 G = 4
//   times: 2.15 GB of L2 traffic for 537 MB of DRAM traffic, estimated to cap them near 40-60%
//   of copy bandwidth. v3/v4 pull each byte once: 537 MB through L2, so the DRAM floor
//   (537 MB / 4.8 TB/s = 0.11 ms) is the limit to aim at (80% of copy bandwidth: ~0.14 ms).
//   Grid for v4: 8 KV heads * 32 sequences * 8 partitions = 2048 blocks of 128 threads, ~15 per
//   SM of the H200's 132: enough to hide memory latency. Registers: each lane keeps G * D/32
//   output accumulators (16 for G=4, 32 for G=8) besides v1's; ptxas' counts are in
//   `python -m minipaged.cuda.report` (and lesson 08), checked spill-free in CI.
// Not tried yet: 16-byte V loads along D (each lane reading 8 half values of one V row, as the
// K loads do) instead of v1's lane-per-dimension scalar loads.
#include "common.cuh"

namespace mp {

// The max of one head's per-warp maxima (the same value, and bits, in every thread).
template <int NUM_WARPS>
__device__ __forceinline__ float head_max(const float* per_warp) {
  float m = per_warp[0];
  for (int w = 1; w < NUM_WARPS; w++) m = fmaxf(m, per_warp[w]);
  return m;
}

// One thread block computes up to GROUP query heads (those sharing KV head `kv_head`) of one
// sequence (of one partition, v4). Grid: (Hkv * ceil(G / GROUP), S, partitions).
// Dynamic shared memory: logits [min(G, GROUP)][stride] as float, stride = ceil(max seq_len /
// BS) * BS (v3) or PARTITION_SIZE (v4), and at least NUM_WARPS * D (the buffer is reused for the
// warps' partial outputs at the end).
//
// __launch_bounds__(NUM_THREADS, 4): a register budget for ptxas, at least 4 blocks (16 warps)
// per SM, so at most 128 registers per thread. Without a stated minimum, NVRTC 12.9's ptxas
// kept 40-64 registers and spilled 4-48 bytes in 6 to 9 of the 36 instantiations (measured with
// python -m minipaged.cuda.report); with it, none spills and they use 71-96.
template <typename scalar_t, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS, int GROUP,
          int PARTITION_SIZE>
__global__ void __launch_bounds__(NUM_THREADS, 4) gqa_attention_kernel(
    scalar_t* __restrict__ out,               // [S, H, D]        v3: the answer
    float* __restrict__ exp_sums,             // [S, H, P]        v4: sum of exp(logit - max)
    float* __restrict__ max_logits,           // [S, H, P]        v4: max logit of the partition
    float* __restrict__ tmp_out,              // [S, H, P, D]     v4: the partition's output
    const scalar_t* __restrict__ q,           // [S, H, D]
    const scalar_t* __restrict__ k_cache,     // [NB, Hkv, BS, D]
    const scalar_t* __restrict__ v_cache,     // [NB, Hkv, BS, D]
    const int* __restrict__ block_tables,     // [S, MB]
    const int* __restrict__ seq_lens,         // [S]
    int num_heads, int num_kv_heads, int max_num_blocks_per_seq, int max_num_partitions,
    float scale) {
  // the same lane arithmetic as paged_attention_kernel (see there for why)
  constexpr int NUM_WARPS = NUM_THREADS / WARP_SIZE;
  constexpr int THREAD_GROUP_SIZE = (WARP_SIZE / BLOCK_SIZE) > 1 ? WARP_SIZE / BLOCK_SIZE : 1;
  constexpr int NUM_GROUPS = WARP_SIZE / THREAD_GROUP_SIZE;
  constexpr int VEC16 = 16 / (int)sizeof(scalar_t);
  constexpr int VEC = HEAD_SIZE / THREAD_GROUP_SIZE < VEC16 ? HEAD_SIZE / THREAD_GROUP_SIZE
                                                            : VEC16;
  constexpr int VECS_PER_LANE = HEAD_SIZE / (THREAD_GROUP_SIZE * VEC);
  constexpr int DIMS_PER_LANE = (HEAD_SIZE + WARP_SIZE - 1) / WARP_SIZE;
  static_assert(PARTITION_SIZE % BLOCK_SIZE == 0, "a partition is a whole number of KV blocks");
  static_assert(HEAD_SIZE % (THREAD_GROUP_SIZE * VEC) == 0, "whole vector loads per lane");

  const int group_size = num_heads / num_kv_heads;               // G
  const int chunks = (group_size + GROUP - 1) / GROUP;           // blocks per KV head
  const int kv_head = blockIdx.x / chunks;
  const int head0 = kv_head * group_size + (blockIdx.x % chunks) * GROUP;  // first query head
  const int n = imin(GROUP, kv_head * group_size + group_size - head0);     // heads here
  const int seq = blockIdx.y, partition = blockIdx.z;
  const int seq_len = seq_lens[seq];
  if (PARTITION_SIZE > 0 && partition * PARTITION_SIZE >= seq_len) return;  // whole block

  const int num_seq_blocks = (seq_len + BLOCK_SIZE - 1) / BLOCK_SIZE;
  const int blocks_per_partition = PARTITION_SIZE > 0 ? PARTITION_SIZE / BLOCK_SIZE
                                                      : num_seq_blocks;
  const int start_block = partition * blocks_per_partition;
  const int end_block = imin(start_block + blocks_per_partition, num_seq_blocks);
  const int start_token = start_block * BLOCK_SIZE;
  const int num_tokens = imin(end_block * BLOCK_SIZE, seq_len) - start_token;
  const int stride = PARTITION_SIZE > 0 ? PARTITION_SIZE : num_seq_blocks * BLOCK_SIZE;

  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int group = lane / THREAD_GROUP_SIZE, group_lane = lane % THREAD_GROUP_SIZE;

  __shared__ float q_s[GROUP][HEAD_SIZE];          // the block's queries, as float
  __shared__ float max_s[GROUP][NUM_WARPS];        // each warp's max logit, per query head
  __shared__ float sum_s[GROUP][NUM_WARPS];        // each warp's sum of exponentials
  MP_DYNAMIC_SHARED(smem);
  float* logits = reinterpret_cast<float*>(smem);  // [n][stride], later [n][NUM_WARPS][D]

  // 1. The n query rows to shared memory.
  const scalar_t* q_rows = q + ((long long)seq * num_heads + head0) * HEAD_SIZE;
  for (int i = threadIdx.x; i < n * HEAD_SIZE; i += NUM_THREADS)
    q_s[i / HEAD_SIZE][i % HEAD_SIZE] = to_float(q_rows[i]);
  __syncthreads();

  // 2. Logits of all n heads: each 16-byte piece of a key is loaded once and used n times.
  //    `g < n` is the same in every thread of the block, so every lane of a warp reaches the
  //    same shuffles and every thread the same barriers. The loops over g run to the constant
  //    GROUP and skip g >= n, so that they unroll and qk_max[], dot[] and acc[] stay in
  //    registers (an array indexed by a run-time value would live in slow local memory).
  const int* table = block_tables + (long long)seq * max_num_blocks_per_seq;
  float qk_max[GROUP];
  for (int g = 0; g < GROUP; g++) qk_max[g] = MP_NEG_INFINITY;
  for (int b = start_block + warp; b < end_block; b += NUM_WARPS) {
    const long long physical_block = table[b];
    MP_TRACE("warp reads K of logical block", b);
    const scalar_t* k_block =
        k_cache + (physical_block * num_kv_heads + kv_head) * (BLOCK_SIZE * HEAD_SIZE);
    for (int t = group; t < BLOCK_SIZE; t += NUM_GROUPS) {
      const scalar_t* k_row = k_block + t * HEAD_SIZE;
      float dot[GROUP];
      for (int g = 0; g < GROUP; g++) dot[g] = 0.f;
      for (int i = 0; i < VECS_PER_LANE; i++) {
        const int d0 = (i * THREAD_GROUP_SIZE + group_lane) * VEC;
        const Vec<scalar_t, VEC> k_vec = *reinterpret_cast<const Vec<scalar_t, VEC>*>(k_row + d0);
        for (int e = 0; e < VEC; e++) {
          const float k = to_float(k_vec.v[e]);
          for (int g = 0; g < GROUP; g++)
            if (g < n) dot[g] += q_s[g][d0 + e] * k;
        }
      }
      const int token = b * BLOCK_SIZE + t;
#pragma unroll
      for (int g = 0; g < GROUP; g++) {
        if (g >= n) continue;
        for (int mask = THREAD_GROUP_SIZE / 2; mask >= 1; mask /= 2)
          dot[g] += __shfl_xor_sync(FULL_MASK, dot[g], mask);
        // slots past seq_len in the last block hold garbage (maybe NaN): computed, never kept
        if (group_lane == 0 && token < seq_len) {
          const float logit = dot[g] * scale;
          logits[g * stride + token - start_token] = logit;
          qk_max[g] = fmaxf(qk_max[g], logit);
        }
      }
    }
  }

  // 3. The max of each head over the block: shuffles within each warp, then across warps
  //    through shared memory (the barrier also publishes every warp's logits).
#pragma unroll
  for (int g = 0; g < GROUP; g++) {
    if (g >= n) continue;
    const float m = warp_max(qk_max[g]);
    if (lane == 0) max_s[g][warp] = m;
  }
  __syncthreads();

  // 4. Exponentials, in place, and their sums per head. (From here on the per-head values live
  //    in shared memory, not in register arrays: a loop over g that holds a barrier or runs to
  //    the run-time n may not be unrolled, and then a register array indexed by g would go to
  //    local memory, which ptxas reports as a stack frame.)
  for (int g = 0; g < n; g++) {
    const float m = head_max<NUM_WARPS>(max_s[g]);
    float s = 0.f;
    for (int i = threadIdx.x; i < num_tokens; i += NUM_THREADS) {
      const float e = expf(logits[g * stride + i] - m);
      logits[g * stride + i] = e;
      s += e;
    }
    s = warp_sum(s);
    if (lane == 0) sum_s[g][warp] = s;
  }
  __syncthreads();  // the exponentials and the warps' sums are now visible

  // 5. The weighted sums of V: each value element is loaded once and used n times.
  float acc[GROUP][DIMS_PER_LANE];
  for (int g = 0; g < GROUP; g++)
    for (int j = 0; j < DIMS_PER_LANE; j++) acc[g][j] = 0.f;
  for (int b = start_block + warp; b < end_block; b += NUM_WARPS) {
    const long long physical_block = table[b];
    const scalar_t* v_block =
        v_cache + (physical_block * num_kv_heads + kv_head) * (BLOCK_SIZE * HEAD_SIZE);
    const int tokens_here = imin(BLOCK_SIZE, seq_len - b * BLOCK_SIZE);
    for (int t = 0; t < tokens_here; t++) {
      const int i = b * BLOCK_SIZE + t - start_token;
      for (int j = 0; j < DIMS_PER_LANE; j++) {
        if (j * WARP_SIZE + lane >= HEAD_SIZE) continue;  // D=16 only
        const float v = to_float(v_block[t * HEAD_SIZE + j * WARP_SIZE + lane]);
        for (int g = 0; g < GROUP; g++)
          if (g < n) acc[g][j] += logits[g * stride + i] * v;
      }
    }
  }

  // 6. Combine the warps' partial outputs in a fixed order, as v1 does. The logits are no
  //    longer needed, so their buffer holds the partial outputs [n][NUM_WARPS][D] (the
  //    launcher sizes it for both).
  __syncthreads();
  float* partial = logits;
#pragma unroll
  for (int g = 0; g < GROUP; g++) {
    if (g >= n) continue;
    for (int j = 0; j < DIMS_PER_LANE; j++)
      if (j * WARP_SIZE + lane < HEAD_SIZE)
        partial[(g * NUM_WARPS + warp) * HEAD_SIZE + j * WARP_SIZE + lane] = acc[g][j];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n * HEAD_SIZE; i += NUM_THREADS) {
    const int g = i / HEAD_SIZE, d = i % HEAD_SIZE;
    float s = 0.f, total = 0.f;
    for (int w = 0; w < NUM_WARPS; w++) s += partial[(g * NUM_WARPS + w) * HEAD_SIZE + d];
    for (int w = 0; w < NUM_WARPS; w++) total += sum_s[g][w];
    s *= 1.f / total;
    const long long row = (long long)seq * num_heads + head0 + g;
    if (PARTITION_SIZE == 0)
      store(out + row * HEAD_SIZE + d, s);
    else
      tmp_out[(row * max_num_partitions + partition) * HEAD_SIZE + d] = s;
    if (PARTITION_SIZE > 0 && d == 0) {
      max_logits[row * max_num_partitions + partition] = head_max<NUM_WARPS>(max_s[g]);
      exp_sums[row * max_num_partitions + partition] = total;
    }
  }
}

}  // namespace mp
