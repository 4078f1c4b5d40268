#include "core/nvfp4.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/dtype.h"

namespace sparkserve {

uint8_t f32_to_e2m1(float x) {
  const float a = std::fabs(x);
  uint8_t mag;
  if (std::isnan(x)) {
    mag = 0;  // never produced from finite inputs; keep the code defined
  } else if (a <= 0.25f) {
    mag = 0;
  } else if (a < 0.75f) {
    mag = 1;
  } else if (a <= 1.25f) {
    mag = 2;
  } else if (a < 1.75f) {
    mag = 3;
  } else if (a <= 2.5f) {
    mag = 4;
  } else if (a < 3.5f) {
    mag = 5;
  } else if (a <= 5.0f) {
    mag = 6;
  } else {
    mag = 7;
  }
  // Zero is always code 0 (as compressed-tensors packs a rounded -0.0: sign bit from x < 0 on the
  // rounded value, which is false for -0.0).
  return (mag != 0 && x < 0) ? static_cast<uint8_t>(mag | 8) : mag;
}

void nvfp4_pack(const uint8_t* codes, int64_t n, uint8_t* packed) {
  CHECK(n % 2 == 0);
  for (int64_t j = 0; j < n / 2; ++j)
    packed[j] = static_cast<uint8_t>((codes[2 * j] & 0xF) | ((codes[2 * j + 1] & 0xF) << 4));
}

namespace {
void dequant_rows(const uint8_t* packed, const uint8_t* scales, float global_mul, bool divide, int64_t N,
                  int64_t K, float* out) {
  CHECK(K % kNvfp4BlockSize == 0);
  const int64_t nb = K / kNvfp4BlockSize;
  for (int64_t n = 0; n < N; ++n) {
    const uint8_t* row = packed + n * (K / 2);
    for (int64_t b = 0; b < nb; ++b) {
      const float sf = fp8_e4m3_to_f32(scales[n * nb + b]);
      const float factor = divide ? sf / global_mul : sf * global_mul;
      for (int64_t i = 0; i < kNvfp4BlockSize; ++i) {
        const int64_t k = b * kNvfp4BlockSize + i;
        out[n * K + k] = e2m1_to_f32(nvfp4_code(row, k)) * factor;
      }
    }
  }
}
}  // namespace

void nvfp4_dequant_ct(const uint8_t* packed, const uint8_t* scales, float weight_global_scale, int64_t N,
                      int64_t K, float* out) {
  dequant_rows(packed, scales, weight_global_scale, /*divide=*/true, N, K, out);
}

void nvfp4_dequant_modelopt(const uint8_t* packed, const uint8_t* scales, float weight_scale_2, int64_t N,
                            int64_t K, float* out) {
  dequant_rows(packed, scales, weight_scale_2, /*divide=*/false, N, K, out);
}

void nvfp4_quantize_activation_row(const float* x, int64_t K, float input_global_scale, uint8_t* codes,
                                   uint8_t* block_scales) {
  CHECK(K % kNvfp4BlockSize == 0);
  const float gs = input_global_scale;
  for (int64_t b = 0; b < K / kNvfp4BlockSize; ++b) {
    const float* xb = x + b * kNvfp4BlockSize;
    float amax = 0.0f;
    for (int i = 0; i < kNvfp4BlockSize; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float sf_value = std::min(gs * (amax / kE2M1Max), kE4M3Max);
    const uint8_t sf = f32_to_fp8_e4m3(sf_value);
    block_scales[b] = sf;
    // vLLM: output_scale = reciprocal(scale * reciprocal(global_scale)), reciprocal(0) = 0.
    const float inv_gs = gs == 0.0f ? 0.0f : 1.0f / gs;
    const float denom = fp8_e4m3_to_f32(sf) * inv_gs;
    const float out_scale = denom == 0.0f ? 0.0f : 1.0f / denom;
    for (int i = 0; i < kNvfp4BlockSize; ++i) {
      const float scaled = std::clamp(xb[i] * out_scale, -kE2M1Max, kE2M1Max);
      codes[b * kNvfp4BlockSize + i] = f32_to_e2m1(scaled);
    }
  }
}

void nvfp4_fake_quant_activation_row(const float* x, int64_t K, float input_global_scale, float* out) {
  std::vector<uint8_t> codes(static_cast<size_t>(K));
  std::vector<uint8_t> sf(static_cast<size_t>(K / kNvfp4BlockSize));
  nvfp4_quantize_activation_row(x, K, input_global_scale, codes.data(), sf.data());
  for (int64_t k = 0; k < K; ++k)
    out[k] = e2m1_to_f32(codes[k]) * fp8_e4m3_to_f32(sf[k / kNvfp4BlockSize]) / input_global_scale;
}

Nvfp4Weight nvfp4_quantize_weight(const float* w, int64_t N, int64_t K) {
  CHECK(K % kNvfp4BlockSize == 0);
  Nvfp4Weight q;
  q.N = N;
  q.K = K;
  q.packed.resize(static_cast<size_t>(N * K / 2));
  q.scales.resize(static_cast<size_t>(N * K / kNvfp4BlockSize));
  float amax = 0.0f;
  for (int64_t i = 0; i < N * K; ++i) amax = std::max(amax, std::fabs(w[i]));
  float gs = kE4M3Max * kE2M1Max / amax;
  if (!std::isfinite(gs) || amax == 0.0f) gs = 1.0f;  // nan_to_num(nan/inf -> 1.0)
  q.global_scale = gs;
  std::vector<uint8_t> codes(static_cast<size_t>(K));
  const int64_t nb = K / kNvfp4BlockSize;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* wb = w + n * K + b * kNvfp4BlockSize;
      float bmax = 0.0f;
      for (int i = 0; i < kNvfp4BlockSize; ++i) bmax = std::max(bmax, std::fabs(wb[i]));
      uint8_t sf = f32_to_fp8_e4m3(gs * (bmax / kE2M1Max));
      if (fp8_e4m3_to_f32(sf) == 0.0f) sf = f32_to_fp8_e4m3(0.125f);  // CT: zero scale -> FP8 eps
      q.scales[static_cast<size_t>(n * nb + b)] = sf;
      const float scale = fp8_e4m3_to_f32(sf) / gs;
      for (int i = 0; i < kNvfp4BlockSize; ++i)
        codes[static_cast<size_t>(b * kNvfp4BlockSize + i)] =
            f32_to_e2m1(std::clamp(wb[i] / scale, -kE2M1Max, kE2M1Max));
    }
    nvfp4_pack(codes.data(), K, q.packed.data() + n * (K / 2));
  }
  return q;
}

void nvfp4_linear_w4a4_ct(const float* x, int64_t T, int64_t K, const uint8_t* packed, const uint8_t* scales,
                          float weight_global_scale, float input_global_scale, int64_t N, float* y) {
  std::vector<float> w(static_cast<size_t>(N * K));
  nvfp4_dequant_ct(packed, scales, weight_global_scale, N, K, w.data());
  std::vector<float> xq(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    nvfp4_fake_quant_activation_row(x + t * K, K, input_global_scale, xq.data());
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(xq[k]) * w[static_cast<size_t>(n * K + k)];
      y[t * N + n] = static_cast<float>(acc);
    }
  }
}

}  // namespace sparkserve
