// Device pieces shared by the attention kernels (attention.cu, attention_prefill.cu,
// attention_decode.cu): the paged KV pool as the kernels see it, the rounding of a row to the pool's
// dtype (the CPU backend's store_row, bit for bit), and the e4m3 widening and shared-memory tile
// layout of the mma.sync kernels (their primitives: mma_primitives.cuh).
//
// Precision of the tensor-core kernels: K and V are exact bf16 values (a bf16 pool holds them; an
// e4m3 code has 4 significant bits, so it is exact in bf16 and its row scale is applied to the
// f32 score / probability instead). In the mma.sync kernels (prefill on every target but sm_90a at
// head_dim 256, decode and verify everywhere) Q and the probabilities P are f32, each split into
// hi = bf16(x) and lo = bf16(x - hi) with both halves through the MMA, so the operand carries ~16
// significant bits (relative error <= 2^-17) and the products accumulate in f32: within ~1e-5 of
// the fp32 reference (gpu_ops attention checks). The sm_90a wgmma prefill kernel
// (attention_prefill_wgmma.cu) takes Q and P as single bf16 operands, as production attention on
// bf16 KV caches does: ~4e-3 of max|out| from the reference, half the MMAs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "backend/cuda/bf16_round.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/mma_primitives.cuh"
#include "backend/cuda/quant_math.cuh"

namespace sparkserve {

// A KvPool (backend/ops.h) as the kernels read it. Row index of (position, kv head):
// (block * block_size + pos % block_size) * kvh + head; element offset = row * hd.
struct KvView {
  void* k = nullptr;
  void* v = nullptr;
  float* k_scale = nullptr;  // fp8 pools only
  float* v_scale = nullptr;
  int64_t block_size = 0, kvh = 0, hd = 0;
};

enum class KvType : int { kF32 = 0, kBf16 = 1, kFp8 = 2 };

__device__ __forceinline__ int64_t kv_row_index(const DeviceLayout& L, int s, int64_t pos, int64_t block_size,
                                                int64_t kvh, int64_t head) {
  const int32_t block = L.table(s)[pos / block_size];
  return (static_cast<int64_t>(block) * block_size + pos % block_size) * kvh + head;
}

// Block-wide (every thread of the block calls it; kThreads = 32: warp-wide, tid = the lane): stores
// row `row` of one pool, the hd values x[c] for c = tid, tid + kThreads, ... (each thread reads only
// its own c), rounded as the CPU's store_row does. red: shared [kThreads / 32] (unused for a warp).
template <int kThreads>
__device__ void store_kv_row(void* pool, float* scales, KvType type, int64_t row, const float* x, int64_t hd,
                             float* red, int tid) {
  if (type == KvType::kF32) {
    for (int64_t c = tid; c < hd; c += kThreads) static_cast<float*>(pool)[row * hd + c] = x[c];
  } else if (type == KvType::kBf16) {
    for (int64_t c = tid; c < hd; c += kThreads) static_cast<uint16_t*>(pool)[row * hd + c] = f32_to_bf16_bits(x[c]);
  } else {
    float amax = 0.0f;
    for (int64_t c = tid; c < hd; c += kThreads) amax = fmaxf(amax, fabsf(x[c]));
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if constexpr (kThreads > 32) {
      __syncthreads();  // red may hold the previous call's values
      if (tid % 32 == 0) red[tid / 32] = amax;
      __syncthreads();
      for (int w = 0; w < kThreads / 32; ++w) amax = fmaxf(amax, red[w]);
    }
    const float s = fp8_token_scale_from_amax(amax);
    for (int64_t c = tid; c < hd; c += kThreads)
      static_cast<uint8_t*>(pool)[row * hd + c] = f32_to_fp8(__fdiv_rn(x[c], s));
    if (tid == 0) scales[row] = s;
  }
}

// ---- tensor-core primitives (cp.async, ldmatrix, the bf16 MMA, split_pack): mma_primitives.cuh ----

// Eight e4m3 codes (two words, lowest code in the low byte) widened to eight bf16 values, packed
// in pairs: exact (e4m3 values are exact in fp16 and in bf16).
__device__ __forceinline__ void e4m3x8_to_bf16(uint32_t w0, uint32_t w1, uint32_t (&out)[4]) {
  const uint32_t w[2] = {w0, w1};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
        static_cast<__nv_fp8x2_storage_t>((w[i / 2] >> (16 * (i % 2))) & 0xffffu), __NV_E4M3);
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&h));
    const __nv_bfloat162 b = __float22bfloat162_rn(f);
    out[i] = *reinterpret_cast<const uint32_t*>(&b);
  }
}

// Shared-memory tiles of bf16 rows of HD values, in 16-byte chunks, with the chunk index XORed by
// the row so that the eight rows one ldmatrix reads (same logical chunk) sit in eight different
// bank groups: no bank conflicts for ldmatrix or for the 16-byte fills.
template <int HD>
__device__ __forceinline__ int tile_chunk(int row, int chunk) {
  constexpr int C = HD / 8;  // chunks per row
  if constexpr (C >= 8) {
    return row * C + (chunk ^ (row & 7));
  } else {
    return row * C + (chunk ^ ((row / (8 / C)) & (C - 1)));
  }
}

}  // namespace sparkserve
