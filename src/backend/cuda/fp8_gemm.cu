// W8A8 FP8 Linear on the tensor cores for prefill-sized T through cuBLASLt (tc_gemm.h), where
// fp8_gemm_wgmma.cu's kernel does not run (the Blackwell targets; sm_90a takes that kernel, which
// reads the FP8 weights itself instead of converting them per call). Also the W8A8 activation
// quantization of every tensor-core path.
//
// Numerics vs the CPU specification (core/fp8_quant.cpp, backend/cpu/quant_linear.cpp): the
// activation codes and scales are the CPU's bit for bit (same f32 amax, the same __fdiv_rn(x, s)
// and round-to-nearest-even saturating E4M3 conversion). Every E4M3 value is exact in f16 (4
// significant bits, exponents 2^-9..2^8), so the codes of both sides go to the f16 tensor cores
// unchanged: each product is exact in f32 and the sums are f32 (cuBLASLt, CUBLAS_COMPUTE_32F), like
// the CPU's f32 sums of the same exact products in another order; s_t · ws[n] is applied after the
// sum, in f32 (the CPU: in double). Measured on the H200: 1.2e-7..4.9e-7 of max|ref|, like the GEMVs.
// Hopper's FP8 tensor cores were measured too and not kept (docs/performance.md): their partial sums
// keep ~14 significant bits, 1.3e-4..2.1e-4 of max|ref| on random data (fast accumulation 1.4e-3..3.5e-3),
// enough to flip W8A8 re-quantization codes downstream (fixture logits 1e-2 off the CPU's), for 1.4x
// the throughput at 8192 tokens.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cublaslt.h"
#include "backend/cuda/fp8_codes.cuh"
#include "backend/cuda/launch_config.cuh"
#include "backend/cuda/quant_math.cuh"
#include "backend/cuda/tc_gemm.h"
#include "core/check.h"

