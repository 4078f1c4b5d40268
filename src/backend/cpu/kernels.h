// Small inner-loop helpers shared by the CPU op files.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>

#include "backend/ops.h"
#include "core/dtype.h"

namespace sparkserve::cpu {

// Dot product with 8 independent partial sums (lets the compiler use SIMD without -ffast-math).
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Converts n weight elements starting at element `offset` of a weight payload to f32.
inline void weight_row_to_f32(float* dst, const Tensor& w, WeightFormat format, int64_t offset, int64_t n) {
  switch (format) {
    case WeightFormat::kF32:
      std::memcpy(dst, w.ptr<const float>() + offset, static_cast<size_t>(n) * 4);
      return;
    case WeightFormat::kBf16: {
      const uint16_t* src = w.ptr<const uint16_t>() + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
      return;
    }
    default:
      CHECK_MSG(false, "weight format not implemented by the CPU backend");
  }
}

// Items per parallel chunk so that a chunk holds at least ~32K multiply-adds: smaller jobs run
// on the calling thread, where waking a worker would cost more than the work.
inline int64_t min_chunk_for(int64_t macs_per_item) {
  constexpr int64_t kMinMacsPerChunk = 1 << 15;
  return macs_per_item >= kMinMacsPerChunk ? 1 : (kMinMacsPerChunk + macs_per_item - 1) / std::max<int64_t>(1, macs_per_item);
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace sparkserve::cpu

namespace sparkserve {
class ThreadPool;
namespace cpu {
// out[t, n] = x[t, :] . W[n, :] for the N rows of K weights starting at element w_offset of w
// (one expert of a stacked tensor, or a whole matrix). x: [T, K] f32 -> out: [T, N] f32.
void matmul_rows(ThreadPool& pool, float* out, const float* x, int64_t T, int64_t K, int64_t N,
                 const Tensor& w, WeightFormat format, int64_t w_offset);
// Fills rows [n0, n0 + nr) of a weight as f32 into dst ([nr, K]); called from worker threads.
using RowDecoder = std::function<void(float* dst, int64_t n0, int64_t nr)>;
// out[t * ldo + n] = x[t, :] . decode(n) for n < N. x: [T, K] f32 -> out: [T, ldo] f32 (first N cols).
// The same tiles and sums as matmul_rows, whatever the decoder.
void matmul_rows_decoded(ThreadPool& pool, float* out, int64_t ldo, const float* x, int64_t T, int64_t K,
                         int64_t N, const RowDecoder& decode);
// y = x W_e^T for expert `expert` of w (0 for a plain matrix), any WeightFormat: BF16/F32 go to
// matmul_rows; NVFP4 / FP8 to the quantized path (quant_linear.cpp), which quantizes x as
// w.activation says and dequantizes the weight rows inside the loop.
// x: [T, in] f32 -> out: [T, out] f32
void linear_rows(ThreadPool& pool, float* out, const float* x, int64_t T, const Linear& w, int64_t expert);
}  // namespace cpu
}  // namespace sparkserve
