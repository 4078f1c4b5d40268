// ROUND-A A/B ONLY (deleted after the measurement): the previous fp8_small_n.cu kernel (quantize +
// mma.sync GEMM + fp8_reduce_splits), reachable as LinearPath::kFp8SmallNOld.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>

#include "backend/cuda/fp8_codes.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/mma_primitives.cuh"
#include "backend/cuda/tc_gemm.h"
#include "core/check.h"

namespace sparkserve {
namespace {

constexpr int kWarps = 4;
constexpr int kMTiles = 2;                       // m16 tiles per warp
constexpr int kRowsPerWarp = 16 * kMTiles;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kChunk = 64;                       // K per step (16 bytes of codes per lane and row)
constexpr int kStages = 3;                       // chunks of weights in registers: one computed, two in flight

struct SmallNArgs {
  const uint8_t* w;   // [rows, K] E4M3, row stride K
  const __half* x;    // [T, K] the activation codes' values
  const float* ts;    // [T] activation scales
  const float* ws;    // [rows] weight scales
  float* out;         // [T, ldo]: splits == 1
  float* part;        // [splits, T, rows]: splits > 1
  int64_t K, rows, ldo;
  int T, chunks_per_split, splits;
};



// grid: (ceil(rows / 128), splits), 128 threads. NT token tiles of 8 (T <= 8 NT).
template <int NT>
__global__ void __launch_bounds__(kWarps * 32) fp8_small_n_old_kernel(SmallNArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp * kRowsPerWarp;
  // The lane's rows: tile i, half h -> row0 + 16 i + 8 h + g (clamped for the loads; not stored).
  const uint8_t* wp[2 * kMTiles];
#pragma unroll
  for (int r = 0; r < 2 * kMTiles; ++r)
    wp[r] = a.w + min(row0 + 8 * r + g, a.rows - 1) * a.K + 16 * q;
  const __half* xp[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) xp[j] = a.x + static_cast<int64_t>(min(8 * j + g, a.T - 1)) * a.K + 16 * q;
  const int64_t c0 = static_cast<int64_t>(blockIdx.y) * a.chunks_per_split;
  const int64_t c1 = min(c0 + a.chunks_per_split, a.K / kChunk);
  float acc[kMTiles][NT][4];
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
  uint4 buf[kStages][2 * kMTiles];
  auto load = [&](uint4 (&dst)[2 * kMTiles], int64_t c) {
#pragma unroll
    for (int r = 0; r < 2 * kMTiles; ++r) dst[r] = ld_stream16(wp[r] + c * kChunk);
  };
  auto compute = [&](const uint4 (&wq)[2 * kMTiles], int64_t c) {
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint2 xb[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) xb[j] = __ldg(reinterpret_cast<const uint2*>(xp[j] + c * kChunk + 4 * s));
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        const uint32_t lo = code_word(wq[2 * i], s), hi = code_word(wq[2 * i + 1], s);
        const uint32_t af[4] = {e4m3x2_f16x2(lo), e4m3x2_f16x2(hi), e4m3x2_f16x2(lo >> 16), e4m3x2_f16x2(hi >> 16)};
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_f16_16816(acc[i][j], af, xb[j].x, xb[j].y);
      }
    }
  };
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st)
    if (c0 + st < c1) load(buf[st], c0 + st);
  for (int64_t c = c0; c < c1; c += kStages) {
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      const int64_t cc = c + st;
      if (cc < c1) {
        if (cc + kStages - 1 < c1) load(buf[(st + kStages - 1) % kStages], cc + kStages - 1);
        compute(buf[st], cc);
      }
    }
  }
  // C fragment: acc[i][j] = rows (tile i) g and g + 8, tokens 8 j + 2 q and + 1.
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = row0 + 16 * i + 8 * h + g;
      if (n >= a.rows) continue;
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int t = 8 * j + 2 * q + e;
          if (t >= a.T) continue;
          const float v = acc[i][j][2 * h + e];
          if (a.splits == 1) a.out[t * a.ldo + n] = v * (a.ts[t] * a.ws[n]);
          else a.part[(static_cast<int64_t>(blockIdx.y) * a.T + t) * a.rows + n] = v;
        }
    }
}