namespace sparkserve {
namespace {

constexpr int kQuantThreads = 256;
constexpr size_t kWorkspaceBytes = size_t{32} << 20;  // cuBLASLt's advice for Hopper (split-K / stream-K)

// One block per token row: the row's amax (max is order-free, so the CPU's value), the scale
// max(amax / 448, 1 / (448 · 512)), then four codes per thread and step: fp8(x / s) by the hardware
// conversion (round to nearest even, saturating to ±448: core/dtype's f32_to_fp8_e4m3 for finite x),
// stored as the codes' f16 values in row `ld` apart, in the k order `kOrder` (fp8_code_pos); positions
// k in [K, ld) get +0.
template <Fp8CodeOrder kOrder>
__global__ void __launch_bounds__(kQuantThreads) quantize_rows_kernel(__half* values, float* scales, const float* x,
                                                                     int64_t K, int64_t ld, const float* static_scale) {
  // The GEMM after this may start now (fp8_gemm_wgmma.cu, fp8_small_n.cu: programmatic dependent
  // launch): it streams its weights meanwhile and waits for these codes at griddepcontrol.wait. This
  // kernel is launched the same way: it waits for the kernel that wrote x before touching memory. Both
  // no-ops for launches that did not ask for them.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int64_t t = blockIdx.x;
  const float* xr = x + t * K;
  float s;
  if (static_scale) {
    s = *static_scale;
  } else {
    float amax = 0.0f;
    for (int64_t k = threadIdx.x * 4; k < K; k += kQuantThreads * 4) {
      const float4 v = *reinterpret_cast<const float4*>(xr + k);
      amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
    }
    s = fp8_token_scale_from_amax(block_amax<kQuantThreads>(amax));
  }
  __half* row = values + t * ld;
  for (int64_t k = threadIdx.x * 4; k < ld; k += kQuantThreads * 4) {
    // +0 past K
    store_codes4<kOrder>(row, k, k < K ? codes4(*reinterpret_cast<const float4*>(xr + k), s) : 0u);
  }
  if (threadIdx.x == 0) scales[t] = s;
}

// silu_mul then quantize_rows_kernel (dynamic scales, wgmma order), one block per token row. The
// gate_up product arrives as values (splits == 1) or as fp8_wgmma_codes_linear's unscaled partial
// sums, added as fp8_reduce_splits adds them (split order, then · (ts[t] · ws[n])), so every value,
// the activation silu(g) · u and its code are those of the unfused ops bit for bit. The activations
// wait in shared memory ([I] f32) for the row's amax.
__global__ void __launch_bounds__(kQuantThreads) silu_mul_quantize_kernel(__half* values, float* scales,
                                                                         const float* gu, int splits, int64_t T,
                                                                         int64_t I, const float* ts, const float* ws) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // as quantize_rows_kernel
  extern __shared__ float act[];
  const int64_t t = blockIdx.x, N = 2 * I;
  float amax = 0.0f;
  for (int64_t c = threadIdx.x; c < I; c += kQuantThreads) {
    float p[2];  // gate c, up c
    if (splits == 1) {
      p[0] = gu[t * N + c];
      p[1] = gu[t * N + I + c];
    } else {
      const int64_t at[2] = {t * N + c, t * N + I + c};
      const bool ok[2] = {true, true};
      const float scale[2] = {ts[t] * ws[c], ts[t] * ws[I + c]};
      split_sums(p, gu, splits, T * N, at, ok, scale);
    }
    const float a = silu_f(p[0]) * p[1];
    act[c] = a;
    amax = fmaxf(amax, fabsf(a));
  }
  const float s = fp8_token_scale_from_amax(block_amax<kQuantThreads>(amax));  // its barrier orders act[]
  __half* row = values + t * fp8_wgmma_row(I);
  for (int64_t k = threadIdx.x * 4; k < fp8_wgmma_row(I); k += kQuantThreads * 4)
    store_codes4<Fp8CodeOrder::kWgmma64>(row, k, k < I ? codes4(*reinterpret_cast<const float4*>(act + k), s) : 0u);
  if (threadIdx.x == 0) scales[t] = s;
}

// E4M3 weight codes -> their f16 values (exact), 16 per thread. n16: bytes / 16.
__global__ void fp8_to_f16_kernel(__half* out, const uint8_t* w, int64_t n16) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= n16) return;
  const uint4 q = reinterpret_cast<const uint4*>(w)[i];
  const uint2 o[4] = {f16x4_of(q.x), f16x4_of(q.y), f16x4_of(q.z), f16x4_of(q.w)};
  uint4* dst = reinterpret_cast<uint4*>(out) + 2 * i;
  dst[0] = make_uint4(o[0].x, o[0].y, o[1].x, o[1].y);
  dst[1] = make_uint4(o[2].x, o[2].y, o[3].x, o[3].y);
}

// out[t, i] *= ts[t] · ws[i] for the partition's cols columns (ldo apart per token).
__global__ void scale_outer_kernel(float* out, int64_t ldo, int64_t T, int64_t cols, const float* ts,
                                   const float* ws) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * cols) return;
  const int64_t t = i / cols, n = i % cols;
  out[t * ldo + n] *= ts[t] * ws[n];
}

}  // namespace

void fp8_quantize_rows_f16(cudaStream_t s, __half* values, float* scales, const float* x, int64_t T, int64_t K,
                           const float* static_scale, Fp8CodeOrder order) {
  if (T == 0) return;
  CHECK(K % 4 == 0 && T <= INT32_MAX);
  // Programmatic stream serialization: launched while the kernel before it finishes (it waits for
  // that kernel's results at griddepcontrol.wait).
  const PdlLaunch l(dim3(static_cast<unsigned>(T)), dim3(kQuantThreads), 0, s);
  if (order == Fp8CodeOrder::kNatural) {
    CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, quantize_rows_kernel<Fp8CodeOrder::kNatural>, values, scales, x, K, K,
                                  static_scale));
  } else {
    CHECK(K % 16 == 0);
    CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, quantize_rows_kernel<Fp8CodeOrder::kWgmma64>, values, scales, x, K,
                                  fp8_wgmma_row(K), static_scale));
  }
}
void fp8_silu_mul_quantize(cudaStream_t s, __half* values, float* scales, const float* gu, int splits, int64_t T,
                           int64_t I, const float* ts, const float* ws) {
  CHECK(I % 16 == 0 && I <= kFp8SiluQuantMaxI && T <= INT32_MAX);
  const size_t smem = static_cast<size_t>(I) * 4;  // <= 48 KB: no opt-in
  if (T == 0) return;
  silu_mul_quantize_kernel<<<static_cast<unsigned>(T), kQuantThreads, smem, s>>>(values, scales, gu, splits, T, I, ts,
                                                                                  ws);
  CUDA_CHECK_LAUNCH();
}
void fp8_scale_outer(cudaStream_t s, float* out, int64_t ldo, int64_t T, int64_t cols, const float* ts,
                     const float* ws) {
  if (T * cols == 0) return;
  scale_outer_kernel<<<blocks_for(T * cols, 256), 256, 0, s>>>(out, ldo, T, cols, ts, ws);
  CUDA_CHECK_LAUNCH();
}

