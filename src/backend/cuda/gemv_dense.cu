// The dense decode GEMV (gemv_dense.h: decode_linear): bf16 / FP8 / NVFP4 weights, up to 8 tokens
// per weight pass, the Linear's activation quantization in each block's prologue (gemv_rows.cuh).
#include "backend/cuda/gemv_dense.h"
#include "backend/cuda/gemv_rows.cuh"
#include "core/check.h"

namespace sparkserve {
namespace {
using namespace gemv;  // NOLINT(google-build-using-namespace): the GEMV building blocks

constexpr int kMaxTokens = 8;                 // tokens sharing one pass over the weights

struct DenseArgs {
  const uint8_t* w;
  const uint8_t* ws;     // NVFP4: E4M3 [N, K/16]; FP8: f32 [N]
  const float* gscale;   // NVFP4 [P]
  const float* iscale;   // [P] or null
  const float* x;        // [T, K]
  float* out;            // [T, ldo]
  int64_t K, Np, ldo, row_bytes, rows_per_cta;
  int T, cpr, act, modelopt;
};

// grid: P x ceil(Np / rows_per_cta) blocks, each a run of rows inside one partition; warp w takes
// rows n0 + w*RPW.. (+ kWarps*RPW per step).
template <int FMT, int RPW, int U, int TT>
__global__ void __launch_bounds__(kThreads) dense_gemv_kernel(DenseArgs a) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  __shared__ float ts[TT], red[kWarps * TT];
  const int64_t r_step = kWarps * RPW;
  const int64_t bpp = (a.Np + a.rows_per_cta - 1) / a.rows_per_cta;
  const int64_t p = blockIdx.x / bpp;
  const int64_t n0 = p * a.Np + (blockIdx.x % bpp) * a.rows_per_cta, n1 = min(n0 + a.rows_per_cta, (p + 1) * a.Np);
  prefetch_l2(a.w + n0 * a.row_bytes, (n1 - n0) * a.row_bytes);
  if (FMT == kFmtNvfp4) prefetch_l2(a.ws + n0 * (a.K / 16), (n1 - n0) * (a.K / 16));
  const int64_t ldx = padded32(a.K);
  quantize_rows<TT, true>(xs, ldx, ts, red, a.x, a.T, a.K, a.act, a.modelopt != 0, a.iscale ? a.iscale[p] : 1.0f);
  const float gmul = FMT == kFmtNvfp4 ? nvfp4_gmul(a.gscale[p], a.modelopt != 0) : 0.0f;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t r0 = n0 + warp * RPW; r0 < n1; r0 += r_step) {
    Row rows[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const bool valid = r0 + r < n1;
      const int64_t n = valid ? r0 + r : r0;
      rows[r] = Row{a.w + n * a.row_bytes, FMT == kFmtNvfp4 ? a.ws + n * (a.K / 16) : nullptr, xs, gmul, valid};
    }
    float acc[RPW][TT];
    rows_dot<FMT, RPW, U, TT, true>(rows, a.cpr, ldx, acc);
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
      for (int t = 0; t < TT; ++t) {
        const float s = warp_sum(acc[r][t]);
        if (lane == (r * TT + t) % 32 && rows[r].valid && t < a.T)
          a.out[t * a.ldo + r0 + r] =
              finish<FMT>(s, a.act, reinterpret_cast<const float*>(a.ws), r0 + r, FMT == kFmtFp8 ? ts[t] : 0.0f);
      }
  }
}

template <int FMT, int RPW, int U, int TT>
void launch_dense_t(const DenseArgs& a, unsigned grid, int64_t smem, cudaStream_t s) {
  auto k = dense_gemv_kernel<FMT, RPW, U, TT>;
  static int64_t allowed = 0;
  allow_smem(k, smem, allowed);
  k<<<grid, kThreads, static_cast<size_t>(smem), s>>>(a);
  CUDA_CHECK_LAUNCH();
}

// Rows per warp and chunks per lane in flight: 4 x 16 bytes per lane either way. Several tokens or
// short rows: 4 rows at once (each activation load from shared memory serves 4 rows); one token and
// long rows: 4 chunks of one row (FP8 at one token has its own kernel, gemv_fp8_t1.cu).
template <int FMT, int TT>
void launch_dense_rows(const DenseArgs& a, unsigned grid, int64_t smem, cudaStream_t s, bool long_rows) {
  if constexpr (TT == 1) {
    if (long_rows) {
      launch_dense_t<FMT, 1, 4, TT>(a, grid, smem, s);
      return;
    }
  }
  launch_dense_t<FMT, 4, 1, TT>(a, grid, smem, s);
}

