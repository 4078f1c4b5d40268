// bf16-weight Linear with few weight rows (the GDN in_proj_a / in_proj_b, 32-64 rows each) for T >= 2
// tokens: one kernel, where bf16_split_linear takes three launches (split x into bf16 hi / lo, a
// cuBLASLt GEMM over 2T columns, add the halves) for a problem of a few µs. Several such linears of
// one input (in_proj_a and in_proj_b) run in the same launch (CudaBackend::linears).
//
// Numerics: those of bf16_gemm.cu's split path. x = hi + lo, hi = bf16(x), lo = bf16(x - hi), split
// in registers as the activations are loaded (split_pack: the same roundings as split_bf16); each
// product w · hi and w · lo is exact in f32, and the sums are f32 (the mma's accumulation, then the
// warps' K slices added in warp order: deterministic). So the error bound of bf16_split_linear holds:
// 2^-16 Σ_k |w_k x_k| + the f32 summation error.
//
// Layout (mma.sync m16n8k16, bf16): tokens on the M side (16 per CTA), weight rows on N (8 per n8
// tile, kNT tiles per CTA), the 8 warps of a CTA each a K slice of every 32-wide chunk in turn.
// A dot product does not depend on the k order, so the logical k of the MMA fragments is permuted
// against memory for both operands alike: lane quad t's logical k {2t, 2t+1, 2t+8, 2t+9} of k16
// step s are the chunk's k 8t + 4s + {0, 1, 2, 3}, so one 16-byte load of a weight row holds a lane's
// B fragments of both steps and two float4 loads of an activation row its A fragments.
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/mma_primitives.cuh"
#include "backend/cuda/tc_gemm.h"
#include "core/check.h"

namespace sparkserve {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;

struct SmallNProblem {
  const __nv_bfloat16* __restrict__ w;  // [n, K]
  float* __restrict__ out;              // [T, n]
  int n;
};
struct SmallNArgs {
  const float* __restrict__ x;  // [T, K]
  int T, K, count;
  int tile_start[kBf16SmallNMaxLinears + 1];  // a problem's first n tile (blockIdx.x)
  SmallNProblem p[kBf16SmallNMaxLinears];
};

__device__ __forceinline__ float4 load4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }

// grid: (n tiles of every problem, ceil(T / 16)); block: kThreads.
template <int kNT>
__global__ void __launch_bounds__(kThreads) bf16_small_n_kernel(const SmallNArgs a) {
  constexpr int BN = 8 * kNT;
  __shared__ float red[kWarps][16][BN + 1];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t4 = lane % 4;
  int pi = 0;
  while (pi + 1 < a.count && static_cast<int>(blockIdx.x) >= a.tile_start[pi + 1]) ++pi;
  const SmallNProblem p = a.p[pi];
  const int n0 = (static_cast<int>(blockIdx.x) - a.tile_start[pi]) * BN, t0 = static_cast<int>(blockIdx.y) * 16;
  // Rows past T or n repeat the last one; their results are not stored.
  const float* xa = a.x + static_cast<int64_t>(min(t0 + g, a.T - 1)) * a.K;
  const float* xb = a.x + static_cast<int64_t>(min(t0 + g + 8, a.T - 1)) * a.K;
  const __nv_bfloat16* wr[kNT];
#pragma unroll
  for (int j = 0; j < kNT; ++j) wr[j] = p.w + static_cast<int64_t>(min(n0 + 8 * j + g, p.n - 1)) * a.K;
  float d[kNT][4];
#pragma unroll
  for (int j = 0; j < kNT; ++j) d[j][0] = d[j][1] = d[j][2] = d[j][3] = 0.f;
#pragma unroll 2
  for (int k = warp * 32 + 8 * t4; k < a.K; k += kWarps * 32) {
    const float4 xa0 = load4(xa + k), xa1 = load4(xa + k + 4), xb0 = load4(xb + k), xb1 = load4(xb + k + 4);
    uint4 wv[kNT];
#pragma unroll
    for (int j = 0; j < kNT; ++j) wv[j] = __ldg(reinterpret_cast<const uint4*>(wr[j] + k));
    // k16 step s: the chunk's k 8 t4 + 4 s + 0..3 (x: .x .y then .z .w; w: words 2 s, 2 s + 1)
    const float4 xr[2][2] = {{xa0, xb0}, {xa1, xb1}};
#pragma unroll
    for (int st = 0; st < 2; ++st) {
      uint32_t hi[4], lo[4];
      split_pack(xr[st][0].x, xr[st][0].y, hi[0], lo[0]);
      split_pack(xr[st][1].x, xr[st][1].y, hi[1], lo[1]);
      split_pack(xr[st][0].z, xr[st][0].w, hi[2], lo[2]);
      split_pack(xr[st][1].z, xr[st][1].w, hi[3], lo[3]);
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const uint32_t b0 = st == 0 ? wv[j].x : wv[j].z, b1 = st == 0 ? wv[j].y : wv[j].w;
        mma_bf16_16816(d[j], hi, b0, b1);
        mma_bf16_16816(d[j], lo, b0, b1);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
    const int c = 8 * j + 2 * t4;
    red[warp][g][c] = d[j][0];
    red[warp][g][c + 1] = d[j][1];
    red[warp][g + 8][c] = d[j][2];
    red[warp][g + 8][c + 1] = d[j][3];
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < 16 * BN; i += kThreads) {
    const int r = i / BN, c = i % BN, t = t0 + r, n = n0 + c;
    if (t >= a.T || n >= p.n) continue;
    float s = red[0][r][c];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) s += red[w][r][c];
    p.out[static_cast<int64_t>(t) * p.n + n] = s;
  }
}

