// The vision tower's elementwise ops and norms (ops.h "vision tower") on CUDA, each computing the
// CPU spec's function (backend/cpu/vision_ops.cpp) with fp32 arithmetic. attention_segments is in
// vision_attention.cu.
#include <cmath>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/tc_gemm.h"

namespace sparkserve {
namespace {

constexpr int kThreads = 256;

__global__ void layernorm_kernel(float* out, const float* x, const float* w, const float* b, int64_t D, float eps) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * D;
  __shared__ double part[32];
  double s = 0;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) s += xr[i];
  s = warp_sum_d(s);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = s;
  __syncthreads();
  double sum = 0;
  for (int wi = 0; wi < static_cast<int>(blockDim.x / 32); ++wi) sum += part[wi];
  const double mean = sum / static_cast<double>(D);
  __syncthreads();
  double v = 0;
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) v += (xr[i] - mean) * (xr[i] - mean);
  v = warp_sum_d(v);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
  __syncthreads();
  double var = 0;
  for (int wi = 0; wi < static_cast<int>(blockDim.x / 32); ++wi) var += part[wi];
  const float m = static_cast<float>(mean);
  const float rstd = static_cast<float>(1.0 / sqrt(var / static_cast<double>(D) + eps));
  // Every thread has read its elements of the row before any store (out may alias x).
  __syncthreads();
  for (int64_t i = threadIdx.x; i < D; i += blockDim.x) out[r * D + i] = (xr[i] - m) * rstd * w[i] + b[i];
}

// The same function with one warp per row held in registers (D % 4 == 0, D <= 4 * 32 * V, 16-byte
// rows): x is read once, with 16-byte loads, and no block barriers, where layernorm_kernel reads
// each row three times (the tower's D = 1152 rows: 1.3 ms of its 62 ms before this kernel). Each
// warp has read its whole row before it writes, so out may alias x.
template <int V>
__global__ void layernorm_warp_kernel(float* out, const float* x, const float* w, const float* b, int64_t R, int64_t D,
                                      float eps) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (r >= R) return;
  const int lane = threadIdx.x % 32;
  const int64_t n4 = D / 4;
  const float4* xr = reinterpret_cast<const float4*>(x + r * D);
  float4 v[V];
  double s = 0;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t i = lane + 32 * j;
    if (i < n4) {
      v[j] = xr[i];
      s += static_cast<double>(v[j].x) + v[j].y + v[j].z + v[j].w;
    }
  }
  const double mean = warp_sum_d(s) / static_cast<double>(D);
  double q = 0;
#pragma unroll
  for (int j = 0; j < V; ++j)
    if (lane + 32 * j < n4) {
      const double d0 = v[j].x - mean, d1 = v[j].y - mean, d2 = v[j].z - mean, d3 = v[j].w - mean;
      q += d0 * d0 + d1 * d1 + d2 * d2 + d3 * d3;
    }
  const double var = warp_sum_d(q);
  const float m = static_cast<float>(mean);
  const float rstd = static_cast<float>(1.0 / sqrt(var / static_cast<double>(D) + eps));
  const float4* w4 = reinterpret_cast<const float4*>(w);
  const float4* b4 = reinterpret_cast<const float4*>(b);
  float4* o4 = reinterpret_cast<float4*>(out + r * D);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t i = lane + 32 * j;
    if (i < n4) {
      const float4 wv = w4[i], bv = b4[i];
      o4[i] = make_float4((v[j].x - m) * rstd * wv.x + bv.x, (v[j].y - m) * rstd * wv.y + bv.y,
                          (v[j].z - m) * rstd * wv.z + bv.z, (v[j].w - m) * rstd * wv.w + bv.w);
    }
  }
}
constexpr int kLayernormWarpV = 12;  // rows up to 1536 wide (the tower's 1152)

__global__ void add_bias_kernel(float* x, const float* b, int64_t D, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += b[i % D];
}

__device__ __forceinline__ float gelu_of(float v, bool tanh_approx) {
  return tanh_approx ? 0.5f * v * (1.0f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)))
                     : 0.5f * v * (1.0f + erff(v * 0.7071067811865476f));
}

// V values per thread (V = 4: 16-byte loads and stores, where both pointers allow and n % 4 == 0).
template <int V>
__global__ void gelu_kernel(float* out, const float* x, int64_t n, bool tanh_approx) {
  const int64_t i = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * V;
  if (i >= n) return;
  if constexpr (V == 4) {
    const float4 v = *reinterpret_cast<const float4*>(x + i);
    *reinterpret_cast<float4*>(out + i) = make_float4(gelu_of(v.x, tanh_approx), gelu_of(v.y, tanh_approx),
                                                      gelu_of(v.z, tanh_approx), gelu_of(v.w, tanh_approx));
  } else {
    out[i] = gelu_of(x[i], tanh_approx);
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

__global__ void embedding_mix_kernel(float* out, const int32_t* ids, const float* wts, const void* table, bool bf16,
                                     int64_t N, int64_t K, int64_t D) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N * D) return;
  const int64_t n = i / D, d = i % D;
  float acc = 0;
  for (int64_t k = 0; k < K; ++k) {
    const float v = load_weight(table, bf16, static_cast<int64_t>(ids[n * K + k]) * D + d) * wts[n * K + k];
    acc = k == 0 ? v : acc + v;
  }
  out[i] = acc;
}

