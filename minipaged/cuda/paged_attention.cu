// paged_attention.cu: decode attention that reads K and V through block tables, on a GPU.
//
// Where this sits: the last stage of the course. minipaged/paged/paged_attention.py computes the
// same thing in NumPy; version 0 is its method="online" in C, and versions 1-4 here walk the same
// block table with CUDA threads but keep the logits in shared memory. Paper: vLLM (Kwon et al.,
// SOSP 2023) section 4.1 and Fig. 18a; GQA: Ainslie et al., EMNLP 2023. The climb is three files:
// paged_attention_v0.cu (version 0, read it first), this one (versions 1 to 4),
// paged_attention_reduce.cu (the partitions' merge). Read next: paged_attention_reduce.cu, then
// cache_kernels.cu and kernels.py.
//
// Compile (the same text, three compilers; common.cuh has the few lines that differ):
//   nvcc   python -c "from minipaged.cuda import kernels; print(kernels.nvcc_source())" > k.cu
//          nvcc -ptx -arch=sm_90 -std=c++17 -I minipaged/cuda k.cu     (tests/test_cuda_nvcc.py)
//   NVRTC  python -m minipaged.cuda.report   (CuPy's own compiler for sm_90, no GPU needed:
//          registers, spills, shared memory per kernel; tests/test_cuda_nvrtc.py)
//   g++    the CPU harness, minipaged/cuda/emu/ (backend="cpu"; what CI runs the kernels on)
// Run: lessons/08_gpu_kernel.py (CPU harness), `minipaged gpu-check` (on a GPU).
//
// The versions climb, as in llm.c's dev/cuda files; every one is checked against the float64
// reference, the NumPy oracle and v0 (tests/test_cuda_cpu.py). The verdicts come from the code
// and the napkin math below: none has been timed on a GPU yet (`minipaged gpu-check` does).
//   v0  one thread per (sequence, head): the online softmax of attention.py in registers.
//       Obviously right, hopelessly slow: S*H threads (a few warps for a decode batch), each
//       reading K D/32 times, nothing coalesced. The reference for the rest.
//   v1  one thread block (128 threads) per (head, sequence): logits in shared memory, lanes share a
//       token's q.k: vLLM's grid and thread groups (csrc/attention/attention_kernels.cuh). V is
//       read with lane = output dimension, minipaged's own pass for its [BS, D] V layout (vLLM
//       loads vectors of tokens and shuffles). Limits: S*H blocks; the longest sequence's logits in
//       shared memory (about 58K tokens at most on an H100/H200).
//   v2  v1 per partition of 512 tokens, one block per (head, sequence, partition), plus a
//       reduce kernel: more blocks for long contexts and few sequences, fixed shared memory.
//   v3  v1 with one block per (KV head, sequence) computing all G = H/Hkv query heads that
//       share it (up to GROUP = 8 per block): a lane loads a piece of a key once and uses it G
//       times, a value element likewise. Costs G times the logits' shared memory.
//   v4  v3 per partition, plus v2's reduce: expected to be the fastest under GQA.
// v1..v4 are one kernel template: GROUP = 1 is vLLM's one block per query head, GROUP = 8 the
// grouped one. Which runs (checks.choose_version): v3/v4 whenever H > Hkv, else v1/v2; single
// pass or partitioned by vLLM's rule (v0 releases, vllm/attention/ops/paged_attn.py): single when
// max_seq_len <= 8192 and (one partition, or more than 512 thread blocks). A caller may force
// any version.
//
// Napkin math (decode, S=32, H=32, Hkv=8, G=4, D=128, fp16, context 4096, an H200):
//   unique K and V: 2 * S * Hkv * ctx * D * 2 B = 537 MB (query and output: 0.5 MiB). At the
//   H200's 4.8 TB/s (NVIDIA's datasheet; a device-to-device copy reaches somewhat less) that is
//   ~0.11-0.13 ms. Arithmetic: 2 (q.k, p.v) * S*H*ctx*D * 2 FLOP = 2.1 GFLOP, 4 FLOP per byte;
//   the fp32 cores need ~14 FLOP/byte (67 TFLOP/s / 4.8 TB/s, same datasheet) to be the limit.
//   So decode attention is bandwidth-bound: the figure of merit is K/V bytes per second.
//   v1/v2 pull every K/V byte through L2 once per query head that shares it: 4 x 537 MB =
//   2.15 GB of L2 traffic for 537 MB from DRAM, estimated to cap them near 40-60% of copy
//   bandwidth (an estimate; gpu-check measures it). v3/v4 pull each byte once. v4's grid: 8 KV
//   heads * 32 sequences * 8 partitions = 2048 blocks, ~15 per SM of the H200's 132.
//
// Choices a learner will ask about:
//   - 128 threads (4 warps), as vLLM: enough warps to hide memory latency, cheap cross-warp
//     reductions, room for several blocks per SM.
//   - A "thread group" per token's q.k: with BS=16, two lanes share a token (32 / BS), each
//     doing half of the D products, then one shuffle. A whole warp per token would need 5
//     shuffles per token; one lane per token would make each lane's loads long and strided.
//   - The plain [NB, Hkv, BS, D] layout, not vLLM's x-packed key cache [NB, Hkv, D/x, BS, x]:
//     one layout for NumPy and CUDA, K and V alike, so that key_cache[block, head, slot] is a
//     token's key. The kernel compensates with neighbouring 16-byte loads per thread group
//     (whole 32-byte sectors per warp load for BS <= 16; at BS=32 each lane reads half a
//     sector) and lane-per-dimension V reads (coalesced here).
//   - Logits in shared memory: the softmax needs their max before any exponential; keeping
//     them on chip avoids a second pass over K.
//   - float32 inside: fp16 has 11 significant bits; sums over thousands of tokens need more.
//   - Not tried yet: 16-byte V loads along D (8 half values of a V row per lane).
#include "common.cuh"

