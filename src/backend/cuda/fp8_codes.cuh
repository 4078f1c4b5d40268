// The W8A8 activation codes as the tensor-core paths take them (tc_gemm.h fp8_quantize_rows_f16):
// device helpers shared by the quantization kernels and the producers that quantize their own
// output (fp8_gemm.cu, norm.cu).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/tc_gemm.h"

namespace sparkserve {

// Two E4M3 codes (low 16 bits) -> f16x2, exact (one instruction; the mma.sync / wgmma A fragments).
__device__ __forceinline__ uint32_t e4m3x2_f16x2(uint32_t v) {
  uint32_t h;
  asm("{.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, lo;}" : "=r"(h) : "r"(v));
  return h;
}
// Word s (0..3) of 16 loaded bytes of codes: a lane's four codes of k16 step s.
__device__ __forceinline__ uint32_t code_word(const uint4& v, int s) {
  return s == 0 ? v.x : s == 1 ? v.y : s == 2 ? v.z : v.w;
}
// Four E4M3 codes (one word) as their f16 values (exact), codes 0, 1 in .x.
__device__ __forceinline__ uint2 f16x4_of(uint32_t codes) {
  const __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes & 0xffffu), __NV_E4M3);
  const __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes >> 16), __NV_E4M3);
  return make_uint2(static_cast<uint32_t>(lo.x) | (static_cast<uint32_t>(lo.y) << 16),
                    static_cast<uint32_t>(hi.x) | (static_cast<uint32_t>(hi.y) << 16));
}
// fp8(v / s) of four values, saturating, round to nearest even: four E4M3 codes, v.x in the low byte.
__device__ __forceinline__ uint32_t codes4(float4 v, float s) {
  const uint32_t lo =
      __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(v.x, s), __fdiv_rn(v.y, s)), __NV_SATFINITE, __NV_E4M3);
  const uint32_t hi =
      __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(v.z, s), __fdiv_rn(v.w, s)), __NV_SATFINITE, __NV_E4M3);
  return lo | (hi << 16);
}
// The f16 values of the codes of x's k .. k + 3 (k % 4 == 0) into a row in the k order kOrder.
template <Fp8CodeOrder kOrder>
__device__ __forceinline__ void store_codes4(__half* row, int64_t k, uint32_t codes) {
  const uint2 h = f16x4_of(codes);
  if constexpr (kOrder == Fp8CodeOrder::kNatural) {
    *reinterpret_cast<uint2*>(row + k) = h;
  } else {  // codes k, k+1 and k+2, k+3 are two pairs of the wgmma order
    const int64_t p = fp8_code_pos(k);
    *reinterpret_cast<uint32_t*>(row + p) = h.x;
    *reinterpret_cast<uint32_t*>(row + p + 8) = h.y;
  }
}
// The max of |v| over a block of kThreads threads (max is order-free: the same value whatever the
// split). Its barrier also orders the block's shared-memory writes before it against reads after.
template <int kThreads>
__device__ float block_amax(float amax) {
  __shared__ float red[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) amax = fmaxf(amax, red[w]);
  return amax;
}

// fp8_reduce_splits's value of kE elements: acc[e] = Σ_k part[k · stride + at[e]] in split order from
// 0, then · scale[e], for the elements with ok[e] (the others get 0). The loads of four splits of all
// kE elements are issued together: a loop over a run-time split count with one load and add per
// step waits for each load before the next.
template <int kE>
__device__ __forceinline__ void split_sums(float (&acc)[kE], const float* part, int splits, int64_t stride,
                                           const int64_t (&at)[kE], const bool (&ok)[kE], const float (&scale)[kE]) {
#pragma unroll
  for (int e = 0; e < kE; ++e) acc[e] = 0.0f;
  for (int k0 = 0; k0 < splits; k0 += 4) {
    float v[4][kE];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < kE; ++e) v[j][e] = k0 + j < splits && ok[e] ? part[(k0 + j) * stride + at[e]] : 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (k0 + j < splits)
#pragma unroll
        for (int e = 0; e < kE; ++e) acc[e] += v[j][e];
  }
#pragma unroll
  for (int e = 0; e < kE; ++e) acc[e] = ok[e] ? acc[e] * scale[e] : 0.0f;
}

}  // namespace sparkserve
