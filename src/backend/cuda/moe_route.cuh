// The router's softmax + top-k for one token, run by a whole thread block: route_topk_kernel (moe.cu)
// and the fused routing + activation quantization of moe_w4a4.cu share it, so both give the same ids
// and weights bit for bit.
//
// Top-k by rank instead of k rounds of an argmax: thread e counts the experts that sort before e
// (larger probability, or equal and lower id: a stable descending sort's order, the CPU's) and, when
// that rank is below k, writes e to slot rank. NaN probabilities sort last (as -1), so the ranks are
// a strict total order and every slot is filled whatever the logits hold.
#pragma once

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {

// logits: [E] f32, p: [E] f32 scratch (shared memory) -> ids: [k] i32, weights: [k] f32 (shared or
// global; the top-k probabilities, largest first, renormalised to sum 1). Every thread of the block
// must call it (it synchronises the block).
__device__ inline void route_topk_block(float* p, const float* l, int64_t E, int64_t k, int32_t* ids, float* weights) {
  __shared__ float red[32];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32, nw = (blockDim.x + 31) / 32;
  // Block max, then the sum of exp in warp order.
  float mx = -INFINITY;
  for (int64_t e = tid; e < E; e += blockDim.x) mx = fmaxf(mx, l[e]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (lane == 0) red[warp] = mx;
  __syncthreads();
  mx = red[0];
  for (int w = 1; w < nw; ++w) mx = fmaxf(mx, red[w]);
  __syncthreads();  // red is reused below
  float sum = 0.0f;
  for (int64_t e = tid; e < E; e += blockDim.x) sum += (p[e] = expf(l[e] - mx));
  sum = warp_sum(sum);
  if (lane == 0) red[warp] = sum;
  __syncthreads();
  sum = 0.0f;
  for (int w = 0; w < nw; ++w) sum += red[w];
  for (int64_t e = tid; e < E; e += blockDim.x) p[e] /= sum;
  __syncthreads();
  for (int64_t e = tid; e < E; e += blockDim.x) {
    const float pe = isnan(p[e]) ? -1.0f : p[e];
    int64_t rank = 0;
    for (int64_t j = 0; j < E && rank < k; ++j) {
      const float pj = isnan(p[j]) ? -1.0f : p[j];
      rank += pj > pe || (pj == pe && j < e);
    }
    if (rank < k) ids[rank] = static_cast<int32_t>(e);  // ranks are distinct: one writer per slot
  }
  __syncthreads();  // also makes the global writes of ids visible to thread 0
  if (tid == 0) {
    float top_sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) top_sum += p[ids[j]];
    for (int64_t j = 0; j < k; ++j) weights[j] = p[ids[j]] / top_sum;
  }
  __syncthreads();
}

}  // namespace sparkserve