namespace mp {

// Versions 1-4: one thread block computes up to GROUP query heads (all sharing KV head
// `kv_head`) of one sequence (of one partition: v2, v4). Grid: (Hkv * ceil(G / GROUP), S, P),
// which for GROUP = 1 (v1, v2) is (H, S, P): one block per query head, vLLM's design.
// Dynamic shared memory: logits [min(G, GROUP)][stride] as float, stride = this sequence's
// length rounded up to BS (single pass; the buffer is sized for the longest) or PARTITION_SIZE,
// and at least NUM_WARPS * D (the buffer is reused for the warps' partial outputs at the end).
//
// __launch_bounds__(NUM_THREADS, 4): a register budget for ptxas, at least 4 blocks (16 warps)
// per SM, so at most 128 registers per thread. Without a stated minimum NVRTC 12.9's ptxas kept
// 32-72 registers and spilled in 13 of the 72 instantiations; with a minimum of 5 or more it
// still spilled in some; with 4 none spills, at 52-122 registers (GROUP = 1) and 71-96
// (GROUP = 8). Measured with python -m minipaged.cuda.report.
template <typename scalar_t, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS, int GROUP,
          int PARTITION_SIZE>
__global__ void __launch_bounds__(NUM_THREADS, 4) paged_attention_kernel(
    scalar_t* __restrict__ out,               // [S, H, D]        single pass: the answer
    float* __restrict__ exp_sums,             // [S, H, P]        partitioned: sum of exp(l - max)
    float* __restrict__ max_logits,           // [S, H, P]        partitioned: max logit
    float* __restrict__ tmp_out,              // [S, H, P, D]     partitioned: partial output
    const scalar_t* __restrict__ q,           // [S, H, D]
    const scalar_t* __restrict__ k_cache,     // [NB, Hkv, BS, D]
    const scalar_t* __restrict__ v_cache,     // [NB, Hkv, BS, D]
    const int* __restrict__ block_tables,     // [S, MB]
    const int* __restrict__ seq_lens,         // [S]
    int num_heads, int num_kv_heads, int max_num_blocks_per_seq, int max_num_partitions,
    float scale) {
  constexpr int NUM_WARPS = NUM_THREADS / WARP_SIZE;
  // lanes that share one token's dot product, and how many tokens a warp has in flight
  constexpr int THREAD_GROUP_SIZE = (WARP_SIZE / BLOCK_SIZE) > 1 ? WARP_SIZE / BLOCK_SIZE : 1;
  constexpr int NUM_GROUPS = WARP_SIZE / THREAD_GROUP_SIZE;
  // Elements per vector load: 16 bytes (4 float, 8 half), unless a group's share of one key
  // row is smaller than that. Small heads (D=16, the shipped tiny model) are the case: with
  // BS=8 four lanes share a row, and a D=16 fp16 row is only 32 bytes, so each lane loads
  // 8 bytes (4 half). The warp still reads its 8 rows x 32 B = 256 contiguous bytes in one go,
  // so the loads stay coalesced; only the per-lane instruction is narrower. (Fewer lanes per
  // row would leave whole groups without a token, and then not every lane would reach the
  // shuffle below.) fp32 D=16 and every D >= 64 keep full 16-byte loads.
  constexpr int VEC16 = 16 / (int)sizeof(scalar_t);
  constexpr int VEC = HEAD_SIZE / THREAD_GROUP_SIZE < VEC16 ? HEAD_SIZE / THREAD_GROUP_SIZE
                                                            : VEC16;
  constexpr int VECS_PER_LANE = HEAD_SIZE / (THREAD_GROUP_SIZE * VEC);  // of one q.k
  // Output dimensions per lane, rounded up: with D < 32 (D=16) lanes D..31 own none and sit
  // out the V pass (half the warp idle: a price only the tiny model pays).
  constexpr int DIMS_PER_LANE = (HEAD_SIZE + WARP_SIZE - 1) / WARP_SIZE;
  static_assert(NUM_THREADS % WARP_SIZE == 0, "whole warps only");
  static_assert(HEAD_SIZE % WARP_SIZE == 0 || HEAD_SIZE < WARP_SIZE,
                "lane l owns output dimensions l, l+32, ...: D a multiple of 32, or below 32");
  static_assert(PARTITION_SIZE % BLOCK_SIZE == 0, "a partition is a whole number of KV blocks");
  static_assert(VEC >= 1 && (VEC & (VEC - 1)) == 0, "vector width: a power of two elements");
  static_assert(HEAD_SIZE % (THREAD_GROUP_SIZE * VEC) == 0, "whole vector loads per lane");

  const int group_size = num_heads / num_kv_heads;               // G
  const int chunks = (group_size + GROUP - 1) / GROUP;           // blocks per KV head
  const int kv_head = blockIdx.x / chunks;
  const int head0 = kv_head * group_size + (blockIdx.x % chunks) * GROUP;  // first query head
  const int n = imin(GROUP, kv_head * group_size + group_size - head0);     // heads here
  const int seq = blockIdx.y, partition = blockIdx.z;
  const int seq_len = seq_lens[seq];
  // partitions past this sequence's end have nothing to do. The whole block returns
  // together, before any barrier, which is allowed (no thread waits for another).
  if (PARTITION_SIZE > 0 && partition * PARTITION_SIZE >= seq_len) return;

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

  // 2. Logits q.k * scale. Warps take the logical KV blocks in turn (warp w: blocks w, w+4,
  //    ...); inside a block each thread group takes one token. Only entries < num_seq_blocks
  //    of the block table are read: entries past a sequence's length may hold anything.
  //    Each 16-byte piece of a key is loaded once and used for all n heads.
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
      // Each lane loads 16 bytes at a time, and the lanes of a group take neighbouring 16-byte
      // pieces of the row, so one warp-wide load reads whole 32-byte memory sectors (with
      // BS=16: 16 rows x 2 lanes x 16 B; at BS=32 a group is one lane, half a sector). vLLM gets
      // whole sectors at every block size from its x-packed layout.
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

  // 4. Exponentials, in place, and their sums per head. Subtracting the max keeps expf <= 1.
  //    (From here on the per-head values live in shared memory, not in register arrays: a loop over
  //    g that holds a barrier or runs to the run-time n may not be unrolled, and then a register
  //    array indexed by g would go to local memory, which ptxas reports as a stack frame.)
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

  // 5. The weighted sums of V. Lane l owns output dimensions l, l+32, ...: a warp reads a
  //    token's V row as consecutive addresses (one coalesced transaction per 32 elements).
  //    Only tokens < seq_len are read (0 * NaN would still be NaN). Each value element is
  //    loaded once and used for all n heads.
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

  // 6. Combine the warps' partial outputs in a fixed order (warp 0 + 1 + 2 + 3), so the
  //    result does not depend on which warp finished first, nor on where the blocks live. The
  //    logits are no longer needed: their buffer holds the partials [n][NUM_WARPS][D].
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