template <int FMT>
void launch_dense_fmt(const DenseArgs& a, int tt, unsigned grid, int64_t smem, cudaStream_t s, bool long_rows) {
  switch (tt) {
    case 1: launch_dense_rows<FMT, 1>(a, grid, smem, s, long_rows); break;
    case 2: launch_dense_rows<FMT, 2>(a, grid, smem, s, long_rows); break;
    case 4: launch_dense_rows<FMT, 4>(a, grid, smem, s, long_rows); break;
    default: launch_dense_rows<FMT, 8>(a, grid, smem, s, long_rows); break;
  }
}

}  // namespace

bool decode_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w) {
  View v;
  if (!make_view(w, v)) return false;
  const int64_t K = w.in_features, N = w.out_features, P = w.partitions;
  if (!is_quantized(w.format) && T > 2 * kMaxTokens) return false;  // bf16 prefill: the tiled GEMM
  if (P < 1 || N % P != 0 || K <= 0) return false;
  if ((reinterpret_cast<uintptr_t>(x) & 15u) != 0) return false;  // the prologue's float4 loads
  // Tokens per weight pass: a power of two (the kernels' register tiles) whose activations fit.
  int64_t chunk = kMaxTokens;
  while (chunk > 1 && chunk * padded32(K) * 4 > smem_budget()) chunk /= 2;
  if (padded32(K) * 4 > smem_budget()) return false;
  if (T == 0 || N == 0) return true;
  // One token, FP8 weights, an activation quantization the same for every partition.
  if (T == 1 && v.fmt == kFmtFp8 && (w.activation != ActivationQuant::kFp8TensorStatic || P == 1)) {
    fp8_t1_linear(b, out, x, w, v);
    return true;
  }
  const int64_t Np = N / P;
  const bool long_rows = v.cpr >= 96 && T == 1;
  const int64_t unit = kWarps * (long_rows ? 1 : 4);  // rows per block step
  // Blocks for ~2 per SM, each at least one step of rows: the prologue runs once per block.
  const int64_t steps = (N + unit - 1) / unit;
  const int64_t per_block = std::max<int64_t>(1, steps / (2 * static_cast<int64_t>(b.sm_count())));
  DenseArgs a{};
  a.w = static_cast<const uint8_t*>(w.weight.data);
  a.ws = static_cast<const uint8_t*>(w.weight_scale.data);
  a.gscale = is_nvfp4(w.format) ? static_cast<const float*>(w.global_scale.data) : nullptr;
  a.iscale = w.activation != ActivationQuant::kNone ? static_cast<const float*>(w.input_scale.data) : nullptr;
  a.K = K;
  a.Np = Np;
  a.ldo = N;
  a.row_bytes = v.row_bytes;
  a.rows_per_cta = unit * per_block;
  a.cpr = v.cpr;
  a.act = static_cast<int>(w.activation);
  a.modelopt = v.modelopt ? 1 : 0;
  const int64_t blocks = P * ((Np + a.rows_per_cta - 1) / a.rows_per_cta);
  CHECK(blocks <= INT32_MAX);
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int tc = static_cast<int>(std::min<int64_t>(chunk, T - t0));
    const int tt = tc <= 1 ? 1 : tc <= 2 ? 2 : tc <= 4 ? 4 : 8;  // <= chunk: both powers of two
    a.x = x + t0 * K;
    a.out = out + t0 * N;
    a.T = tc;
    const int64_t smem = tt * padded32(K) * 4;
    switch (v.fmt) {
      case kFmtBf16: launch_dense_fmt<kFmtBf16>(a, tt, static_cast<unsigned>(blocks), smem, b.stream(), long_rows); break;
      case kFmtFp8: launch_dense_fmt<kFmtFp8>(a, tt, static_cast<unsigned>(blocks), smem, b.stream(), long_rows); break;
      default: launch_dense_fmt<kFmtNvfp4>(a, tt, static_cast<unsigned>(blocks), smem, b.stream(), long_rows); break;
    }
  }
  return true;
}

}  // namespace sparkserve
