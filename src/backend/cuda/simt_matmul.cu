// The SIMT matmuls of simt_matmul.h: one GEMV and one 64x64-tiled GEMM, each serving linear (rows of
// x and out in order) and the float routed experts (rows gathered per (token, slot) pair, weights of
// the slot's expert). fp32 arithmetic, bf16 widened on load: the CPU reference's function in another
// summation order.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/simt_matmul.h"
#include "core/check.h"

namespace sparkserve {
namespace {

constexpr int kGemvWarps = 8;
constexpr int kGemvTokens = 8;

// The routed experts' view of the GEMV: blockIdx.y is a (token, slot) pair reading x row slot / x_div
// and the weights of expert ids[slot]; ids null: linear, all T tokens against one weight.
struct GemvSlots {
  const int32_t* ids;
  int64_t x_div, E;
};

// One warp per output row; each weight row is read once for up to 8 tokens, 16-byte loads where the
// rows are aligned (vec).
template <bool kBf16>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(float* out, const float* x, int64_t T, int64_t K,
                                                               int64_t N, const void* w, int64_t w_offset,
                                                               bool vec, GemvSlots sl) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  if (n >= N) return;
  if (sl.ids) {
    const int64_t slot = blockIdx.y;
    const int64_t e = sl.ids[slot];
    if (e < 0 || e >= sl.E) __trap();  // the CPU reference CHECKs this too
    x += (slot / sl.x_div) * K;
    out += slot * N;
    w_offset = e * N * K;
    T = 1;
  }
  const int64_t row = w_offset + n * K;
  for (int64_t t0 = 0; t0 < T; t0 += kGemvTokens) {
    const int nt = static_cast<int>(T - t0 < kGemvTokens ? T - t0 : kGemvTokens);
    float acc[kGemvTokens];
#pragma unroll
    for (int j = 0; j < kGemvTokens; ++j) acc[j] = 0.0f;
    if (vec) {
      for (int64_t k = lane * 8; k < K; k += 256) {
        float wv[8];
        load8<kBf16>(w, row + k, wv);
#pragma unroll
        for (int j = 0; j < kGemvTokens; ++j) {
          if (j < nt) {
            const float4* xp = reinterpret_cast<const float4*>(x + (t0 + j) * K + k);
            const float4 a = xp[0], b = xp[1];
            acc[j] += wv[0] * a.x + wv[1] * a.y + wv[2] * a.z + wv[3] * a.w + wv[4] * b.x + wv[5] * b.y +
                      wv[6] * b.z + wv[7] * b.w;
          }
        }
      }
    } else {
      for (int64_t k = lane; k < K; k += 32) {
        const float wv = load_weight(w, kBf16, row + k);
#pragma unroll
        for (int j = 0; j < kGemvTokens; ++j)
          if (j < nt) acc[j] += wv * x[(t0 + j) * K + k];
      }
    }
#pragma unroll
    for (int j = 0; j < kGemvTokens; ++j) {
      const float s = warp_sum(acc[j]);
      if (lane == 0 && j < nt) out[(t0 + j) * N + n] = s;
    }
  }
}

// C[rows, N] = X[rows, K] W[N, K]^T, 64x64 tiles, 16-deep K steps, 4x4 outputs per thread.
// kGrouped: blockIdx.y is tile i of `tiles` (rows gathered: x row slot / x_div, out row slot, the
// tile's expert's weights); else rows 64 blockIdx.y.. of x and out.
constexpr int kBM = kSimtTileRows, kBN = 64, kBK = 16;
template <bool kBf16, bool kGrouped>
__global__ void __launch_bounds__(256) gemm_kernel(float* out, const float* x, int64_t T, int64_t K, int64_t N,
                                                   const void* w, int64_t w_offset, int64_t x_div, SlotTiles tiles) {
  __shared__ float xs[kBK][kBM + 4];
  __shared__ float ws[kBK][kBN + 4];
  __shared__ int64_t xrow[kGrouped ? kBM : 1], orow[kGrouped ? kBM : 1];
  const int tid = threadIdx.x;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  int64_t m0 = 0, rows;
  if constexpr (kGrouped) {
    if (static_cast<int32_t>(blockIdx.y) >= *tiles.num_tiles) return;
    rows = tiles.tile_rows[blockIdx.y];
    if (tid < kBM) {
      const int64_t slot = tid < rows ? tiles.sorted[tiles.tile_start[blockIdx.y] + tid] : -1;
      xrow[tid] = slot < 0 ? -1 : slot / x_div;
      orow[tid] = slot;
    }
    __syncthreads();
    w_offset = static_cast<int64_t>(tiles.tile_e[blockIdx.y]) * N * K;
  } else {
    m0 = static_cast<int64_t>(blockIdx.y) * kBM;
    rows = T - m0;
  }
  const int tm = (tid / 16) * 4, tn = (tid % 16) * 4;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
    // 1024 elements of each tile, 4 per thread; consecutive threads take consecutive k.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = tid + i * 256, r = e / kBK, c = e % kBK;
      const int64_t gn = n0 + r, gk = k0 + c;
      xs[c][r] = (r < rows && gk < K) ? x[(kGrouped ? xrow[r] : m0 + r) * K + gk] : 0.0f;
      ws[c][r] = (gn < N && gk < K) ? load_weight(w, kBf16, w_offset + gn * K + gk) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int c = 0; c < kBK; ++c) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = xs[c][tm + i];
        b[i] = ws[c][tn + i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t gn = n0 + tn + j;
      if (tm + i < rows && gn < N) out[(kGrouped ? orow[tm + i] : m0 + tm + i) * N + gn] = acc[i][j];
    }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

void launch_gemv(cudaStream_t s, float* out, const float* x, int64_t T, int64_t K, int64_t N, const void* w,
                 bool bf16, int64_t w_offset, GemvSlots sl, unsigned groups) {
  const size_t esz = bf16 ? 2 : 4;
  // Expert offsets e * N * K keep the alignment of the payload when K % 8 == 0.
  const bool vec = K % 8 == 0 && aligned16(x) && aligned16(static_cast<const char*>(w) + w_offset * esz);
  const dim3 grid(blocks_for(N, kGemvWarps), groups);
  if (bf16)
    gemv_kernel<true><<<grid, kGemvWarps * 32, 0, s>>>(out, x, T, K, N, w, w_offset, vec, sl);
  else
    gemv_kernel<false><<<grid, kGemvWarps * 32, 0, s>>>(out, x, T, K, N, w, w_offset, vec, sl);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_matmul(cudaStream_t s, float* out, const float* x, int64_t T, int64_t K, int64_t N, const void* w,
                   bool bf16, int64_t w_offset) {
  if (T == 0 || N == 0) return;
  if (T <= 2 * kGemvTokens) {
    launch_gemv(s, out, x, T, K, N, w, bf16, w_offset, GemvSlots{nullptr, 1, 0}, 1);
    return;
  }
  const dim3 grid(blocks_for(N, kBN), blocks_for(T, kBM));
  const SlotTiles none{};
  if (bf16)
    gemm_kernel<true, false><<<grid, 256, 0, s>>>(out, x, T, K, N, w, w_offset, 1, none);
  else
    gemm_kernel<false, false><<<grid, 256, 0, s>>>(out, x, T, K, N, w, w_offset, 1, none);
  CUDA_CHECK_LAUNCH();
}

void launch_slot_gemv(cudaStream_t s, float* out, const float* x, int64_t x_div, const int32_t* ids, int64_t slots,
                      const void* w, bool bf16, int64_t K, int64_t N, int64_t E) {
  if (slots == 0 || N == 0) return;
  CHECK_MSG(slots <= 65535, "CUDA slot GEMV: more than 65535 (token, expert) pairs in one call");
  launch_gemv(s, out, x, 1, K, N, w, bf16, 0, GemvSlots{ids, x_div, E}, static_cast<unsigned>(slots));
}

void launch_grouped_matmul(cudaStream_t s, float* out, const float* x, int64_t x_div, const SlotTiles& tiles,
                           const void* w, bool bf16, int64_t K, int64_t N) {
  if (tiles.max_tiles == 0 || N == 0) return;
  CHECK_MSG(tiles.max_tiles <= 65535, "CUDA grouped matmul: too many (token, expert) tiles in one call");
  const dim3 grid(blocks_for(N, kBN), static_cast<unsigned>(tiles.max_tiles));
  if (bf16)
    gemm_kernel<true, true><<<grid, 256, 0, s>>>(out, x, 0, K, N, w, 0, x_div, tiles);
  else
    gemm_kernel<false, true><<<grid, 256, 0, s>>>(out, x, 0, K, N, w, 0, x_div, tiles);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sparkserve
