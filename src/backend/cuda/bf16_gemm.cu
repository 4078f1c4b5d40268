// bf16-weight Linear on the tensor cores (tc_gemm.h), faithful to the fp32 reference: the CPU
// multiplies the f32 activations by the bf16 weights widened to f32 and sums in f32. The tensor
// cores take bf16 on both sides, so x is split into two bf16 operands, hi = bf16(x) and lo =
// bf16(x - hi) (x - hi is exact in f32), with |x - hi - lo| <= 2^-16 |x| (each rounding keeps 8
// significant bits); W is exact in bf16, each product w · hi and w · lo is exact in f32, and the
// sums are f32. So |out - x W^T| <= 2^-16 Σ_k |w_k x_k| + the f32 summation error of two sums:
// the same order of error as the fp32 reference's own summation (tests/gpu/gemm_checks.cpp).
//
// bf16_split_linear: one GEMM computes both halves, the tokens' hi rows then their lo rows as 2T
// columns of B (so the weights are read once per chunk), then a kernel adds the two halves. T is
// cut into chunks whose [2T, N] f32 product stays under kChunkBytes (lm_head: 135 tokens per chunk).
// bf16_split_linear_bias (compute-bound T): two GEMMs accumulating into the output (tc_gemm.h).
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/cublaslt.h"
#include "backend/cuda/tc_gemm.h"
#include "core/check.h"

namespace sparkserve {
namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
constexpr int64_t kChunkBytes = int64_t{256} << 20;

// x: [T, K] f32 -> xs: [2T, K] bf16, rows t = hi of token t, rows T + t = its lo; n = T K values,
// V per thread (V = 4: 16-byte loads, 8-byte stores, where x is 16-byte aligned and n % 4 == 0).
template <int V>
__global__ void split_bf16_kernel(__nv_bfloat16* xs, const float* x, int64_t n) {
  const int64_t i = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * V;
  if (i >= n) return;
  float v[V];
  if constexpr (V == 4) {
    const float4 f = *reinterpret_cast<const float4*>(x + i);
    v[0] = f.x, v[1] = f.y, v[2] = f.z, v[3] = f.w;
  } else {
    v[0] = x[i];
  }
  alignas(8) __nv_bfloat16 hi[V], lo[V];
  for (int j = 0; j < V; ++j) {
    hi[j] = __float2bfloat16_rn(v[j]);
    lo[j] = __float2bfloat16_rn(v[j] - __bfloat162float(hi[j]));
  }
  if constexpr (V == 4) {
    *reinterpret_cast<uint2*>(xs + i) = *reinterpret_cast<const uint2*>(hi);
    *reinterpret_cast<uint2*>(xs + n + i) = *reinterpret_cast<const uint2*>(lo);
  } else {
    xs[i] = hi[0];
    xs[n + i] = lo[0];
  }
}

void split_bf16(cudaStream_t s, __nv_bfloat16* xs, const float* x, int64_t T, int64_t K) {
  const int64_t n = T * K;
  if (n % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0)
    split_bf16_kernel<4><<<blocks_for(n / 4, 256), 256, 0, s>>>(xs, x, n);
  else
    split_bf16_kernel<1><<<blocks_for(n, 256), 256, 0, s>>>(xs, x, n);
  CUDA_CHECK_LAUNCH();
}

// out[t, n] = d[t, n] + d[T + t, n]; d: [2T, N], out: [T, N].
__global__ void add_halves_kernel(float* out, const float* d, int64_t T, int64_t N) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * N) return;
  out[i] = d[i] + d[T * N + i];
}

}  // namespace

bool bf16_gemm_takes(const Linear& w) {
  return w.format == WeightFormat::kBf16 && w.in_features > 0 && w.in_features % 8 == 0 &&
         (reinterpret_cast<uintptr_t>(w.weight.data) & 15u) == 0;
}

