// paged_attention.cu: decode attention that reads K and V through block tables, on a GPU.
//
// Where this sits: the last stage of the course (contiguous cache -> block table -> sharing ->
// scheduling -> GPU kernel). minipaged/paged/paged_attention.py computes the same thing in NumPy
// with method="online"; this file is that walk over the block table, written for CUDA threads.
// Paper: vLLM (Kwon et al., SOSP 2023) section 4.1 "PagedAttention" and Fig. 18a (kernel cost).
// Read next: gqa_attention.cu (versions 3 and 4), cache_kernels.cu, then launch.py.
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
// reference and the NumPy oracle (tests/test_cuda_cpu.py), v1..v4 also against v0. Verdicts are
// from reading the code and the napkin math below: none has been timed on a GPU yet
// (`minipaged gpu-check` does that and writes the figures to a JSON report).
//   v0  one thread per (sequence, head), the online softmax of attention.py in registers.
//       Obviously right, hopelessly slow: S*H threads (a few warps for a decode batch), each
//       reading its KV head's K D/32 times and nothing coalesced. The reference for the rest.
//   v1  one thread block (128 threads) per (head, sequence); logits in shared memory; lanes
//       share each token's q.k, V read with lane = output dimension. vLLM's design (csrc/
//       attention/attention_kernels.cuh). Limit: S*H blocks, and logits of the longest
//       sequence in shared memory (about 57K tokens at most on an H100).
//   v2  v1 cut into partitions of 512 tokens, one block per (head, sequence, partition), plus a
//       reduce kernel. More blocks for long contexts and few sequences; fixed shared memory.
//   v3, v4 (gqa_attention.cu): v1, v2 with one block per KV head computing all of its H/Hkv
//       query heads from each K/V load: under GQA every K/V byte crosses L2 once, not H/Hkv times.
// Which one runs: checks.choose_version, vLLM's rule (vllm/attention/ops/paged_attn.py): the
// single pass when max_seq_len <= 8192 and (one partition, or more than 512 thread blocks);
// else partitioned. The grouped pair whenever H > Hkv. A caller can force any version.
//
// Napkin math (decode, S=32, H=32, Hkv=8, D=128, fp16, context 4096, an H200):
//   unique K and V: 2 * S * Hkv * ctx * D * 2 B = 2*32*8*4096*128*2 = 537 MB (query and output
//   are 0.5 MiB: negligible). At the H200's 4.8 TB/s (NVIDIA's datasheet; a device-to-device
//   copy reaches somewhat less) that is ~0.11-0.13 ms per call. The arithmetic is 2 (q.k and
//   p.v) * S*H*ctx*D * 2 FLOP = 2.1 GFLOP: 4 FLOP per byte, while the fp32 CUDA cores need ~14
//   FLOP per byte (67 TFLOP/s / 4.8 TB/s, same datasheet) to become the limit. Decode attention
//   is bandwidth-bound; the figure of merit is K/V bytes read per second over a copy's.
//   v1/v2 read each KV head's bytes once per query head that shares it: 4 x 537 MB = 2.15 GB
//   through L2. L2 (tens of MB) serves most repeats, so DRAM sees ~1x, but the 4x L2 traffic is
//   estimated to cap v1/v2 near 40-60% of copy bandwidth (an estimate: gpu-check measures it).
//   v3/v4 remove the 4x.
//
// Choices a learner will ask about:
//   - Why 128 threads (4 warps)? Enough warps per block to hide memory latency while other
//     blocks share the SM; few enough that the cross-warp reductions stay cheap and a block's
//     registers and shared memory leave room for several blocks per SM. vLLM uses 128 too.
//   - Why a "thread group" for the dot product q.k? A warp handles one KV block at a time. With
//     BS=16 and 32 lanes, two lanes share each token (THREAD_GROUP_SIZE = 32 / BS): each does
//     half of the D multiply-adds, then one shuffle adds the halves. A whole warp per token
//     would need 5 shuffles per token; one lane per token would leave lanes idle (BS=16) and
//     make each lane's loads long and strided.
//   - Why the plain [NB, Hkv, BS, D] layout and not vLLM's "x-packed" key cache
//     [NB, Hkv, D/x, BS, x] (x = 16 bytes of elements)? The packed layout lets each lane fetch
//     its slice of one token's key as a single 16-byte load, and puts neighbouring tokens'
//     slices next to each other so the warp's loads coalesce. It buys bandwidth at the price of
//     a layout that no NumPy reader can index by eye, and that differs from the value cache.
//     This project keeps ONE layout for NumPy and CUDA, K and V alike, so that a learner can
//     print key_cache[block, head, slot] and see a token's key; the kernel compensates by
//     letting the lanes of a group load neighbouring 16-byte pieces of the same key row (whole
//     memory sectors per warp load) and by reading V with lane = output dimension, which is
//     coalesced in this layout. The price, if any, is what `minipaged gpu-check` measures.
//   - Why logits in shared memory? The softmax needs the max of all logits before any
//     exponential; keeping them on chip avoids a second pass over K.
//   - Why float32 everywhere inside? fp16 has 11 significant bits; a sum over thousands of
//     tokens in fp16 would be wrong in the third digit.
#include "common.cuh"

