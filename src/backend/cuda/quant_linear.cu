// Quantized y = x W^T on CUDA (NVFP4 compressed-tensors / ModelOpt, FP8 channel / tensor), for linear
// and the routed experts. The weights stay packed in device memory (NVFP4: E2M1 nibbles + E4M3 block
// scales + f32 global scale per partition; FP8: E4M3 codes + f32 row scales) and are decoded in
// registers inside a warp-per-output-row GEMV, so only the quantized bytes are read.
// Numerics follow backend/cpu/quant_linear.cpp (the specification) step for step:
//   activation kNvfp4: x fake-quantized per 16 with the partition's input scale, the same f32
//     operations in the same order as core/nvfp4.cpp (bit-identical x̂; W4A4 is discontinuous, so a
//     different x̂ would flip codes);
//   activation kFp8*: x -> E4M3 codes with the per-token (or static) scale, the code values summed
//     against the unscaled weight codes, then y = (double)s_t · ws[n] · sum;
//   kNone: x as is, the weight fully dequantized.
// Only the summation order differs from the CPU (f32 in both), hence the 1e-5 relative bound of the
// other fp32 ops. Prefill uses the same GEMV per row (correct, not fast: a dequantizing tensor-core
// GEMM is the planned prefill path, docs/performance.md).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/quant_math.cuh"
#include "core/check.h"

namespace sparkserve {
namespace {

constexpr int kWarps = 8;

struct QuantArgs {
  int64_t R, x_div, K, N, Np, P;
  const int32_t* ids;  // [R] expert of each row, or null (expert 0)
  const uint8_t* w;
  const uint8_t* wscale;     // nvfp4: e4m3 [E, N, K/16]; fp8: f32 [E, N] (as bytes)
  const float* global_scale;  // [E, P] nvfp4
  const float* input_scale;   // [E, P]
  int format;                 // 0 nvfp4 ct, 1 nvfp4 modelopt, 2 fp8
  int act;                    // ActivationQuant
};

// xa[p, r, :] = the quantized activation of x[r / x_div] for partition p (values the product sees);
// tscale[p, r] = the FP8 activation scale. grid (R, P), 256 threads.
__global__ void prep_activation_kernel(float* xa, float* tscale, const float* x, QuantArgs a) {
  const int64_t r = blockIdx.x, p = blockIdx.y;
  const int64_t K = a.K;
  const int64_t e = a.ids ? a.ids[r] : 0;
  const float* xr = x + (r / a.x_div) * K;
  float* o = xa + (p * a.R + r) * K;
  if (a.act == static_cast<int>(ActivationQuant::kNvfp4)) {
    const bool modelopt = a.format == 1;
    const float in_s = a.input_scale[e * a.P + p];
    const float gs = modelopt ? 1.0f / in_s : in_s;
    for (int64_t b = threadIdx.x; b < K / 16; b += blockDim.x) nvfp4_fake_quant_block(xr + b * 16, o + b * 16, gs, in_s, modelopt);
    return;
  }
  // FP8: amax over the row (order-free), then codes.
  __shared__ float red[32];
  float s;
  if (a.act == static_cast<int>(ActivationQuant::kFp8TokenDynamic)) {
    float amax = 0.0f;
    for (int64_t k = threadIdx.x; k < K; k += blockDim.x) amax = fmaxf(amax, fabsf(xr[k]));
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = amax;
    __syncthreads();
    amax = 0.0f;
    for (int i = 0; i < static_cast<int>(blockDim.x / 32); ++i) amax = fmaxf(amax, red[i]);
    s = fp8_token_scale_from_amax(amax);
  } else {
    s = a.input_scale[e * a.P + p];
  }
  for (int64_t k = threadIdx.x; k < K; k += blockDim.x) o[k] = fp8_quant_value(xr[k], s);
  if (threadIdx.x == 0) tscale[p * a.R + r] = s;
}

// out[r, n] = xa_p[r] . W_e[n] with W decoded in registers. grid (R, ceil(N / 8)), 8 warps.
__global__ void __launch_bounds__(kWarps * 32) quant_gemv_kernel(float* out, const float* x, const float* xa,
                                                                 const float* tscale, QuantArgs a, bool vec) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t r = blockIdx.x, n = static_cast<int64_t>(blockIdx.y) * kWarps + warp;
  if (n >= a.N) return;
  const int64_t K = a.K, N = a.N;
  const int64_t e = a.ids ? a.ids[r] : 0;
  const int64_t p = n / a.Np;
  const bool quant_act = a.act != static_cast<int>(ActivationQuant::kNone);
  const float* xr = quant_act ? xa + (p * a.R + r) * K : x + (r / a.x_div) * K;
  float acc = 0.0f;
  if (a.format != 2) {
    const uint8_t* row = a.w + (e * N + n) * (K / 2);
    const uint8_t* sc = a.wscale + (e * N + n) * (K / 16);
    const float g = a.global_scale[e * a.P + p];
    for (int64_t b = lane; b < K / 16; b += 32) {
      const float sf = fp8_to_f32(sc[b]);
      const float factor = a.format == 1 ? __fmul_rn(sf, g) : __fdiv_rn(sf, g);
      uint32_t lo, hi;
      if (vec) {
        const uint2 q = *reinterpret_cast<const uint2*>(row + b * 8);
        lo = q.x;
        hi = q.y;
      } else {
        lo = hi = 0;
        for (int i = 0; i < 4; ++i) {
          lo |= static_cast<uint32_t>(row[b * 8 + i]) << (8 * i);
          hi |= static_cast<uint32_t>(row[b * 8 + 4 + i]) << (8 * i);
        }
      }
      const float* xb = xr + b * 16;
#pragma unroll
      for (int i = 0; i < 8; ++i) acc += __fmul_rn(e2m1_value(lo >> (4 * i)), factor) * xb[i];
#pragma unroll
      for (int i = 0; i < 8; ++i) acc += __fmul_rn(e2m1_value(hi >> (4 * i)), factor) * xb[8 + i];
    }
  } else {
    const uint8_t* row = a.w + (e * N + n) * K;
    const float ws = reinterpret_cast<const float*>(a.wscale)[e * N + n];
    const float wmul = quant_act ? 1.0f : ws;
    if (vec) {
      for (int64_t k = lane * 4; k < K; k += 128) {
        const uint32_t q = *reinterpret_cast<const uint32_t*>(row + k);
#pragma unroll
        for (int i = 0; i < 4; ++i) acc += __fmul_rn(fp8_to_f32(static_cast<uint8_t>(q >> (8 * i))), wmul) * xr[k + i];
      }
    } else {
      for (int64_t k = lane; k < K; k += 32) acc += __fmul_rn(fp8_to_f32(row[k]), wmul) * xr[k];
    }
    acc = warp_sum(acc);
    if (lane == 0) {
      out[r * N + n] = quant_act ? static_cast<float>(static_cast<double>(tscale[p * a.R + r]) * ws *
                                                      static_cast<double>(acc))
                                 : acc;
    }
    return;
  }
  acc = warp_sum(acc);
  if (lane == 0) out[r * N + n] = acc;
}

}  // namespace