template <int NT>
void launch_small_n(const SmallNArgs& a, dim3 grid, cudaStream_t s) {
  fp8_small_n_old_kernel<NT><<<grid, kWarps * 32, 0, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

namespace {
// One call for T <= 64 tokens.
void small_n_tokens(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w) {
  const int64_t K = w.in_features, N = w.out_features;
  const bool per_partition = w.activation == ActivationQuant::kFp8TensorStatic && w.partitions > 1;
  const int64_t parts = per_partition ? w.partitions : 1, rows = N / parts;
  // Splits of K over blocks: enough warps to keep ~16 per SM streaming, each split at least two
  // chunks, and the partial sums (written and read once) at most half the weight bytes.
  const int64_t chunks = K / kChunk, row_blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t want = (4 * static_cast<int64_t>(b.sm_count()) + row_blocks - 1) / row_blocks;
  const int64_t cap = std::max<int64_t>(1, std::min(chunks / 2, K / (16 * T)));
  const int64_t splits = std::clamp<int64_t>(want, 1, cap);
  const int64_t per_split = (chunks + splits - 1) / splits;
  const int used = static_cast<int>((chunks + per_split - 1) / per_split);  // no empty split
  CHECK(row_blocks <= INT32_MAX);
  CudaBackend::Scratch xh(&b, static_cast<size_t>(T * K) * 2), ts(&b, static_cast<size_t>(T) * 4),
      part(&b, used > 1 ? static_cast<size_t>(used * T * rows) * 4 : 0);
  const auto* wq = static_cast<const uint8_t*>(w.weight.data);
  const auto* ws = static_cast<const float*>(w.weight_scale.data);
  const auto* is = static_cast<const float*>(w.input_scale.data);
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(used));
  const int nt = T <= 8 ? 1 : T <= 16 ? 2 : T <= 32 ? 4 : 8;
  for (int64_t p = 0; p < parts; ++p) {
    fp8_quantize_rows_f16(b.stream(), xh.as<__half>(), ts.as<float>(), x, T, K,
                          w.activation == ActivationQuant::kFp8TensorStatic ? is + p : nullptr);
    SmallNArgs a{};
    a.w = wq + p * rows * K;
    a.x = xh.as<__half>();
    a.ts = ts.as<float>();
    a.ws = ws + p * rows;
    a.out = out + p * rows;
    a.part = part.as<float>();
    a.K = K;
    a.rows = rows;
    a.ldo = N;
    a.T = static_cast<int>(T);
    a.chunks_per_split = static_cast<int>(per_split);
    a.splits = used;
    switch (nt) {
      case 1: launch_small_n<1>(a, grid, b.stream()); break;
      case 2: launch_small_n<2>(a, grid, b.stream()); break;
      case 4: launch_small_n<4>(a, grid, b.stream()); break;
      default: launch_small_n<8>(a, grid, b.stream()); break;
    }
    if (used > 1) {
      fp8_reduce_splits(b.stream(), out + p * rows, N, part.as<float>(), used, T, rows, ts.as<float>(), ws + p * rows);
    }
  }
}
}  // namespace

bool fp8_small_n_old_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w) {
  if (!fp8_w8a8_takes(w, kChunk) || (reinterpret_cast<uintptr_t>(x) & 15u) != 0) return false;
  const int64_t K = w.in_features, N = w.out_features;
  for (int64_t t0 = 0; t0 < T && N > 0; t0 += kFp8SmallNMaxTokens)
    small_n_tokens(b, out + t0 * N, x + t0 * K, std::min(kFp8SmallNMaxTokens, T - t0), w);
  return true;
}

bool ab_small_n_old() {
  static const bool old = [] {
    const char* e = std::getenv("SPARKSERVE_AB_SMALLN_OLD");
    return e != nullptr && e[0] == '1';
  }();
  return old;
}
int64_t ab_wgmma_min_tokens() {
  static const int64_t t = [] {
    const char* e = std::getenv("SPARKSERVE_AB_WGMMA_MIN_T");
    return e != nullptr ? std::atoll(e) : kFp8WgmmaSmallMinTokens;
  }();
  return t;
}

}  // namespace sparkserve
