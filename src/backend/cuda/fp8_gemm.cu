// W8A8 FP8 Linear on the tensor cores (tc_gemm.h): prefill and batched-decode token counts.
//
// Numerics vs the CPU specification (core/fp8_quant.cpp, backend/cpu/quant_linear.cpp): the
// activation codes and scales are the CPU's bit for bit (same f32 amax, the same __fdiv_rn(x, s)
// and round-to-nearest-even saturating E4M3 conversion); every product q_x · q_w is exact (two
// 4-bit significands); the CPU sums them in double, the tensor cores in f32 with promotion of the
// partial sums to full fp32 at cuBLASLt's k-block boundaries (fast_accum off), then s_t · ws[n]
// is applied in f32 (the CPU: in double). The difference is the f32 summation error of the same
// exact products: tests/gpu/gemm_checks.cpp bounds it against Σ|products| and states the measure.
#include <cuda_fp8.h>

#include <cmath>
#include <mutex>
#include <vector>

#include "backend/cuda/cublaslt.h"
#include "backend/cuda/quant_math.cuh"
#include "backend/cuda/tc_gemm.h"
#include "core/check.h"

namespace sparkserve {
namespace {

constexpr int kQuantThreads = 256;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's advice for Hopper (split-K / stream-K)

// One block per token row: the row's amax (max is order-free, so the CPU's value), the scale
// max(amax / 448, 1 / (448 · 512)), then four codes per thread and step: fp8(x / s) by the hardware
// conversion (round to nearest even, saturating to ±448: core/dtype's f32_to_fp8_e4m3 for finite x).
__global__ void __launch_bounds__(kQuantThreads) quantize_rows_kernel(uint8_t* codes, float* scales, const float* x,
                                                                     int64_t K, const float* static_scale) {
  const int64_t t = blockIdx.x;
  const float* xr = x + t * K;
  float s;
  if (static_scale) {
    s = *static_scale;
  } else {
    __shared__ float red[kQuantThreads / 32];
    float amax = 0.0f;
    for (int64_t k = threadIdx.x * 4; k < K; k += kQuantThreads * 4) {
      const float4 v = *reinterpret_cast<const float4*>(xr + k);
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = amax;
    __syncthreads();
    amax = 0.0f;
#pragma unroll
    for (int w = 0; w < kQuantThreads / 32; ++w) amax = fmaxf(amax, red[w]);
    s = fp8_token_scale_from_amax(amax);
  }
  for (int64_t k = threadIdx.x * 4; k < K; k += kQuantThreads * 4) {
    const float4 v = *reinterpret_cast<const float4*>(xr + k);
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(v.x, s), __fdiv_rn(v.y, s)), __NV_SATFINITE,
                                                 __NV_E4M3);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(v.z, s), __fdiv_rn(v.w, s)), __NV_SATFINITE,
                                                 __NV_E4M3);
    *reinterpret_cast<uint32_t*>(codes + t * K + k) = lo | (hi << 16);
  }
  if (threadIdx.x == 0) scales[t] = s;
}

// The scales where cuBLASLt cannot apply them: out[t, n0 + i] *= ts[t] · ws[i], i < cols.
__global__ void scale_outer_kernel(float* out, int64_t ldo, int64_t T, int64_t cols, const float* ts,
                                   const float* ws) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * cols) return;
  const int64_t t = i / cols, n = i % cols;
  out[t * ldo + n] *= ts[t] * ws[n];
}

// The thread's stream-capture mode made relaxed for a scope: the one-time probe below allocates,
// copies and synchronises on its own stream, which is legal while another stream is being captured
// but refused by the global / thread-local modes.
struct RelaxedCaptureMode {
  cudaStreamCaptureMode prev = cudaStreamCaptureModeRelaxed;
  RelaxedCaptureMode() { CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&prev)); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&prev); }
};