void CudaBackend::quant_matmul(float* out, const float* x, int64_t R, int64_t x_div, const int32_t* ids,
                               const Linear& w) {
  const int64_t K = w.in_features, N = w.out_features, P = w.partitions;
  CHECK(P >= 1 && N % P == 0);
  if (R == 0 || N == 0) return;
  const bool nvfp4 = is_nvfp4(w.format);
  CHECK_MSG(nvfp4 || is_fp8(w.format), "CUDA quant_matmul: not a quantized format");
  if (nvfp4) CHECK(K % 16 == 0);
  if (nvfp4) CHECK(w.activation == ActivationQuant::kNone || w.activation == ActivationQuant::kNvfp4);
  if (!nvfp4) CHECK(w.activation != ActivationQuant::kNvfp4);
  QuantArgs a{};
  a.R = R;
  a.x_div = x_div;
  a.K = K;
  a.N = N;
  a.Np = N / P;
  a.P = P;
  a.ids = ids;
  a.w = static_cast<const uint8_t*>(w.weight.data);
  a.wscale = static_cast<const uint8_t*>(w.weight_scale.data);
  a.global_scale = nvfp4 ? static_cast<const float*>(w.global_scale.data) : nullptr;
  a.input_scale = w.input_scale.data ? static_cast<const float*>(w.input_scale.data) : nullptr;
  a.format = !nvfp4 ? 2 : (w.format == WeightFormat::kNvfp4ModelOpt ? 1 : 0);
  a.act = static_cast<int>(w.activation);
  const bool quant_act = w.activation != ActivationQuant::kNone;
  if (quant_act && w.activation != ActivationQuant::kFp8TokenDynamic) CHECK(a.input_scale != nullptr);
  Scratch xa(this, quant_act ? static_cast<size_t>(P * R * K) * 4 : 0);
  Scratch ts(this, quant_act ? static_cast<size_t>(P * R) * 4 : 0);
  if (quant_act) {
    prep_activation_kernel<<<dim3(static_cast<unsigned>(R), static_cast<unsigned>(P)), 256, 0, stream_>>>(
        xa.as<float>(), ts.as<float>(), x, a);
    CUDA_CHECK_LAUNCH();
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(a.w);
  const bool vec = nvfp4 ? (base % 8 == 0 && (K / 2) % 8 == 0) : (base % 4 == 0 && K % 4 == 0);
  quant_gemv_kernel<<<dim3(static_cast<unsigned>(R), blocks_for(N, kWarps)), kWarps * 32, 0, stream_>>>(
      out, x, xa.as<const float>(), ts.as<const float>(), a, vec);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sparkserve
