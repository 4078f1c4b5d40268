// NVFP4 reference numerics (checkpoint-formats.md §1): E2M1 codes, two per byte with the lower K
// index in the LOW nibble, one E4M3 block scale per 16 consecutive K values, and a per-tensor global
// scale that DIVIDES in compressed-tensors (weight_global_scale = 448·6/amax) and MULTIPLIES in
// ModelOpt (weight_scale_2 = amax/(448·6)). Plain scalar loops, written for clarity: they are the
// executable specification that faster kernels are compared against.
#pragma once

#include <cstdint>
#include <vector>

namespace sparkserve {

inline constexpr int kNvfp4BlockSize = 16;
inline constexpr float kE2M1Max = 6.0f;
inline constexpr float kE4M3Max = 448.0f;

// Rounds to the nearest E2M1 value with ties to the even mantissa and returns its 4-bit code (bit 3 =
// sign, only for values that do not round to zero). |x| > 6 gives ±6. Threshold table (§1.2):
// [0,.25]→0 (.25,.75)→.5 [.75,1.25]→1 (1.25,1.75)→1.5 [1.75,2.5]→2 (2.5,3.5)→3 [3.5,5]→4 >5→6.
uint8_t f32_to_e2m1(float x);

// The code of element k of a packed row: byte k/2, low nibble for even k.
// packed_row: [K/2] u8
inline uint8_t nvfp4_code(const uint8_t* packed_row, int64_t k) {
  uint8_t b = packed_row[k >> 1];
  return (k & 1) ? static_cast<uint8_t>(b >> 4) : static_cast<uint8_t>(b & 0xF);
}

// Packs codes (two per byte, lower index in the low nibble).
// codes: [n] (n even) -> packed: [n/2]
void nvfp4_pack(const uint8_t* codes, int64_t n, uint8_t* packed);

// Dequantizes a compressed-tensors NVFP4 weight: W[n,k] = e2m1 · fp8(scale[n,k/16]) / global_scale.
// The per-block factor fp8(scale)/global_scale is computed in f32 (e2m1·e4m3 is exact; only the
// division rounds).
// packed: [N, K/2] u8, scales: [N, K/16] e4m3 -> out: [N, K] f32
void nvfp4_dequant_ct(const uint8_t* packed, const uint8_t* scales, float weight_global_scale, int64_t N,
                      int64_t K, float* out);
// Dequantizes a ModelOpt NVFP4 weight: W[n,k] = e2m1 · fp8(scale[n,k/16]) · weight_scale_2.
// packed: [N, K/2] u8, scales: [N, K/16] e4m3 -> out: [N, K] f32
void nvfp4_dequant_modelopt(const uint8_t* packed, const uint8_t* scales, float weight_scale_2, int64_t N,
                            int64_t K, float* out);

// Run-time activation quantization of one row (vLLM ref_nvfp4_quant / compressed-tensors W4A4):
// per 16-value block b: sf_b = fp8(min(gs·amax_b/6, 448)); q = round_e2m1(clamp(x·(1/(sf_b·(1/gs))), ±6)).
// A zero sf gives a zero reciprocal (all codes 0).
// x: [K] f32 -> codes: [K] (one code per byte, unpacked), block_scales: [K/16] e4m3
void nvfp4_quantize_activation_row(const float* x, int64_t K, float input_global_scale, uint8_t* codes,
                                   uint8_t* block_scales);
// Quantize then dequantize one row: x̂ = e2m1(q) · fp8(sf) / gs (what a W4A4 GEMM sees).
// x: [K] f32 -> out: [K] f32
void nvfp4_fake_quant_activation_row(const float* x, int64_t K, float input_global_scale, float* out);

// A weight quantized the way compressed-tensors does (§1.4): global_scale = 448·6/amax(W) (1.0 when
// amax is 0 or not finite, as CT's nan_to_num), block scale = fp8(amax_block/6 · global_scale) with a
// zero scale replaced by FP8's eps 0.125, codes = round_e2m1(clamp(w / (scale/global_scale), ±6)).
struct Nvfp4Weight {
  int64_t N = 0, K = 0;
  std::vector<uint8_t> packed;  // [N, K/2]
  std::vector<uint8_t> scales;  // [N, K/16] e4m3
  float global_scale = 1.0f;    // CT convention (divides); ModelOpt weight_scale_2 = 1/global_scale
};
// w: [N, K] f32 (K a multiple of 16) -> Nvfp4Weight
Nvfp4Weight nvfp4_quantize_weight(const float* w, int64_t N, int64_t K);

// W4A4 linear as vLLM computes it: activations quantized per 16 with input_global_scale, then
// y[t,n] = Σ_k x̂[t,k]·Ŵ[n,k], accumulated in double (reference). Equivalent to
// alpha·Σ (q_a·sf_a)(q_w·sf_w) with alpha = 1/(input_global_scale·weight_global_scale).
// x: [T, K] f32, w: compressed-tensors NVFP4 [N, K] -> y: [T, N] f32
void nvfp4_linear_w4a4_ct(const float* x, int64_t T, int64_t K, const uint8_t* packed, const uint8_t* scales,
                          float weight_global_scale, float input_global_scale, int64_t N, float* y);

}  // namespace sparkserve
