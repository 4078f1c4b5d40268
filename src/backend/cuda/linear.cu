// y = x W^T for f32 and bf16 weights, fp32 arithmetic (bf16 widened on load) like the CPU reference.
// Small T (decode): a GEMV with one warp per output row that reads each weight row once for up to
// 8 tokens, 16-byte loads where the rows are aligned. Larger T (prefill): a 64x64-tiled SIMT GEMM.
// Tensor-core paths (bf16/fp8/nvfp4 operands) are a later step: they change the arithmetic, so
// they need their own stated tolerance.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/decode_gemv.h"

namespace sparkserve {
namespace {

constexpr int kGemvWarps = 8;
constexpr int kGemvTokens = 8;

template <bool kBf16>
__global__ void __launch_bounds__(kGemvWarps * 32) gemv_kernel(float* out, const float* x, int64_t T, int64_t K,
                                                               int64_t N, const void* w, int64_t w_offset,
                                                               bool vec) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  if (n >= N) return;
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

// C[T, N] = X[T, K] W[N, K]^T, 64x64 tiles, 16-deep K steps, 4x4 outputs per thread.
constexpr int kBM = 64, kBN = 64, kBK = 16;
template <bool kBf16>
__global__ void __launch_bounds__(256) gemm_kernel(float* out, const float* x, int64_t T, int64_t K, int64_t N,
                                                   const void* w, int64_t w_offset) {
  __shared__ float xs[kBK][kBM + 4];
  __shared__ float ws[kBK][kBN + 4];
  const int tid = threadIdx.x;
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kBM, n0 = static_cast<int64_t>(blockIdx.x) * kBN;
  const int tm = (tid / 16) * 4, tn = (tid % 16) * 4;
  float acc[4][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
    // 1024 elements of each tile, 4 per thread; consecutive threads take consecutive k.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = tid + i * 256, r = e / kBK, c = e % kBK;
      const int64_t gm = m0 + r, gn = n0 + r, gk = k0 + c;
      xs[c][r] = (gm < T && gk < K) ? x[gm * K + gk] : 0.0f;
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
      const int64_t gm = m0 + tm + i, gn = n0 + tn + j;
      if (gm < T && gn < N) out[gm * N + gn] = acc[i][j];
    }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void launch_matmul(cudaStream_t s, float* out, const float* x, int64_t T, int64_t K, int64_t N, const void* w,
                   bool bf16, int64_t w_offset) {
  if (T == 0 || N == 0) return;
  if (T <= 2 * kGemvTokens) {
    const size_t esz = bf16 ? 2 : 4;
    const bool vec = K % 8 == 0 && aligned16(x) && aligned16(static_cast<const char*>(w) + w_offset * esz);
    const unsigned grid = blocks_for(N, kGemvWarps);
    if (bf16)
      gemv_kernel<true><<<grid, kGemvWarps * 32, 0, s>>>(out, x, T, K, N, w, w_offset, vec);
    else
      gemv_kernel<false><<<grid, kGemvWarps * 32, 0, s>>>(out, x, T, K, N, w, w_offset, vec);
  } else {
    const dim3 grid(blocks_for(N, kBN), blocks_for(T, kBM));
    if (bf16)
      gemm_kernel<true><<<grid, 256, 0, s>>>(out, x, T, K, N, w, w_offset);
    else
      gemm_kernel<false><<<grid, 256, 0, s>>>(out, x, T, K, N, w, w_offset);
  }
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::linear(const Tensor& out, const Tensor& x, const Linear& w) {
  const int64_t K = w.in_features, N = w.out_features, T = K == 0 ? 0 : x.numel() / K;
  CHECK(x.numel() == T * K && out.numel() == T * N);
  // Decode-sized T (and quantized weights at any T): decode_gemv.cu's fused GEMVs.
  if (decode_linear(*this, out.ptr<float>(), x.ptr<const float>(), T, w)) return;
  if (is_quantized(w.format)) {
    quant_matmul(out.ptr<float>(), x.ptr<const float>(), T, 1, nullptr, w);
    return;
  }
  launch_matmul(stream_, out.ptr<float>(), x.ptr<const float>(), T, K, N, w.weight.data, weight_is_bf16(w), 0);
}

}  // namespace sparkserve