// Whether cuBLASLt computes FP8 matmuls here with `scale`, checked on a small problem whose exact
// answer is known (so a scale vector applied to the wrong side, or not at all, is caught too):
// A = 1.0 codes [64, 64], B = 2.0 codes [16, 64], scales 2^-(i % 4) and 2^(j % 3):
// d[j, i] = 128 · 2^-(i % 4) · 2^(j % 3) (kOuterVec) or 128 (kNone).
bool probe_fp8(LtMatmul::Scale scale) {
  constexpr int M = 64, N = 16, K = 64;
  RelaxedCaptureMode relaxed;
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  uint8_t *a = nullptr, *b = nullptr;
  float *as = nullptr, *bs = nullptr, *d = nullptr;
  void* ws = nullptr;
  CUDA_CHECK(cudaMalloc(&a, M * K));
  CUDA_CHECK(cudaMalloc(&b, N * K));
  CUDA_CHECK(cudaMalloc(&as, M * 4));
  CUDA_CHECK(cudaMalloc(&bs, N * 4));
  CUDA_CHECK(cudaMalloc(&d, M * N * 4));
  CUDA_CHECK(cudaMalloc(&ws, kWorkspaceBytes));
  std::vector<float> hs(M);
  for (int i = 0; i < M; ++i) hs[static_cast<size_t>(i)] = std::ldexp(1.0f, -(i % 4));
  CUDA_CHECK(cudaMemcpyAsync(as, hs.data(), M * 4, cudaMemcpyHostToDevice, s));
  for (int j = 0; j < N; ++j) hs[static_cast<size_t>(j)] = std::ldexp(1.0f, j % 3);
  CUDA_CHECK(cudaMemcpyAsync(bs, hs.data(), N * 4, cudaMemcpyHostToDevice, s));
  CUDA_CHECK(cudaMemsetAsync(a, 0x38, M * K, s));  // E4M3 1.0
  CUDA_CHECK(cudaMemsetAsync(b, 0x40, N * K, s));  // E4M3 2.0
  CUDA_CHECK(cudaMemsetAsync(d, 0, M * N * 4, s));
  LtMatmul p;
  p.ab_type = CUDA_R_8F_E4M3;
  p.m = M;
  p.n = N;
  p.k = K;
  p.a = a;
  p.lda = K;
  p.b = b;
  p.ldb = K;
  p.d = d;
  p.ldd = M;
  p.scale = scale;
  p.a_scale = as;
  p.b_scale = bs;
  bool ok = lt_matmul(p, s, ws, kWorkspaceBytes);
  std::vector<float> got(M * N);
  CUDA_CHECK(cudaMemcpyAsync(got.data(), d, M * N * 4, cudaMemcpyDeviceToHost, s));
  ok = cudaStreamSynchronize(s) == cudaSuccess && ok;
  for (int j = 0; j < N && ok; ++j)
    for (int i = 0; i < M && ok; ++i) {
      const float want = scale == LtMatmul::Scale::kOuterVec ? 128.0f * std::ldexp(1.0f, (j % 3) - (i % 4)) : 128.0f;
      ok = got[static_cast<size_t>(j * M + i)] == want;
    }
  (void)cudaGetLastError();  // a refused launch must not surface at the next op's check
  cudaFree(a);
  cudaFree(b);
  cudaFree(as);
  cudaFree(bs);
  cudaFree(d);
  cudaFree(ws);
  cudaStreamDestroy(s);
  return ok;
}

// What this device supports, probed once (the backend drives one device).
struct Fp8Support {
  bool outer_vec = false, unscaled = false;
};
const Fp8Support& fp8_support() {
  static std::once_flag once;
  static Fp8Support sup;
  std::call_once(once, [] {
    if (!lt_available()) return;
    sup.outer_vec = probe_fp8(LtMatmul::Scale::kOuterVec);
    sup.unscaled = probe_fp8(LtMatmul::Scale::kNone);
  });
  return sup;
}

}  // namespace

