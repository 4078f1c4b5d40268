// Device-side NVFP4 / FP8 scalar numerics shared by quant_linear.cu and the GEMVs (gemv_rows.cuh): the CPU
// reference's operations (core/nvfp4.cpp, core/fp8_quant.cpp) written as CUDA device functions, so
// that activation quantization on the GPU produces bit-identical codes (W4A4 / W8A8 quantization is a
// step function: any other rounding would flip codes).
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace sparkserve {

// E4M3 code -> f32 (NaN for the two NaN codes), exact: every E4M3 value is an fp16 value, and the
// hardware conversion (one instruction on sm_89 and later) gives it.
__device__ __forceinline__ float fp8_to_f32(uint8_t v) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3)));
}

// Round-to-nearest-even, saturating to ±448 (the CPU's f32_to_fp8_e4m3 for finite values).
__device__ __forceinline__ uint8_t f32_to_fp8(float f) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
}

// E2M1 code -> value by building the f32 bits (no local-memory table): magnitude index m = 0..7 is
// 0, 0.5, then 2^((m>>1)-1)·(1 + (m&1)/2) = 1, 1.5, 2, 3, 4, 6; bit 3 is the sign (code 8 = -0).
__device__ __forceinline__ float e2m1_value(uint32_t code) {
  const uint32_t m = code & 7u;
  uint32_t bits = m < 2u ? (m ? 0x3f000000u : 0u) : ((((m >> 1) + 126u) << 23) | ((m & 1u) << 22));
  bits |= (code & 8u) << 28;
  return __uint_as_float(bits);
}

// core/nvfp4.cpp f32_to_e2m1's threshold table (ties to even mantissa), zero always code 0; the
// magnitude index is the number of thresholds |x| passes (branch-free; NaN passes none -> 0).
__device__ __forceinline__ uint32_t f32_to_e2m1(float x) {
  const float a = fabsf(x);
  const uint32_t mag = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return (mag != 0 && x < 0) ? (mag | 8u) : mag;
}

// The per-block quantities of core/nvfp4.cpp's activation quantization from the block's amax:
// sf = fp8(min(gs·(amax/6), 448)) widened, and out_scale = 1/(sf·(1/gs)) (0 when that is 0).
__device__ __forceinline__ void nvfp4_block_scales(float amax, float gs, float& sf, float& out_scale) {
  const float sf_value = fminf(__fmul_rn(gs, __fdiv_rn(amax, 6.0f)), 448.0f);
  sf = fp8_to_f32(f32_to_fp8(sf_value));
  const float inv_gs = gs == 0.0f ? 0.0f : __fdiv_rn(1.0f, gs);
  const float denom = __fmul_rn(sf, inv_gs);
  out_scale = denom == 0.0f ? 0.0f : __fdiv_rn(1.0f, denom);
}
// Four consecutive values of a 16-value activation block whose other twelve values the three
// neighbouring lanes hold (lanes 4q..4q+3 together hold one block, every lane of the warp calls
// this), quantized as core/nvfp4.cpp does with the quantize-direction global scale gs: the four
// E2M1 codes and the block's scale sf (widened from E4M3).
__device__ __forceinline__ void nvfp4_quantize_quad(float4 v, float gs, uint32_t (&codes)[4], float& sf) {
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
  float out_scale;
  nvfp4_block_scales(amax, gs, sf, out_scale);
  const float vv[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) codes[i] = f32_to_e2m1(fminf(fmaxf(__fmul_rn(vv[i], out_scale), -6.0f), 6.0f));
}
// One value's x̂ given its block's sf / out_scale (backend/cpu/quant_linear.cpp's dequantization).
__device__ __forceinline__ float nvfp4_fake_quant_value(float x, float sf, float out_scale, float gs, float in_s,
                                                        bool modelopt) {
  const float scaled = fminf(fmaxf(__fmul_rn(x, out_scale), -6.0f), 6.0f);
  const float v = __fmul_rn(e2m1_value(f32_to_e2m1(scaled)), sf);
  return modelopt ? __fmul_rn(v, in_s) : __fdiv_rn(v, gs);
}

// One 16-value NVFP4 activation block fake-quantized exactly as core/nvfp4.cpp
// nvfp4_quantize_activation_row followed by backend/cpu/quant_linear.cpp's dequantization:
// x̂ = e2m1(q)·fp8(sf) / gs (compressed-tensors) or · input_scale (ModelOpt, gs = 1 / input_scale).
// xb: 16 f32 -> o: 16 f32 (may be any memory)
__device__ __forceinline__ void nvfp4_fake_quant_block(const float* xb, float* o, float gs, float in_s, bool modelopt) {
  float amax = 0.0f;
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(xb[i]));
  float sf, out_scale;
  nvfp4_block_scales(amax, gs, sf, out_scale);
  for (int i = 0; i < 16; ++i) o[i] = nvfp4_fake_quant_value(xb[i], sf, out_scale, gs, in_s, modelopt);
}

// FP8 per-token dynamic scale from the row's amax: max(amax / 448, 1 / (448·512)) (core/fp8_quant.cpp).
__device__ __forceinline__ float fp8_token_scale_from_amax(float amax) {
  return fmaxf(__fdiv_rn(amax, 448.0f), 1.0f / (448.0f * 512.0f));
}
// The value of x's E4M3 code at scale s: fp8(x / s) widened.
__device__ __forceinline__ float fp8_quant_value(float x, float s) { return fp8_to_f32(f32_to_fp8(__fdiv_rn(x, s))); }

}  // namespace sparkserve
