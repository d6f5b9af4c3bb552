// common.cuh: the few lines that let one kernel text compile three ways.
//
//   nvcc          (the `nvcc -ptx` check):      real CUDA, __half from <cuda_fp16.h>
//   NVRTC (CuPy)  (backend="cupy", on a GPU):   real CUDA, no system headers, so a two-line __half
//   g++           (backend="cpu", the harness): cuda_emu.h emulates the CUDA execution model
//
// Both CUDA compilers define __CUDACC__; NVRTC also defines __CUDACC_RTC__. Everything a kernel
// needs beyond plain CUDA is spelled with an MP_ macro defined here for each compiler.
#pragma once

#if defined(__CUDACC__)

#if defined(__CUDACC_RTC__) || defined(MP_OWN_HALF)
// NVRTC cannot include <cuda_fp16.h> unless given the toolkit's include path (CuPy's wheels may
// not ship it). The kernels need only the type and two conversions, which are single PTX
// instructions (round-to-nearest-even, like the emulated ones). MP_OWN_HALF lets the nvcc
// check compile this branch too.
struct __align__(2) __half {
  unsigned short __x;
};
__device__ __forceinline__ float __half2float(__half h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.__x));
  return f;
}
__device__ __forceinline__ __half __float2half(float f) {
  __half h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.__x) : "f"(f));
  return h;
}
#else
#include <cuda_fp16.h>
#endif

// extern __shared__: memory sized at launch time (the third <<<...>>> argument)
#define MP_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
// trace points cost nothing on a GPU
#define MP_TRACE(what, value) ((void)0)
#define MP_NEG_INFINITY __int_as_float(0xff800000)

#else  // g++ with the emulation header

#include "cuda_emu.h"
#define MP_DYNAMIC_SHARED(name) EMU_DYNAMIC_SHARED(name)
#define MP_TRACE(what, value) EMU_TRACE(what, value)
#define MP_NEG_INFINITY (-INFINITY)

#endif

namespace mp {

constexpr int WARP_SIZE = 32;
constexpr unsigned FULL_MASK = 0xffffffffu;

// Storage type -> float for arithmetic, and back. All arithmetic is float32 (fp32 accumulation),
// whatever the storage type: 2048 fp16 additions would lose about 11 bits.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half(v); }

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

// N elements loaded or stored as one unit: with sizeof(T) * N == 16 the GPU moves them with a
// single 16-byte instruction (ld.global.v4). The address must be a multiple of 16 bytes:
// checks.py checks that both caches start 16-byte aligned, and offsets are multiples of N.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

// Sum of `v` over the whole warp, the same value in every lane. Butterfly (xor) order: lane l
// adds lane l^16, then l^8, ... so after 5 steps every lane holds the total, with the same
// rounding in every lane.
__device__ __forceinline__ float warp_sum(float v) {
  for (int mask = WARP_SIZE / 2; mask >= 1; mask /= 2) v += __shfl_xor_sync(FULL_MASK, v, mask);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int mask = WARP_SIZE / 2; mask >= 1; mask /= 2)
    v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, mask));
  return v;
}

// The max of NUM_WARPS per-warp maxima posted in shared memory, read in a fixed order by every
// thread (so every thread gets the same bits). The second half of a block-wide max.
template <int NUM_WARPS>
__device__ __forceinline__ float head_max(const float* per_warp) {
  float m = per_warp[0];
  for (int w = 1; w < NUM_WARPS; w++) m = fmaxf(m, per_warp[w]);
  return m;
}

}  // namespace mp