// One thread per (token, head, pair), the pair fastest: a warp reads and writes consecutive floats
// of a head (with the head fastest, each thread touched its own 288-byte head: ~5x the traffic).
__global__ void rope_axes_kernel(float* x, const int32_t* pos, const int32_t* axis, const float* inv_freq, int64_t T,
                                 int64_t heads, int64_t hd, int64_t P, int64_t A) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * P * heads) return;
  const int64_t p = i % P, h = (i / P) % heads, t = i / (heads * P);
  const float angle = static_cast<float>(pos[t * A + axis[p]]) * inv_freq[p];
  float s, c;
  sincosf(angle, &s, &c);
  float* v = x + (t * heads + h) * hd;
  const float x1 = v[p], x2 = v[p + P];
  v[p] = x1 * c - x2 * s;
  v[p + P] = x2 * c + x1 * s;
}

}  // namespace

void CudaBackend::layernorm(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  const int64_t D = w.numel(), R = x.numel() / D;
  CHECK(x.numel() == R * D && out.numel() == x.numel() && b.numel() == D);
  if (R == 0) return;
  if (D % 4 == 0 && D <= 4 * 32 * kLayernormWarpV && aligned16(x.data) && aligned16(out.data) && aligned16(w.data) &&
      aligned16(b.data)) {
    constexpr int kRowsPerBlock = 8;
    layernorm_warp_kernel<kLayernormWarpV><<<blocks_for(R, kRowsPerBlock), 32 * kRowsPerBlock, 0, stream_>>>(
        out.ptr<float>(), x.ptr<const float>(), w.ptr<const float>(), b.ptr<const float>(), R, D, eps);
    CUDA_CHECK_LAUNCH();
    return;
  }
  layernorm_kernel<<<static_cast<unsigned>(R), kThreads, 0, stream_>>>(out.ptr<float>(), x.ptr<const float>(),
                                                                       w.ptr<const float>(), b.ptr<const float>(), D, eps);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::add_bias(const Tensor& x, const Tensor& b) {
  const int64_t D = b.numel(), n = x.numel();
  CHECK(D > 0 && n % D == 0);
  if (n == 0) return;
  add_bias_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(x.ptr<float>(), b.ptr<const float>(), D, n);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::linear_bias(const Tensor& out, const Tensor& x, const Linear& w, const Tensor& b, bool accumulate) {
  const int64_t K = w.in_features, N = w.out_features, T = K == 0 ? 0 : x.numel() / K;
  CHECK(x.numel() == T * K && out.numel() == T * N && b.numel() == N);
  if (T == 0 || N == 0) return;
  if (T >= kBf16FusedMinTokens &&
      bf16_split_linear_bias(*this, out.ptr<float>(), x.ptr<const float>(), T, w, b.ptr<const float>(), accumulate))
    return;
  if (!accumulate) {
    linear(out, x, w);
    add_bias(out, b);
    return;
  }
  Scratch d(this, static_cast<size_t>(T * N) * sizeof(float));
  const Tensor dt(d.ptr, DType::kF32, {T, N}, Device::kCuda);
  linear(dt, x, w);
  add_bias(dt, b);
  add(out, out, dt);
}

void CudaBackend::gelu(const Tensor& out, const Tensor& x, bool tanh_approx) {
  CHECK(out.numel() == x.numel());
  const int64_t n = x.numel();
  if (n == 0) return;
  if (n % 4 == 0 && aligned16(x.data) && aligned16(out.data))
    gelu_kernel<4><<<blocks_for(n / 4, kThreads), kThreads, 0, stream_>>>(out.ptr<float>(), x.ptr<const float>(), n,
                                                                          tanh_approx);
  else
    gelu_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(out.ptr<float>(), x.ptr<const float>(), n,
                                                                      tanh_approx);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::embedding_mix(const Tensor& out, const Tensor& ids, const Tensor& weights, const Linear& table) {
  const int64_t N = ids.dim(0), K = ids.dim(1), D = table.in_features;
  CHECK(ids.dtype == DType::kI32 && weights.numel() == N * K && out.numel() == N * D);
  if (N * D == 0) return;
  embedding_mix_kernel<<<blocks_for(N * D, kThreads), kThreads, 0, stream_>>>(
      out.ptr<float>(), ids.ptr<const int32_t>(), weights.ptr<const float>(), table.weight.data,
      weight_is_bf16(table), N, K, D);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::rope_axes(const Tensor& x, const Tensor& positions, const Tensor& axis, const Tensor& inv_freq) {
  const int64_t T = x.dim(0), heads = x.dim(1), hd = x.dim(2), P = inv_freq.numel();
  if (T == 0) return;
  const int64_t A = positions.numel() / T;
  CHECK(2 * P <= hd && axis.numel() == P && positions.numel() == T * A && positions.dtype == DType::kI32);
  rope_axes_kernel<<<blocks_for(T * P * heads, kThreads), kThreads, 0, stream_>>>(
      x.ptr<float>(), positions.ptr<const int32_t>(), axis.ptr<const int32_t>(), inv_freq.ptr<const float>(), T,
      heads, hd, P, A);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sparkserve
