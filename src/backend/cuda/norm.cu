// RMSNorm variants, one block per row. Sums of squares in double, as the CPU reference does, so the
// scale matches it to float rounding whatever the row length.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {
namespace {

constexpr int kThreads = 256;

// Block-wide sum; every thread gets the result.
__device__ double block_sum_d(double v) {
  __shared__ double part[kThreads / 32];
  v = warp_sum_d(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  double s = 0;
  for (int w = 0; w < kThreads / 32; ++w) s += part[w];
  return s;
}

__device__ float inv_rms(const float* x, int64_t D, float eps) {
  double ss = 0;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) ss += static_cast<double>(x[i]) * x[i];
  ss = block_sum_d(ss);
  return static_cast<float>(1.0 / sqrt(ss / static_cast<double>(D) + eps));
}

__global__ void rmsnorm_kernel(float* out, const float* x, const float* w, int64_t D, float eps) {
  const int64_t r = blockIdx.x;
  const float s = inv_rms(x + r * D, D, eps);
  for (int64_t i = threadIdx.x; i < D; i += kThreads) out[r * D + i] = x[r * D + i] * s * (1.0f + w[i]);
}

// residual += delta, then the zero-centred norm of the new residual, in one pass over the row.
__global__ void add_rmsnorm_kernel(float* residual, float* out, const float* delta, const float* w, int64_t D,
                                   float eps) {
  const int64_t r = blockIdx.x;
  float* x = residual + r * D;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) x[i] = x[i] + delta[r * D + i];
  // Each thread reads back only the elements it wrote, so no barrier is needed before inv_rms.
  const float s = inv_rms(x, D, eps);
  for (int64_t i = threadIdx.x; i < D; i += kThreads) out[r * D + i] = x[i] * s * (1.0f + w[i]);
}

__global__ void gated_rmsnorm_kernel(float* out, const float* x, const float* z, const float* w, int64_t D,
                                     float eps) {
  const int64_t r = blockIdx.x;
  const float s = inv_rms(x + r * D, D, eps);
  for (int64_t i = threadIdx.x; i < D; i += kThreads)
    out[r * D + i] = x[r * D + i] * s * w[i] * silu_f(z[r * D + i]);
}

// add_gated_shared_rmsnorm, one block per row: the gate logit h . w (strided per thread, warp sums
// added in warp order), d += sigmoid(logit) y, residual += d, then h = the zero-centred norm of the
// residual. Every read of h (the logit) precedes the barrier in the logit's reduction; h is written
// only after it.
__global__ void __launch_bounds__(kThreads) add_gated_shared_rmsnorm_kernel(
    float* residual, float* h, float* d, const float* y, const void* gw, bool bf16, const float* w, int64_t D,
    float eps) {
  __shared__ float part[kThreads / 32];
  const int64_t r = blockIdx.x;
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) acc += h[r * D + i] * load_weight(gw, bf16, i);
  acc = warp_sum(acc);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = acc;
  __syncthreads();
  float logit = 0.0f;
  for (int i = 0; i < kThreads / 32; ++i) logit += part[i];
  const float s = sigmoid_f(logit);
  float* x = residual + r * D;
  for (int64_t i = threadIdx.x; i < D; i += kThreads) {
    const float di = d[r * D + i] + s * y[r * D + i];
    d[r * D + i] = di;
    x[i] = x[i] + di;
  }
  // As add_rmsnorm_kernel: each thread reads back only the elements it wrote.
  const float sc = inv_rms(x, D, eps);
  for (int64_t i = threadIdx.x; i < D; i += kThreads) h[r * D + i] = x[i] * sc * (1.0f + w[i]);
}

}  // namespace

void CudaBackend::add_gated_shared_rmsnorm(const Tensor& residual, const Tensor& h, const Tensor& d, const Tensor& y,
                                           const Linear& shared_gate, const Tensor& norm_w, float eps) {
  const bool plain = (shared_gate.format == WeightFormat::kBf16 || shared_gate.format == WeightFormat::kF32) &&
                     shared_gate.activation == ActivationQuant::kNone;
  const int64_t D = norm_w.numel(), R = residual.numel() / std::max<int64_t>(D, 1);
  if (!plain || shared_gate.in_features != D) {
    Backend::add_gated_shared_rmsnorm(residual, h, d, y, shared_gate, norm_w, eps);  // the op chain
    return;
  }
  CHECK(residual.numel() == R * D && h.numel() == R * D && d.numel() == R * D && y.numel() == R * D &&
        shared_gate.out_features == 1);
  if (R == 0) return;
  add_gated_shared_rmsnorm_kernel<<<static_cast<unsigned>(R), kThreads, 0, stream_>>>(
      residual.ptr<float>(), h.ptr<float>(), d.ptr<float>(), y.ptr<const float>(), shared_gate.weight.data,
      shared_gate.format == WeightFormat::kBf16, norm_w.ptr<const float>(), D, eps);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::rmsnorm(const Tensor& out, const Tensor& x, const Tensor& w, float eps) {
  const int64_t D = w.numel(), R = x.numel() / D;
  CHECK(x.numel() == R * D && out.numel() == x.numel());
  if (R == 0) return;
  rmsnorm_kernel<<<static_cast<unsigned>(R), kThreads, 0, stream_>>>(out.ptr<float>(), x.ptr<const float>(),
                                                                     w.ptr<const float>(), D, eps);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::add_rmsnorm(const Tensor& residual, const Tensor& out, const Tensor& delta, const Tensor& w,
                              float eps) {
  const int64_t D = w.numel(), R = residual.numel() / D;
  CHECK(residual.numel() == delta.numel() && out.numel() == residual.numel() && residual.numel() == R * D);
  if (R == 0) return;
  add_rmsnorm_kernel<<<static_cast<unsigned>(R), kThreads, 0, stream_>>>(
      residual.ptr<float>(), out.ptr<float>(), delta.ptr<const float>(), w.ptr<const float>(), D, eps);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::gated_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& z, const Tensor& w, float eps) {
  const int64_t D = w.numel(), R = x.numel() / D;
  CHECK(x.numel() == R * D && z.numel() == x.numel() && out.numel() == x.numel());
  if (R == 0) return;
  gated_rmsnorm_kernel<<<static_cast<unsigned>(R), kThreads, 0, stream_>>>(
      out.ptr<float>(), x.ptr<const float>(), z.ptr<const float>(), w.ptr<const float>(), D, eps);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sparkserve