namespace mp {

// Version 0: one thread computes one query head of one sequence, alone. Grid: (ceil(S*H / NT));
// block: NT threads, thread i of the grid takes row i = seq * H + head. No shared memory, no
// shuffles, no barriers: it is attention.py's online softmax (lesson 01) written in C. A thread
// cannot keep D accumulators in registers for D=128 beside everything else without spilling, so
// it makes D/DIMS passes over the sequence, each producing DIMS output dimensions (and
// recomputing every logit): simple, and slow on purpose.
template <typename scalar_t, int HEAD_SIZE, int BLOCK_SIZE>
__global__ void paged_attention_v0_kernel(
    scalar_t* __restrict__ out,               // [S, H, D]
    const scalar_t* __restrict__ q,           // [S, H, D]
    const scalar_t* __restrict__ k_cache,     // [NB, Hkv, BS, D]
    const scalar_t* __restrict__ v_cache,     // [NB, Hkv, BS, D]
    const int* __restrict__ block_tables,     // [S, MB]
    const int* __restrict__ seq_lens,         // [S]
    int num_seqs, int num_heads, int num_kv_heads, int max_num_blocks_per_seq, float scale) {
  constexpr int DIMS = HEAD_SIZE < 32 ? HEAD_SIZE : 32;  // output dimensions per pass
  const long long row = (long long)blockIdx.x * blockDim.x + threadIdx.x;  // seq * H + head
  if (row >= (long long)num_seqs * num_heads) return;  // the last block's spare threads
  const int seq = (int)(row / num_heads), head = (int)(row % num_heads);
  const int kv_head = head / (num_heads / num_kv_heads);
  const int seq_len = seq_lens[seq];
  const int* table = block_tables + (long long)seq * max_num_blocks_per_seq;
  const scalar_t* q_row = q + row * HEAD_SIZE;

  for (int d0 = 0; d0 < HEAD_SIZE; d0 += DIMS) {
    float m = MP_NEG_INFINITY, l = 0.f, acc[DIMS];  // running max, running sum, output
    for (int j = 0; j < DIMS; j++) acc[j] = 0.f;
    for (int t = 0; t < seq_len; t++) {
      // token t lives in physical block table[t / BS], slot t % BS
      const long long base =
          (((long long)table[t / BLOCK_SIZE] * num_kv_heads + kv_head) * BLOCK_SIZE +
           t % BLOCK_SIZE) * HEAD_SIZE;
      float x = 0.f;
      for (int d = 0; d < HEAD_SIZE; d++) x += to_float(q_row[d]) * to_float(k_cache[base + d]);
      x *= scale;
      // online softmax: rescale what we have when the max grows, then add this token
      const float m_new = fmaxf(m, x);
      const float correction = expf(m - m_new), p = expf(x - m_new);
      l = l * correction + p;
      for (int j = 0; j < DIMS; j++)
        acc[j] = acc[j] * correction + p * to_float(v_cache[base + d0 + j]);
      m = m_new;
    }
    for (int j = 0; j < DIMS; j++) store(out + row * HEAD_SIZE + d0 + j, acc[j] / l);
  }
}

// Versions 1 and 2: one thread block computes one query head of one sequence (of one partition,
// v2). Grid: (H, S, partitions); block: NUM_THREADS threads.
// Dynamic shared memory: the logits of the tokens this block covers, as float
//   (v1: ceil(max seq_len / BS) * BS floats; v2: PARTITION_SIZE floats).
template <typename scalar_t, int HEAD_SIZE, int BLOCK_SIZE, int NUM_THREADS, int PARTITION_SIZE>
__global__ void __launch_bounds__(NUM_THREADS) paged_attention_kernel(
    scalar_t* __restrict__ out,               // [S, H, D]        v1: the answer
    float* __restrict__ exp_sums,             // [S, H, P]        v2: sum of exp(logit - max)
    float* __restrict__ max_logits,           // [S, H, P]        v2: max logit of the partition
    float* __restrict__ tmp_out,              // [S, H, P, D]     v2: the partition's output
    const scalar_t* __restrict__ q,           // [S, H, D]
    const scalar_t* __restrict__ k_cache,     // [NB, Hkv, BS, D]
    const scalar_t* __restrict__ v_cache,     // [NB, Hkv, BS, D]
    const int* __restrict__ block_tables,     // [S, MB]
    const int* __restrict__ seq_lens,         // [S]
    int num_kv_heads, int max_num_blocks_per_seq, int max_num_partitions, float scale) {
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
  // out the V pass (half the warp idle: a price only the tiny model pays). The guard
  // `j * WARP_SIZE + lane < HEAD_SIZE` below is always true, and compiled away, for D >= 32.
  constexpr int DIMS_PER_LANE = (HEAD_SIZE + WARP_SIZE - 1) / WARP_SIZE;
  static_assert(NUM_THREADS % WARP_SIZE == 0, "whole warps only");
  static_assert(HEAD_SIZE % WARP_SIZE == 0 || HEAD_SIZE < WARP_SIZE,
                "lane l owns output dimensions l, l+32, ...: D a multiple of 32, or below 32");
  static_assert(PARTITION_SIZE % BLOCK_SIZE == 0, "a partition is a whole number of KV blocks");
  static_assert(VEC >= 1 && (VEC & (VEC - 1)) == 0, "vector width: a power of two elements");
  static_assert(HEAD_SIZE % (THREAD_GROUP_SIZE * VEC) == 0, "whole vector loads per lane");

  const int head = blockIdx.x, seq = blockIdx.y, partition = blockIdx.z;
  const int num_heads = gridDim.x;
  const int seq_len = seq_lens[seq];
  // v2: partitions past this sequence's end have nothing to do. The whole block returns
  // together, before any barrier, which is allowed (no thread waits for another).
  if (PARTITION_SIZE > 0 && partition * PARTITION_SIZE >= seq_len) return;

  const int num_seq_blocks = (seq_len + BLOCK_SIZE - 1) / BLOCK_SIZE;
  const int blocks_per_partition = PARTITION_SIZE > 0 ? PARTITION_SIZE / BLOCK_SIZE
                                                      : num_seq_blocks;
  const int start_block = partition * blocks_per_partition;
  const int end_block = imin(start_block + blocks_per_partition, num_seq_blocks);
  const int start_token = start_block * BLOCK_SIZE;
  const int end_token = imin(end_block * BLOCK_SIZE, seq_len);
  const int num_tokens = end_token - start_token;

  const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
  const int group = lane / THREAD_GROUP_SIZE, group_lane = lane % THREAD_GROUP_SIZE;
  const int kv_head = head / (num_heads / num_kv_heads);  // GQA: H/Hkv query heads per KV head

  __shared__ float q_s[HEAD_SIZE];                    // the query, as float, read by every warp
  __shared__ float red_s[2 * NUM_WARPS];              // cross-warp max, then sum
  __shared__ float out_s[NUM_WARPS][HEAD_SIZE];       // each warp's partial output
  MP_DYNAMIC_SHARED(smem);
  float* logits = reinterpret_cast<float*>(smem);     // [num_tokens]

  // 1. The query row to shared memory (every warp reads all of it, many times).
  const scalar_t* q_row = q + ((long long)seq * num_heads + head) * HEAD_SIZE;
  for (int d = threadIdx.x; d < HEAD_SIZE; d += NUM_THREADS) q_s[d] = to_float(q_row[d]);
  __syncthreads();

  // 2. Logits q.k * scale. Warps take the logical KV blocks in turn (warp w: blocks w, w+4, ...);
  //    inside a block each thread group takes one token. Only entries < num_seq_blocks of the
  //    block table are read: entries past a sequence's length may hold anything.
  const int* table = block_tables + (long long)seq * max_num_blocks_per_seq;
  float qk_max = MP_NEG_INFINITY;
  for (int b = start_block + warp; b < end_block; b += NUM_WARPS) {
    const long long physical_block = table[b];
    MP_TRACE("warp reads K of logical block", b);
    const scalar_t* k_block =
        k_cache + (physical_block * num_kv_heads + kv_head) * (BLOCK_SIZE * HEAD_SIZE);
    // every lane makes the same number of trips (NUM_GROUPS divides BLOCK_SIZE or exceeds it
    // by whole groups), so the shuffle below is reached by the full warp together
    for (int t = group; t < BLOCK_SIZE; t += NUM_GROUPS) {
      const scalar_t* k_row = k_block + t * HEAD_SIZE;
      float dot = 0.f;
      // Each lane loads 16 bytes at a time, and the lanes of a group take neighbouring 16-byte
      // pieces of the row, so one warp-wide load reads whole 32-byte memory sectors (with
      // BS=16: 16 rows x 2 lanes x 16 B). vLLM gets the same effect from its x-packed layout.
      for (int i = 0; i < VECS_PER_LANE; i++) {
        const int d0 = (i * THREAD_GROUP_SIZE + group_lane) * VEC;
        const Vec<scalar_t, VEC> k_vec = *reinterpret_cast<const Vec<scalar_t, VEC>*>(k_row + d0);
        for (int e = 0; e < VEC; e++) dot += q_s[d0 + e] * to_float(k_vec.v[e]);
      }
      for (int mask = THREAD_GROUP_SIZE / 2; mask >= 1; mask /= 2)
        dot += __shfl_xor_sync(FULL_MASK, dot, mask);
      const int token = b * BLOCK_SIZE + t;
      // slots past seq_len in the last block hold garbage (maybe NaN): computed, never kept
      if (group_lane == 0 && token < seq_len) {
        const float logit = dot * scale;
        logits[token - start_token] = logit;
        qk_max = fmaxf(qk_max, logit);
      }
    }
  }

  // 3. The max over the block (its barrier also publishes every warp's logits).
  qk_max = block_max<NUM_WARPS>(red_s, qk_max);

  // 4. Exponentials, in place, and their sum. Subtracting the max keeps expf <= 1: no overflow.
  float exp_sum = 0.f;
  for (int i = threadIdx.x; i < num_tokens; i += NUM_THREADS) {
    const float e = expf(logits[i] - qk_max);
    logits[i] = e;
    exp_sum += e;
  }
  exp_sum = block_sum<NUM_WARPS>(red_s + NUM_WARPS, exp_sum);  // barrier: exps now visible
  const float inv_sum = 1.f / exp_sum;

  // 5. The weighted sum of V. Lane l owns output dimensions l, l+32, ...: a warp reads a token's
  //    V row as consecutive addresses (one coalesced transaction per 32 elements). Warps again
  //    take KV blocks in turn; only tokens < seq_len are read (0 * NaN would still be NaN).
  float acc[DIMS_PER_LANE];
  for (int j = 0; j < DIMS_PER_LANE; j++) acc[j] = 0.f;
  for (int b = start_block + warp; b < end_block; b += NUM_WARPS) {
    const long long physical_block = table[b];
    const scalar_t* v_block =
        v_cache + (physical_block * num_kv_heads + kv_head) * (BLOCK_SIZE * HEAD_SIZE);
    const int tokens_here = imin(BLOCK_SIZE, seq_len - b * BLOCK_SIZE);
    for (int t = 0; t < tokens_here; t++) {
      const float w = logits[b * BLOCK_SIZE + t - start_token];
      for (int j = 0; j < DIMS_PER_LANE; j++)
        if (j * WARP_SIZE + lane < HEAD_SIZE)
          acc[j] += w * to_float(v_block[t * HEAD_SIZE + j * WARP_SIZE + lane]);
    }
  }

  // 6. Combine the warps' partial outputs in a fixed order (warp 0 + 1 + 2 + 3), so the result
  //    does not depend on which warp finished first, nor on where the blocks live in memory.
  for (int j = 0; j < DIMS_PER_LANE; j++)
    if (j * WARP_SIZE + lane < HEAD_SIZE) out_s[warp][j * WARP_SIZE + lane] = acc[j];
  __syncthreads();
  const long long row = (long long)seq * num_heads + head;
  for (int d = threadIdx.x; d < HEAD_SIZE; d += NUM_THREADS) {
    float s = 0.f;
    for (int w = 0; w < NUM_WARPS; w++) s += out_s[w][d];
    s *= inv_sum;
    if (PARTITION_SIZE == 0)
      store(out + row * HEAD_SIZE + d, s);
    else
      tmp_out[(row * max_num_partitions + partition) * HEAD_SIZE + d] = s;
  }
  if (PARTITION_SIZE > 0 && threadIdx.x == 0) {
    max_logits[row * max_num_partitions + partition] = qk_max;
    exp_sums[row * max_num_partitions + partition] = exp_sum;
  }
}

// v2's second kernel: combine the partitions of one (head, sequence).
// Partition p computed o_p = sum_t exp(l_t - m_p) v_t / s_p with s_p = sum_t exp(l_t - m_p).
// With M = max_p m_p and w_p = s_p * exp(m_p - M), the full softmax output is
// sum_p w_p o_p / sum_p w_p. Grid: (H, S); dynamic shared memory: P floats (the weights w_p).
template <typename scalar_t, int HEAD_SIZE, int NUM_THREADS, int PARTITION_SIZE>
__global__ void __launch_bounds__(NUM_THREADS) paged_attention_v2_reduce_kernel(
    scalar_t* __restrict__ out,               // [S, H, D]
    const float* __restrict__ exp_sums,       // [S, H, P]
    const float* __restrict__ max_logits,     // [S, H, P]
    const float* __restrict__ tmp_out,        // [S, H, P, D]
    const int* __restrict__ seq_lens,         // [S]
    int max_num_partitions) {
  const int head = blockIdx.x, seq = blockIdx.y, num_heads = gridDim.x;
  const int num_partitions = (seq_lens[seq] + PARTITION_SIZE - 1) / PARTITION_SIZE;
  const long long row = (long long)seq * num_heads + head;
  const float* m = max_logits + row * max_num_partitions;
  const float* s = exp_sums + row * max_num_partitions;
  MP_DYNAMIC_SHARED(smem);
  float* weights = reinterpret_cast<float*>(smem);  // [P]

  // A few dozen partitions at most: every thread scans them all (no reduction tree needed,
  // and every thread sees the same M and the same total, bit for bit).
  float global_max = MP_NEG_INFINITY;
  for (int p = 0; p < num_partitions; p++) global_max = fmaxf(global_max, m[p]);
  for (int p = threadIdx.x; p < num_partitions; p += NUM_THREADS)
    weights[p] = s[p] * expf(m[p] - global_max);
  __syncthreads();
  float total = 0.f;
  for (int p = 0; p < num_partitions; p++) total += weights[p];
  const float inv_total = 1.f / total;
  for (int d = threadIdx.x; d < HEAD_SIZE; d += NUM_THREADS) {
    float acc = 0.f;
    for (int p = 0; p < num_partitions; p++)
      acc += weights[p] * tmp_out[(row * max_num_partitions + p) * HEAD_SIZE + d];
    store(out + row * HEAD_SIZE + d, acc * inv_total);
  }
}

}  // namespace mp
