// RMSNorm variants, one block per row. Sums of squares in double, as the CPU reference does, so the
// scale matches it to float rounding whatever the row length.
//
// Every pass over a row loads its kV elements per thread (and those of the other operands) before
// any store: the row pointers may alias (residual / out / delta), so a plain strided
// load-add-store loop is compiled as one serial global-memory round trip per element step, which made
// a 3072-wide decode row take 12-18 µs (ncu, docs/performance.md) instead of a few.
#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/fp8_codes.cuh"
#include "backend/cuda/quant_math.cuh"
#include "backend/cuda/tc_gemm.h"

namespace sparkserve {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kV = 4;  // elements per thread per pass: a row of up to kV * 1024 in one pass

// Threads for a row of D: whole warps, enough for one pass when D allows.
unsigned row_threads(int64_t D) {
  const int64_t t = (std::max<int64_t>(D, 1) + kV - 1) / kV;
  return static_cast<unsigned>(std::min<int64_t>(kMaxThreads, (t + 31) / 32 * 32));
}

// Block-wide sums, added warp by warp in warp order; every thread gets the result.
__device__ double block_sum_d(double v) {
  __shared__ double part[kMaxThreads / 32];
  v = warp_sum_d(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  double s = 0;
  for (int w = 0; w < nw; ++w) s += part[w];
  return s;
}
__device__ float block_sum_f(float v) {
  __shared__ float part[kMaxThreads / 32];
  v = warp_sum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nw = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float s = 0;
  for (int w = 0; w < nw; ++w) s += part[w];
  return s;
}

__device__ __forceinline__ float inv_rms_of(double ss, int64_t D, float eps) {
  return static_cast<float>(1.0 / sqrt(ss / static_cast<double>(D) + eps));
}
// Index of element v of this thread's share of the pass starting at `base`.
__device__ __forceinline__ int64_t elem(int64_t base, int v) {
  return base + static_cast<int64_t>(v) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t pass_len() { return static_cast<int64_t>(kV) * blockDim.x; }

// Sum of squares of x[0, D).
__device__ double row_sumsq(const float* x, int64_t D) {
  double ss = 0;
  for (int64_t base = 0; base < D; base += pass_len()) {
    float xv[kV];
#pragma unroll
    for (int v = 0; v < kV; ++v) xv[v] = elem(base, v) < D ? x[elem(base, v)] : 0.0f;
#pragma unroll
    for (int v = 0; v < kV; ++v) ss += static_cast<double>(xv[v]) * xv[v];
  }
  return ss;
}

// out[i] = x[i] * s * (1 + w[i]) (in place allowed: each element is read and written by one thread).
__device__ void write_norm(float* out, const float* x, const float* w, float s, int64_t D) {
  for (int64_t base = 0; base < D; base += pass_len()) {
    float xv[kV], wv[kV];
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int64_t i = elem(base, v);
      xv[v] = i < D ? x[i] : 0.0f;
      wv[v] = i < D ? w[i] : 0.0f;
    }
#pragma unroll
    for (int v = 0; v < kV; ++v)
      if (elem(base, v) < D) out[elem(base, v)] = xv[v] * s * (1.0f + wv[v]);
  }
}

__global__ void __launch_bounds__(kMaxThreads) rmsnorm_kernel(float* out, const float* x, const float* w, int64_t D,
                                                             float eps) {
  const int64_t r = blockIdx.x;
  const float s = inv_rms_of(block_sum_d(row_sumsq(x + r * D, D)), D, eps);
  write_norm(out + r * D, x + r * D, w, s, D);
}

// The delta of a row's kV elements at `at` (ok: inside the row): a tensor's row, or (Splits) the
// partial sums of fp8_wgmma_codes_linear added as fp8_reduce_splits adds them (split order, then
// · (ts[r] · ws[i])), so the value is the one the reduction would have stored.
struct RowDelta {
  const float* d;
  __device__ void operator()(float (&dv)[kV], int64_t r, int64_t D, const int64_t (&at)[kV],
                             const bool (&ok)[kV]) const {
#pragma unroll
    for (int v = 0; v < kV; ++v) dv[v] = ok[v] ? d[r * D + at[v]] : 0.0f;
  }
};
struct Splits {
  const float* part;
  int splits;
  int64_t R;
  const float* ts;
  const float* ws;
  __device__ void operator()(float (&dv)[kV], int64_t r, int64_t D, const int64_t (&at)[kV],
                             const bool (&ok)[kV]) const {
    int64_t idx[kV];
    float scale[kV];
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      idx[v] = r * D + at[v];
      scale[v] = ok[v] ? ts[r] * ws[at[v]] : 0.0f;
    }
    split_sums(dv, part, splits, R * D, idx, ok, scale);
  }
};

// residual += delta, then the zero-centred norm of the new residual.
template <class Delta>
__global__ void __launch_bounds__(kMaxThreads) add_rmsnorm_kernel(float* residual, float* out, const Delta delta,
                                                                 const float* w, int64_t D, float eps) {
  const int64_t r = blockIdx.x;
  float* x = residual + r * D;
  double ss = 0;
  for (int64_t base = 0; base < D; base += pass_len()) {
    float xv[kV], dv[kV];
    int64_t at[kV];
    bool ok[kV];
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      at[v] = elem(base, v);
      ok[v] = at[v] < D;
      xv[v] = ok[v] ? x[at[v]] : 0.0f;
    }
    delta(dv, r, D, at, ok);
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      xv[v] = xv[v] + dv[v];
      if (elem(base, v) < D) x[elem(base, v)] = xv[v];
      ss += static_cast<double>(xv[v]) * xv[v];
    }
  }
  // write_norm reads back only elements this thread wrote.
  write_norm(out + r * D, x, w, inv_rms_of(block_sum_d(ss), D, eps), D);
}

