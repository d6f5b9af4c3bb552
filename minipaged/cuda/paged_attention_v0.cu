// paged_attention_v0.cu: version 0 of the decode attention kernel, the obvious one.
//
// Where this sits: the first step of paged_attention.cu's climb (its opening comment lists the
// versions, the napkin math and the choices). Every faster version is checked against this one
// and the float64 reference (tests/test_cuda_cpu.py). Read next: paged_attention.cu.
#include "common.cuh"

namespace mp {

// Version 0: one thread computes one query head of one sequence, alone. Grid: (ceil(S*H / NT));
// block: NT threads, thread i of the grid takes row i = seq * H + head. No shared memory, no
// shuffles, no barriers: it is attention.py's online softmax (online_step, lesson 03) written in C.
// A thread cannot keep D accumulators in registers for D=128 beside everything else without
// spilling, so it makes D/DIMS passes over the sequence, each producing DIMS output dimensions (and
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

}  // namespace mp
