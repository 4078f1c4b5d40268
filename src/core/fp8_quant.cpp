#include "core/fp8_quant.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"

namespace sparkserve {

float fp8_token_scale(const float* x, int64_t K) {
  float amax = 0.0f;
  for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(x[k]));
  return std::max(amax / kFp8E4M3Max, kFp8MinTokenScale);
}

void fp8_quantize_row(const float* x, int64_t K, float scale, uint8_t* xq) {
  for (int64_t k = 0; k < K; ++k) xq[k] = f32_to_fp8_e4m3(x[k] / scale);  // f32_to_fp8_e4m3 saturates
}

void fp8_dequant_weight(const uint8_t* w, const float* scales, bool per_channel, int64_t N, int64_t K, float* out) {
  for (int64_t n = 0; n < N; ++n) {
    const float s = scales[per_channel ? n : 0];
    for (int64_t k = 0; k < K; ++k) out[n * K + k] = fp8_e4m3_to_f32(w[n * K + k]) * s;
  }
}

Fp8Weight fp8_quantize_weight(const float* w, int64_t N, int64_t K, bool per_channel, bool round_scale_to_bf16) {
  Fp8Weight q;
  q.N = N;
  q.K = K;
  q.q.resize(static_cast<size_t>(N * K));
  const int64_t groups = per_channel ? N : 1;
  const int64_t rows_per_group = per_channel ? 1 : N;
  const float eps = round_scale_to_bf16 ? 0.0078125f : 1.1920929e-7f;  // finfo(bf16 / f32).eps
  for (int64_t g = 0; g < groups; ++g) {
    const float* wg = w + g * rows_per_group * K;
    float amax = 0.0f;
    for (int64_t i = 0; i < rows_per_group * K; ++i) amax = std::max(amax, std::fabs(wg[i]));
    float s = amax / kFp8E4M3Max;
    if (round_scale_to_bf16) s = round_to_bf16(s);
    if (s == 0.0f) s = eps;
    q.scales.push_back(s);
    for (int64_t i = 0; i < rows_per_group * K; ++i) q.q[static_cast<size_t>(g * rows_per_group * K + i)] = f32_to_fp8_e4m3(wg[i] / s);
  }
  return q;
}

namespace {
void linear_with_scales(const float* x, int64_t T, int64_t K, const float* token_scales, const uint8_t* w,
                        const float* scales, bool per_channel, int64_t N, float* y) {
  std::vector<uint8_t> xq(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    const float s = token_scales[t];
    fp8_quantize_row(x + t * K, K, s, xq.data());
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k)
        acc += static_cast<double>(fp8_e4m3_to_f32(xq[static_cast<size_t>(k)])) * fp8_e4m3_to_f32(w[n * K + k]);
      y[t * N + n] = static_cast<float>(static_cast<double>(s) * scales[per_channel ? n : 0] * acc);
    }
  }
}
}  // namespace

void fp8_linear_w8a8_dynamic(const float* x, int64_t T, int64_t K, const uint8_t* w, const float* scales,
                             bool per_channel, int64_t N, float* y) {
  std::vector<float> s(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) s[static_cast<size_t>(t)] = fp8_token_scale(x + t * K, K);
  linear_with_scales(x, T, K, s.data(), w, scales, per_channel, N, y);
}

void fp8_linear_w8a8_static(const float* x, int64_t T, int64_t K, float input_scale, const uint8_t* w,
                            const float* scales, bool per_channel, int64_t N, float* y) {
  std::vector<float> s(static_cast<size_t>(T), input_scale);
  linear_with_scales(x, T, K, s.data(), w, scales, per_channel, N, y);
}

}  // namespace sparkserve