__global__ void __launch_bounds__(kMaxThreads) gated_rmsnorm_kernel(float* out, const float* x, const float* z,
                                                                   const float* w, int64_t D, float eps) {
  const int64_t r = blockIdx.x;
  const float s = inv_rms_of(block_sum_d(row_sumsq(x + r * D, D)), D, eps);
  for (int64_t base = 0; base < D; base += pass_len()) {
    float xv[kV], zv[kV], wv[kV];
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int64_t i = elem(base, v);
      xv[v] = i < D ? x[r * D + i] : 0.0f;
      zv[v] = i < D ? z[r * D + i] : 0.0f;
      wv[v] = i < D ? w[i] : 0.0f;
    }
#pragma unroll
    for (int v = 0; v < kV; ++v)
      if (elem(base, v) < D) out[r * D + elem(base, v)] = xv[v] * s * wv[v] * silu_f(zv[v]);
  }
}

// gated_rmsnorm of a token's Hv rows of dv <= 128 (the GDN heads), then quantize_rows_kernel of the
// token's [Hv dv] result (dynamic scale, wgmma order), one block of kGatedThreads per token. Each
// warp normalises whole heads exactly as gated_rmsnorm_kernel does with its one warp per row (the
// same elements per lane, the same double sum and warp reduction), so the values are bitwise the
// same; they wait in shared memory ([Hv dv] f32) for the token's amax.
constexpr int kGatedThreads = 256;
__global__ void __launch_bounds__(kGatedThreads) gated_rmsnorm_codes_kernel(__half* values, float* scales,
                                                                           const float* x, const float* z,
                                                                           const float* w, int64_t Hv, int64_t dv,
                                                                           float eps) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // as quantize_rows_kernel
  extern __shared__ float normed[];
  const int64_t t = blockIdx.x, K = Hv * dv;
  const int lane = threadIdx.x % 32;
  float amax = 0.0f;
  for (int64_t hd = threadIdx.x / 32; hd < Hv; hd += kGatedThreads / 32) {
    const float* xr = x + t * K + hd * dv;
    const float* zr = z + t * K + hd * dv;
    float xv[kV], zv[kV], wv[kV];
    double ss = 0;
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int64_t i = static_cast<int64_t>(v) * 32 + lane;
      xv[v] = i < dv ? xr[i] : 0.0f;
      zv[v] = i < dv ? zr[i] : 0.0f;
      wv[v] = i < dv ? w[i] : 0.0f;
      ss += static_cast<double>(xv[v]) * xv[v];
    }
    const float s = inv_rms_of(warp_sum_d(ss), dv, eps);
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int64_t i = static_cast<int64_t>(v) * 32 + lane;
      if (i < dv) {
        const float o = xv[v] * s * wv[v] * silu_f(zv[v]);
        normed[hd * dv + i] = o;
        amax = fmaxf(amax, fabsf(o));
      }
    }
  }
  const float s = fp8_token_scale_from_amax(block_amax<kGatedThreads>(amax));
  __half* row = values + t * fp8_wgmma_row(K);
  for (int64_t k = threadIdx.x * 4; k < fp8_wgmma_row(K); k += kGatedThreads * 4)
    store_codes4<Fp8CodeOrder::kWgmma64>(row, k,
                                         k < K ? codes4(*reinterpret_cast<const float4*>(normed + k), s) : 0u);
  if (threadIdx.x == 0) scales[t] = s;
}

