// Shared by the two halves of Backend::draw on CUDA: draw.cu (many blocks per row, a candidate list)
// and draw_row.cu (one block per row, the general path for the rows the candidate list cannot decide).
#pragma once

#include <cstdint>

#include "backend/ops.h"

namespace sparkserve {

// draw.cu marks a row the candidate list could not decide with this id; draw_row.cu draws it.
inline constexpr int32_t kDrawUndecided = -2;

// The rows of `out` whose id is kDrawUndecided drawn over the whole row, one block per row.
// logits: [R, V] f32 (the first `vocab` columns drawn from), rows: [R], out: [R] (device).
void launch_draw_rows(RowArgmax* out, const float* logits, int64_t R, int64_t V, int64_t vocab,
                      const int32_t* excluded, int num_excluded, const RowDraw* rows, cudaStream_t stream);

// Order-preserving map of a non-NaN float (-0 as +0, as the host's comparisons treat them).
__device__ __forceinline__ uint32_t order_key(float s) {
  uint32_t b = __float_as_uint(s == 0.0f ? 0.0f : s);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Block-wide reduction / exclusive scan (in thread order) over kThreads threads; `tmp` is shared
// scratch of kThreads / 32 entries, reused after a barrier. Every thread gets the result.
template <int kThreads, class T, class Op>
__device__ T block_reduce(T v, T* tmp, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) tmp[w] = v;
  __syncthreads();
  v = tmp[0];
  for (int i = 1; i < kThreads / 32; ++i) v = op(v, tmp[i]);
  return v;
}

template <int kThreads, class T>
__device__ T block_exclusive_scan(T v, T* tmp) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32;
  T inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const T n = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += n;
  }
  __syncthreads();
  if (lane == 31) tmp[w] = inc;
  __syncthreads();
  T base = 0;
  for (int i = 0; i < w; ++i) base += tmp[i];
  return base + inc - v;
}

}  // namespace sparkserve