bool bf16_split_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w) {
  if (!bf16_gemm_takes(w) || !lt_available()) return false;
  const int64_t K = w.in_features, N = w.out_features;
  if (T == 0 || N == 0) return true;
  const int64_t chunk = std::clamp<int64_t>(kChunkBytes / (8 * N), 1, T);
  CudaBackend::Scratch xs(&b, static_cast<size_t>(2 * chunk * K) * 2), d(&b, static_cast<size_t>(2 * chunk * N) * 4),
      workspace(&b, kWorkspaceBytes);
  LtMatmul m;
  m.ab_type = CUDA_R_16BF;
  m.m = N;
  m.k = K;
  m.a = w.weight.data;
  m.lda = K;
  m.b = xs.ptr;
  m.ldb = K;
  m.d = d.as<float>();
  m.ldd = N;
  // Both chunk shapes (full and last) must be taken before anything is launched.
  const int64_t last = T - (T - 1) / chunk * chunk;
  for (int64_t tc : {chunk, last}) {
    m.n = 2 * tc;
    if (!lt_plan(m, kWorkspaceBytes)) return false;
  }
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t tc = std::min(chunk, T - t0);
    split_bf16(b.stream(), xs.as<__nv_bfloat16>(), x + t0 * K, tc, K);
    m.n = 2 * tc;
    CHECK_MSG(lt_matmul(m, b.stream(), workspace.ptr, kWorkspaceBytes), "cuBLASLt refused a planned bf16 matmul");
    add_halves_kernel<<<blocks_for(tc * N, 256), 256, 0, b.stream()>>>(out + t0 * N, d.as<const float>(), tc, N);
    CUDA_CHECK_LAUNCH();
  }
  return true;
}

bool bf16_split_linear_bias(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w, const float* bias,
                            bool accumulate) {
  if (!bf16_gemm_takes(w) || !lt_available() || (reinterpret_cast<uintptr_t>(bias) & 15u) != 0) return false;
  const int64_t K = w.in_features, N = w.out_features;
  if (T == 0 || N == 0) return true;
  // Only the [2T, K] bf16 operands are materialised; chunks keep them under kChunkBytes.
  const int64_t chunk = std::clamp<int64_t>(kChunkBytes / (4 * K), 1, T);
  CudaBackend::Scratch xs(&b, static_cast<size_t>(2 * chunk * K) * 2), workspace(&b, kWorkspaceBytes);
  LtMatmul hi, lo;
  hi.ab_type = lo.ab_type = CUDA_R_16BF;
  hi.m = lo.m = N;
  hi.k = lo.k = K;
  hi.a = lo.a = w.weight.data;
  hi.lda = lo.lda = K;
  hi.ldb = lo.ldb = K;
  hi.ldd = lo.ldd = N;
  hi.bias = bias;
  hi.beta = accumulate ? 1.0f : 0.0f;
  lo.beta = 1.0f;
  const auto place = [&](int64_t t0, int64_t tc) {
    hi.n = lo.n = tc;
    hi.b = xs.as<__nv_bfloat16>();
    lo.b = xs.as<__nv_bfloat16>() + tc * K;
    hi.d = lo.d = out + t0 * N;
  };
  // Both chunk shapes (full and last) must be taken before anything is launched.
  const int64_t last_t0 = (T - 1) / chunk * chunk;
  for (int64_t t0 : {int64_t{0}, last_t0}) {
    place(t0, std::min(chunk, T - t0));
    if (!lt_plan(hi, kWorkspaceBytes) || !lt_plan(lo, kWorkspaceBytes)) return false;
  }
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t tc = std::min(chunk, T - t0);
    split_bf16(b.stream(), xs.as<__nv_bfloat16>(), x + t0 * K, tc, K);
    place(t0, tc);
    CHECK_MSG(lt_matmul(hi, b.stream(), workspace.ptr, kWorkspaceBytes) &&
                  lt_matmul(lo, b.stream(), workspace.ptr, kWorkspaceBytes),
              "cuBLASLt refused a planned bf16 matmul");
  }
  return true;
}

}  // namespace sparkserve