// add_gated_shared_rmsnorm, one block per row: the gate logit h . w (each thread's products summed
// in element order, then warp sums added in warp order), d += sigmoid(logit) y, residual += d, then
// h = the zero-centred norm of the residual. Every read of h (the logit) precedes the barrier in
// the logit's reduction; h is written only after it.
__global__ void __launch_bounds__(kMaxThreads) add_gated_shared_rmsnorm_kernel(
    float* residual, float* h, float* d, const float* y, const void* gw, bool bf16, const float* w, int64_t D,
    float eps) {
  const int64_t r = blockIdx.x;
  float acc = 0.0f;
  for (int64_t base = 0; base < D; base += pass_len()) {
    float hv[kV], gv[kV];
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int64_t i = elem(base, v);
      hv[v] = i < D ? h[r * D + i] : 0.0f;
      gv[v] = i < D ? load_weight(gw, bf16, i) : 0.0f;
    }
#pragma unroll
    for (int v = 0; v < kV; ++v) acc += hv[v] * gv[v];
  }
  const float s = sigmoid_f(block_sum_f(acc));
  float* x = residual + r * D;
  double ss = 0;
  for (int64_t base = 0; base < D; base += pass_len()) {
    float dv[kV], yv[kV], xv[kV];
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const int64_t i = elem(base, v);
      dv[v] = i < D ? d[r * D + i] : 0.0f;
      yv[v] = i < D ? y[r * D + i] : 0.0f;
      xv[v] = i < D ? x[i] : 0.0f;
    }
#pragma unroll
    for (int v = 0; v < kV; ++v) {
      const float di = dv[v] + s * yv[v];
      xv[v] = xv[v] + di;
      if (elem(base, v) < D) {
        d[r * D + elem(base, v)] = di;
        x[elem(base, v)] = xv[v];
      }
      ss += static_cast<double>(xv[v]) * xv[v];
    }
  }
  write_norm(h + r * D, x, w, inv_rms_of(block_sum_d(ss), D, eps), D);
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
  add_gated_shared_rmsnorm_kernel<<<static_cast<unsigned>(R), row_threads(D), 0, stream_>>>(
      residual.ptr<float>(), h.ptr<float>(), d.ptr<float>(), y.ptr<const float>(), shared_gate.weight.data,
      shared_gate.format == WeightFormat::kBf16, norm_w.ptr<const float>(), D, eps);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::rmsnorm(const Tensor& out, const Tensor& x, const Tensor& w, float eps) {
  const int64_t D = w.numel(), R = x.numel() / D;
  CHECK(x.numel() == R * D && out.numel() == x.numel());
  if (R == 0) return;
  rmsnorm_kernel<<<static_cast<unsigned>(R), row_threads(D), 0, stream_>>>(out.ptr<float>(), x.ptr<const float>(),
                                                                     w.ptr<const float>(), D, eps);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::add_rmsnorm(const Tensor& residual, const Tensor& out, const Tensor& delta, const Tensor& w,
                              float eps) {
  const int64_t D = w.numel(), R = residual.numel() / D;
  CHECK(residual.numel() == delta.numel() && out.numel() == residual.numel() && residual.numel() == R * D);
  if (R == 0) return;
  add_rmsnorm_kernel<<<static_cast<unsigned>(R), row_threads(D), 0, stream_>>>(
      residual.ptr<float>(), out.ptr<float>(), RowDelta{delta.ptr<const float>()}, w.ptr<const float>(), D, eps);
  CUDA_CHECK_LAUNCH();
}

void fp8_splits_add_rmsnorm(cudaStream_t s, float* residual, float* out, const float* part, int splits,
                            const float* ts, const float* ws, const float* norm_w, int64_t R, int64_t D, float eps) {
  if (R == 0) return;
  add_rmsnorm_kernel<<<static_cast<unsigned>(R), row_threads(D), 0, s>>>(residual, out, Splits{part, splits, R, ts, ws},
                                                                         norm_w, D, eps);
  CUDA_CHECK_LAUNCH();
}

void fp8_gated_rmsnorm_codes(cudaStream_t s, __half* values, float* scales, const float* x, const float* z,
                             const float* w, int64_t T, int64_t Hv, int64_t dv, float eps) {
  CHECK(dv <= kFp8GatedNormMaxDv && Hv * dv <= kFp8GatedNormMaxK && (Hv * dv) % 16 == 0 && T <= INT32_MAX);
  if (T == 0) return;
  gated_rmsnorm_codes_kernel<<<static_cast<unsigned>(T), kGatedThreads, static_cast<size_t>(Hv * dv) * 4, s>>>(
      values, scales, x, z, w, Hv, dv, eps);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::gated_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& z, const Tensor& w, float eps) {
  const int64_t D = w.numel(), R = x.numel() / D;
  CHECK(x.numel() == R * D && z.numel() == x.numel() && out.numel() == x.numel());
  if (R == 0) return;
  gated_rmsnorm_kernel<<<static_cast<unsigned>(R), row_threads(D), 0, stream_>>>(
      out.ptr<float>(), x.ptr<const float>(), z.ptr<const float>(), w.ptr<const float>(), D, eps);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sparkserve