bool fp8_w8a8_takes(const Linear& w, int64_t k_multiple) {
  if (!is_fp8(w.format)) return false;
  if (w.activation != ActivationQuant::kFp8TokenDynamic && w.activation != ActivationQuant::kFp8TensorStatic)
    return false;
  if (w.activation == ActivationQuant::kFp8TensorStatic && !w.input_scale.data) return false;
  const int64_t K = w.in_features, N = w.out_features, P = w.partitions;
  return K > 0 && K % k_multiple == 0 && P >= 1 && N % P == 0 &&
         (reinterpret_cast<uintptr_t>(w.weight.data) & 15u) == 0;
}

bool fp8_gemm_takes(const Linear& w) { return fp8_w8a8_takes(w, 16); }

bool fp8_gemm_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w) {
  if (!fp8_gemm_takes(w) || (reinterpret_cast<uintptr_t>(x) & 15u) != 0 || !lt_available()) return false;
  const int64_t K = w.in_features, N = w.out_features;
  if (T == 0 || N == 0) return true;
  // A static activation scale may differ per partition: each partition's rows get x quantized
  // with its own scale. Dynamic scales are per token, the same for every partition.
  const bool per_partition = w.activation == ActivationQuant::kFp8TensorStatic && w.partitions > 1;
  const int64_t parts = per_partition ? w.partitions : 1, rows = N / parts;
  CudaBackend::Scratch xq(&b, static_cast<size_t>(T * K) * 2), scales(&b, static_cast<size_t>(T) * 4),
      wh(&b, static_cast<size_t>(N * K) * 2), workspace(&b, kWorkspaceBytes);
  const auto* wq = static_cast<const uint8_t*>(w.weight.data);
  const auto* ws = static_cast<const float*>(w.weight_scale.data);
  const auto* is = static_cast<const float*>(w.input_scale.data);
  LtMatmul m;
  m.ab_type = CUDA_R_16F;
  m.m = rows;
  m.n = T;
  m.k = K;
  m.lda = K;
  m.b = xq.ptr;
  m.ldb = K;
  m.ldd = N;
  auto partition = [&](int64_t p) {
    m.a = wh.as<__half>() + p * rows * K;
    m.d = out + p * rows;
  };
  for (int64_t p = 0; p < parts; ++p) {  // every partition's problem taken before anything runs
    partition(p);
    if (!lt_plan(m, kWorkspaceBytes)) return false;
  }
  fp8_to_f16_kernel<<<blocks_for(N * K / 16, 256), 256, 0, b.stream()>>>(wh.as<__half>(), wq, N * K / 16);
  CUDA_CHECK_LAUNCH();
  for (int64_t p = 0; p < parts; ++p) {
    fp8_quantize_rows_f16(b.stream(), xq.as<__half>(), scales.as<float>(), x, T, K,
                          w.activation == ActivationQuant::kFp8TensorStatic ? is + p : nullptr);
    partition(p);
    CHECK_MSG(lt_matmul(m, b.stream(), workspace.ptr, kWorkspaceBytes), "cuBLASLt refused a planned W8A8 matmul");
    fp8_scale_outer(b.stream(), out + p * rows, N, T, rows, scales.as<float>(), ws + p * rows);
  }
  return true;
}

}  // namespace sparkserve
