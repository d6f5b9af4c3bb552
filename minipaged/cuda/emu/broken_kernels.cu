// broken_kernels.cu: small kernels that are wrong on purpose, one bug each, so that the tests and
// lesson 08 can show what the CPU harness catches instead of hanging. Every one of these bugs
// can hang or silently corrupt a real GPU (undefined behaviour in CUDA's rules).
//
//   which = 0  correct: a warp sum by shuffles and a block sum through shared memory
//   which = 1  a barrier inside a branch: even and odd threads wait at different __syncthreads()
//   which = 2  a shuffle inside a branch: lanes of one warp reach different shuffles
//   which = 3  the last thread returns early while the others wait for it at a barrier
//   which = 4  half of warp 1 waits at a shuffle that needs the other half, which waits at a
//              barrier that needs the first half: nobody can move
//   which = 5  a shuffle with a partial mask (only the low 16 lanes)
//   which = 6  thread 0 returns early; the others then reach a barrier it will never reach
//   which = 7  lane 31 returns early while its warp waits for it at a shuffle
#include "common.cuh"

namespace mp {

__device__ void broken_kernel(int which, float* out) {
  __shared__ float partial[32];
  const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
  const int num_warps = (blockDim.x + WARP_SIZE - 1) / WARP_SIZE;
  float v = (float)(tid + 1);
  if (which == 1) {
    if (tid % 2 == 0) {
      __syncthreads();
    } else {
      __syncthreads();
    }
  }
  if (which == 2) {
    if (lane < 16) v += __shfl_xor_sync(FULL_MASK, v, 1);
    else v += __shfl_xor_sync(FULL_MASK, v, 2);
  }
  if (which == 4) {
    if (warp == 1 && lane >= 16) v += __shfl_xor_sync(FULL_MASK, v, 1);
    __syncthreads();
  }
  if (which == 5) v = __shfl_xor_sync(0x0000ffffu, v, 1);
  if (which == 7 && tid == 31) return;
  v = warp_sum(v);
  if (lane == 0) partial[warp] = v;
  if (which == 3 && tid == (int)blockDim.x - 1) return;
  if (which == 6 && tid == 0) return;
  __syncthreads();
  if (tid == 0) {
    float total = 0.f;
    for (int w = 0; w < num_warps; w++) total += partial[w];
    out[blockIdx.x] = total;
  }
}

}  // namespace mp