void fp8_quantize_rows(cudaStream_t s, uint8_t* codes, float* scales, const float* x, int64_t T, int64_t K,
                       const float* static_scale) {
  if (T == 0) return;
  CHECK(K % 4 == 0 && T <= INT32_MAX);
  quantize_rows_kernel<<<static_cast<unsigned>(T), kQuantThreads, 0, s>>>(codes, scales, x, K, static_scale);
  CUDA_CHECK_LAUNCH();
}

bool fp8_gemm_takes(const Linear& w) {
  if (!is_fp8(w.format)) return false;
  if (w.activation != ActivationQuant::kFp8TokenDynamic && w.activation != ActivationQuant::kFp8TensorStatic)
    return false;
  if (w.activation == ActivationQuant::kFp8TensorStatic && !w.input_scale.data) return false;
  const int64_t K = w.in_features, N = w.out_features, P = w.partitions;
  return K > 0 && K % 16 == 0 && P >= 1 && N % P == 0 && (reinterpret_cast<uintptr_t>(w.weight.data) & 15u) == 0;
}

bool fp8_gemm_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w, const Fp8GemmOptions& o) {
  if (!fp8_gemm_takes(w) || (reinterpret_cast<uintptr_t>(x) & 15u) != 0) return false;
  const Fp8Support& sup = fp8_support();
  bool outer = false;
  switch (o.scaling) {
    case Fp8Scaling::kAuto:
      outer = sup.outer_vec;
      if (!outer && !sup.unscaled) return false;
      break;
    case Fp8Scaling::kOuterVec:
      if (!sup.outer_vec) return false;
      outer = true;
      break;
    case Fp8Scaling::kEpilogue:
      if (!sup.unscaled) return false;
      break;
  }
  const int64_t K = w.in_features, N = w.out_features;
  if (T == 0 || N == 0) return true;
  // A static activation scale may differ per partition: each partition's rows get x quantized
  // with its own scale. Dynamic scales are per token, the same for every partition.
  const bool per_partition = w.activation == ActivationQuant::kFp8TensorStatic && w.partitions > 1;
  const int64_t parts = per_partition ? w.partitions : 1, rows = N / parts;
  CudaBackend::Scratch codes(&b, static_cast<size_t>(T * K)), scales(&b, static_cast<size_t>(T) * 4),
      workspace(&b, kWorkspaceBytes);
  const auto* wq = static_cast<const uint8_t*>(w.weight.data);
  const auto* ws = static_cast<const float*>(w.weight_scale.data);
  const auto* is = static_cast<const float*>(w.input_scale.data);
  LtMatmul m;
  m.ab_type = CUDA_R_8F_E4M3;
  m.m = rows;
  m.n = T;
  m.k = K;
  m.a = wq;
  m.lda = K;
  m.b = codes.as<uint8_t>();
  m.ldb = K;
  m.d = out;
  m.ldd = N;
  m.scale = outer ? LtMatmul::Scale::kOuterVec : LtMatmul::Scale::kNone;
  m.b_scale = scales.as<float>();
  m.fast_accum = o.fast_accum;
  auto partition = [&](int64_t p) {
    m.a = wq + p * rows * K;
    m.d = out + p * rows;
    m.a_scale = ws + p * rows;
  };
  for (int64_t p = 0; p < parts; ++p) {  // every partition's problem taken before anything runs
    partition(p);
    if (!lt_plan(m, kWorkspaceBytes)) return false;
  }
  for (int64_t p = 0; p < parts; ++p) {
    fp8_quantize_rows(b.stream(), codes.as<uint8_t>(), scales.as<float>(), x, T, K,
                      w.activation == ActivationQuant::kFp8TensorStatic ? is + p : nullptr);
    partition(p);
    CHECK_MSG(lt_matmul(m, b.stream(), workspace.ptr, kWorkspaceBytes), "cuBLASLt refused a planned FP8 matmul");
    if (!outer) {
      scale_outer_kernel<<<blocks_for(T * rows, 256), 256, 0, b.stream()>>>(out + p * rows, N, T, rows,
                                                                            scales.as<float>(), ws + p * rows);
      CUDA_CHECK_LAUNCH();
    }
  }
  return true;
}

}  // namespace sparkserve
