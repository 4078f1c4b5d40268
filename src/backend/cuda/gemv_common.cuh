// Pieces shared by the decode GEMV files (gemv_rows.cuh, moe_w4a4.cu): the streaming weight load,
// the L2 prefetch of a block's first weights, and the opt-in for dynamic shared memory.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {

// 16 bytes of weights read once: through the non-coherent path, not kept in L1.
__device__ __forceinline__ uint4 ld_stream16(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Asks L2 to fetch the first bytes of [p, p + n) (the block's weights) while the block computes its
// prologue, so the weight stream starts at once instead of after the activation quantization. At
// most 64 KB per call: about what HBM delivers to one SM during a prologue, and ~132 blocks' worth
// stays well inside the 50 MB L2 (a whole 5 MB lm_head block would evict itself).
__device__ __forceinline__ void prefetch_l2(const uint8_t* p, int64_t n) {
  n = min(n, static_cast<int64_t>(64 * 1024));
  for (int64_t off = static_cast<int64_t>(threadIdx.x) * 128; off < n; off += static_cast<int64_t>(blockDim.x) * 128)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
}

// Copies n bytes (a multiple of 16, both pointers 16-byte aligned) from global to shared memory with
// the whole block, four 16-byte loads per thread issued before their stores (one L2 round trip per
// four granules instead of one each).
__device__ __forceinline__ void stage_to_shared(void* dst, const void* src, int64_t n) {
  const uint4* s = static_cast<const uint4*>(src);
  uint4* d = static_cast<uint4*>(dst);
  const int64_t n16 = n / 16, nt = blockDim.x;
  for (int64_t g0 = threadIdx.x; g0 < n16; g0 += 4 * nt) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (g0 + u * nt < n16) v[u] = s[g0 + u * nt];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (g0 + u * nt < n16) d[g0 + u * nt] = v[u];
  }
}

// Dynamic shared memory above the default 48 KB is opt-in per kernel; each instantiation remembers
// the most it has been allowed (host-side only, so this is safe inside a stream capture).
template <class Kernel>
void allow_smem(Kernel k, int64_t bytes, int64_t& allowed) {
  if (bytes > 40 * 1024 && bytes > allowed) {  // the static arrays count against the 48 KB too
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    allowed = bytes;
  }
}

// Shared memory one block may hold: the device's opt-in limit (227 KB on sm_90 / sm_100, 99 KB on
// sm_120) less room for the static arrays, at most 200 KB.
inline int64_t smem_budget() {
  static const int64_t budget = [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return std::min<int64_t>(200 * 1024, static_cast<int64_t>(optin) - 1024);
  }();
  return budget;
}

}  // namespace sparkserve
