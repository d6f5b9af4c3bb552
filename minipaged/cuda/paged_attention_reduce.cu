// paged_attention_reduce.cu: the second kernel of the partitioned versions (v2, v4).
//
// Where this sits: after paged_attention.cu, whose partitioned versions leave one partial
// softmax per partition (max logit, sum of exponentials, output) for this kernel to merge.
// Read next: cache_kernels.cu.
#include "common.cuh"

namespace mp {

// The reduce kernel of v2 and v4: combine the partitions of one (head, sequence).
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

  // A few dozen partitions (64 at 32K tokens): every thread scans them all (no reduction tree
  // needed, and every thread sees the same M and the same total, bit for bit).
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