bool takes(const Linear& w, int64_t K) {
  return bf16_gemm_takes(w) && w.in_features == K && K % 32 == 0 && w.out_features > 0 &&
         w.out_features <= kBf16SmallNMaxRows;
}

}  // namespace

bool bf16_small_n_takes(const Linear& w, int64_t T) {
  return T >= kBf16SmallNMinTokens && T <= kBf16SmallNMaxTokens && takes(w, w.in_features);
}

bool bf16_small_n_linears(CudaBackend& b, const std::vector<float*>& outs, const float* x, int64_t T,
                          const std::vector<const Linear*>& ws) {
  const int count = static_cast<int>(ws.size());
  if (count == 0 || count > kBf16SmallNMaxLinears || outs.size() != ws.size() || T < 1 || T > INT32_MAX / 2 ||
      (reinterpret_cast<uintptr_t>(x) & 15u) != 0)
    return false;
  const int64_t K = ws[0]->in_features;
  for (const Linear* w : ws)
    if (!takes(*w, K)) return false;
  // The widest n tile (fewest re-reads of x) that still gives half the SMs a CTA.
  auto ctas = [&](int nt) {
    int64_t tiles = 0;
    for (const Linear* w : ws) tiles += (w->out_features + 8 * nt - 1) / (8 * nt);
    return tiles * ((T + 15) / 16);
  };
  int nt = 8;
  while (nt > 1 && ctas(nt) < b.sm_count() / 2) nt /= 2;
  SmallNArgs a{};
  a.x = x;
  a.T = static_cast<int>(T);
  a.K = static_cast<int>(K);
  a.count = count;
  int tiles = 0;
  for (int i = 0; i < count; ++i) {
    a.tile_start[i] = tiles;
    a.p[i] = {static_cast<const __nv_bfloat16*>(ws[static_cast<size_t>(i)]->weight.data), outs[static_cast<size_t>(i)],
              static_cast<int>(ws[static_cast<size_t>(i)]->out_features)};
    tiles += static_cast<int>((a.p[i].n + 8 * nt - 1) / (8 * nt));
  }
  a.tile_start[count] = tiles;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>((T + 15) / 16));
  switch (nt) {
    case 8: bf16_small_n_kernel<8><<<grid, kThreads, 0, b.stream()>>>(a); break;
    case 4: bf16_small_n_kernel<4><<<grid, kThreads, 0, b.stream()>>>(a); break;
    case 2: bf16_small_n_kernel<2><<<grid, kThreads, 0, b.stream()>>>(a); break;
    default: bf16_small_n_kernel<1><<<grid, kThreads, 0, b.stream()>>>(a); break;
  }
  CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace sparkserve
