// planted_oob.cu: a deliberate out-of-bounds read, compiled only into the sanitizer test's
// build of the CPU harness (tests/test_cuda_sanitize.py), never into the package.
//
// A sanitizer run that reports nothing proves nothing unless the sanitizer is watching code
// that runs under the harness's fibers. This kernel walks a block table the way the attention
// kernels do, but thread 0 of the last block reads one entry past the table's end; ASan must
// stop the process with a heap-buffer-overflow naming this kernel.
#include "common.cuh"

namespace mp {

__global__ void planted_oob_kernel(const int* __restrict__ block_tables,  // [S, MB]
                                   int max_num_blocks_per_seq, int* __restrict__ out) {
  const int seq = blockIdx.x;
  int sum = 0;
  for (int i = threadIdx.x; i < max_num_blocks_per_seq; i += blockDim.x)
    sum += block_tables[seq * max_num_blocks_per_seq + i];
  if (threadIdx.x == 0 && seq == (int)gridDim.x - 1)  // the planted bug: one past the end
    sum += block_tables[(seq + 1) * max_num_blocks_per_seq];
  __syncthreads();
  if (threadIdx.x == 0) out[seq] = sum;
}

}  // namespace mp

extern "C" __attribute__((visibility("default"))) int mp_planted_oob(const int* block_tables,
                                                                      int num_seqs, int mb,
                                                                      int* out) {
  return emu::launch(dim3(num_seqs), dim3(128), 0,
                     [&] { mp::planted_oob_kernel(block_tables, mb, out); });
}
