// FP8 (E4M3FN) W8A8 reference numerics (checkpoint-formats.md §2): weights with a per-channel
// ([N,1]) or per-tensor ([1]) dequant scale = amax/448; activations quantized per token at run time
// with s = max(amax/448, 1/(448·512)) (vLLM's minimum scaling factor), saturating to ±448;
// y = s · ws · Σ xq·wq. Plain scalar loops: the specification faster kernels are compared against.
#pragma once

#include <cstdint>
#include <vector>

namespace sparkserve {

inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr float kFp8MinTokenScale = 1.0f / (448.0f * 512.0f);

// Per-token dynamic activation scale: max(max|x| / 448, 1/(448·512)).
// x: [K] f32 -> scale
float fp8_token_scale(const float* x, int64_t K);
// xq[k] = fp8_e4m3(x[k] / scale), saturating to ±448.
// x: [K] f32 -> xq: [K] e4m3
void fp8_quantize_row(const float* x, int64_t K, float scale, uint8_t* xq);

// Dequantizes an FP8 weight: W[n,k] = fp8(w[n,k]) · scale[per_channel ? n : 0].
// w: [N, K] e4m3, scales: [N] or [1] f32 -> out: [N, K] f32
void fp8_dequant_weight(const uint8_t* w, const float* scales, bool per_channel, int64_t N, int64_t K, float* out);

// Weight quantization as compressed-tensors FP8 (channel strategy): scale[n] = amax_n/448 rounded to
// the scale dtype (BF16 for Qwen3.5 checkpoints: round_scale_to_bf16), a zero scale replaced by the
// scale dtype's eps (BF16: 2^-7), then q = fp8(w / scale) saturating.
struct Fp8Weight {
  int64_t N = 0, K = 0;
  std::vector<uint8_t> q;     // [N, K] e4m3
  std::vector<float> scales;  // [N] (per channel) or [1] (per tensor)
};
// w: [N, K] f32 -> Fp8Weight
Fp8Weight fp8_quantize_weight(const float* w, int64_t N, int64_t K, bool per_channel, bool round_scale_to_bf16);

// W8A8 linear with dynamic per-token activations: y[t,n] = s_t · ws[n] · Σ_k xq[t,k]·wq[n,k], the sum
// accumulated in double (exact for these products up to K ≈ 2^20).
// x: [T, K] f32, w: [N, K] e4m3, scales: [N] or [1] -> y: [T, N] f32
void fp8_linear_w8a8_dynamic(const float* x, int64_t T, int64_t K, const uint8_t* w, const float* scales,
                             bool per_channel, int64_t N, float* y);
// Same with a static per-tensor activation scale (ModelOpt FP8 / CT static FP8): s_t = input_scale.
void fp8_linear_w8a8_static(const float* x, int64_t T, int64_t K, float input_scale, const uint8_t* w,
                            const float* scales, bool per_channel, int64_t N, float* y);

}  // namespace sparkserve
