// NVFP4 and FP8 reference numerics against the formulas of checkpoint-formats.md §1-§2, written out
// independently here (E4M3 decoded from its definition, E2M1 from its value table, rounding by
// explicit nearest-with-ties-to-even search, sums in double).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/fp8_quant.h"
#include "core/nvfp4.h"

namespace sparkserve {
namespace {

constexpr double kE2M1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

double e4m3_def(uint8_t v) {
  int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  double r = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -r : r;
}
double e2m1_def(uint8_t code) { return (code & 8) ? -kE2M1[code & 7] : kE2M1[code & 7]; }

// Nearest E2M1 magnitude index, ties to the even index (= even mantissa), saturating at 6.
int nearest_e2m1_index(double a) {
  int best = 0;
  for (int i = 1; i < 8; ++i) {
    double d = std::fabs(a - kE2M1[i]), db = std::fabs(a - kE2M1[best]);
    if (d < db || (d == db && i % 2 == 0 && best % 2 == 1)) best = i;
  }
  return best;
}
uint8_t e2m1_def_code(double x) {
  int idx = nearest_e2m1_index(std::fabs(x));
  return static_cast<uint8_t>(idx != 0 && x < 0 ? idx | 8 : idx);
}

TEST(Nvfp4, E2M1RoundingFollowsThresholdTable) {
  // Every tie of the table in checkpoint-formats.md §1.2, both signs.
  const std::pair<float, float> ties[] = {{0.25f, 0.0f}, {0.75f, 1.0f}, {1.25f, 1.0f}, {1.75f, 2.0f},
                                          {2.5f, 2.0f},  {3.5f, 4.0f},  {5.0f, 4.0f}};
  for (auto [x, want] : ties) {
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(x)), want) << x;
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-x)), -want) << -x;
  }
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(0.2501f)), 0.5f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(5.0001f)), 6.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(100.0f)), 6.0f);
  EXPECT_EQ(f32_to_e2m1(-0.1f), 0) << "values rounding to zero get code 0, not -0";
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-7.0f, 7.0f);
  for (int i = 0; i < 100000; ++i) {
    float x = u(rng);
    ASSERT_EQ(f32_to_e2m1(x), e2m1_def_code(x)) << x;
  }
  for (int q = -28; q <= 28; ++q) {  // every multiple of 0.25 in [-7, 7] (all ties included)
    float x = q * 0.25f;
    ASSERT_EQ(f32_to_e2m1(x), e2m1_def_code(x)) << x;
  }
}

TEST(Nvfp4, UnpackPutsLowerIndexInLowNibble) {
  const uint8_t row[2] = {0x21, 0xF7};
  EXPECT_EQ(nvfp4_code(row, 0), 0x1);
  EXPECT_EQ(nvfp4_code(row, 1), 0x2);
  EXPECT_EQ(nvfp4_code(row, 2), 0x7);
  EXPECT_EQ(nvfp4_code(row, 3), 0xF);
  uint8_t codes[4] = {1, 2, 7, 15}, packed[2];
  nvfp4_pack(codes, 4, packed);
  EXPECT_EQ(packed[0], 0x21);
  EXPECT_EQ(packed[1], 0xF7);
}

TEST(Nvfp4, DequantMatchesCompressedTensorsAndModelOptFormulas) {
  // Hand example: code 1 (0.5) with block scale 2.0 (E4M3 0x40) and global scale 4 -> 0.25.
  std::vector<uint8_t> packed(8, 0x00), scales(1, 0x40);
  packed[0] = 0x21;  // k0 = 0.5, k1 = 1.0
  packed[1] = 0x0F;  // k2 = -6
  std::vector<float> out(16);
  nvfp4_dequant_ct(packed.data(), scales.data(), 4.0f, 1, 16, out.data());
  EXPECT_EQ(out[0], 0.25f);
  EXPECT_EQ(out[1], 0.5f);
  EXPECT_EQ(out[2], -3.0f);
  nvfp4_dequant_modelopt(packed.data(), scales.data(), 0.25f, 1, 16, out.data());
  EXPECT_EQ(out[0], 0.25f);
  EXPECT_EQ(out[2], -3.0f);

  // Random tensor vs the formula W = e2m1 * fp8(scale) / global_scale (CT), * weight_scale_2 (ModelOpt).
  const int64_t N = 5, K = 64;
  std::mt19937 rng(2);
  std::vector<uint8_t> p(N * K / 2), s(N * K / 16);
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  for (auto& b : s) b = static_cast<uint8_t>(rng() % 0x7E);  // positive, not NaN
  const float gs = 1234.5f;
  std::vector<float> ct(N * K), mo(N * K);
  nvfp4_dequant_ct(p.data(), s.data(), gs, N, K, ct.data());
  nvfp4_dequant_modelopt(p.data(), s.data(), 1.0f / gs, N, K, mo.data());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      uint8_t byte = p[n * K / 2 + k / 2];
      uint8_t code = (k % 2 == 0) ? (byte & 0xF) : (byte >> 4);
      double sf = e4m3_def(s[n * K / 16 + k / 16]);
      double want = e2m1_def(code) * sf / gs;
      ASSERT_NEAR(ct[n * K + k], want, std::fabs(want) * 1e-6 + 1e-30) << n << "," << k;
      // ModelOpt multiplies by 1/gs rounded to f32: one more rounding.
      ASSERT_NEAR(mo[n * K + k], want, std::fabs(want) * 2e-6 + 1e-30) << n << "," << k;
    }
}

TEST(Nvfp4, ActivationQuantizationMatchesFormula) {
  // Hand case: gs = 1, block amax 6 -> sf = fp8(1.0); x/sf rounded on the E2M1 grid.
  std::vector<float> x(16, 0.0f);
  x[0] = 6.0f;
  x[1] = 2.9f;
  x[2] = -1.3f;
  x[3] = 0.25f;
  std::vector<uint8_t> codes(16), sf(1);
  nvfp4_quantize_activation_row(x.data(), 16, 1.0f, codes.data(), sf.data());
  EXPECT_EQ(fp8_e4m3_to_f32(sf[0]), 1.0f);
  EXPECT_EQ(e2m1_to_f32(codes[0]), 6.0f);
  EXPECT_EQ(e2m1_to_f32(codes[1]), 3.0f);
  EXPECT_EQ(e2m1_to_f32(codes[2]), -1.5f);
  EXPECT_EQ(e2m1_to_f32(codes[3]), 0.0f);

  // Random rows vs sf = fp8(min(gs*amax/6, 448)), q = round(clamp(x*gs/sf, +-6)), x^ = q*sf/gs.
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  const int64_t K = 256;
  const float gs = 448.0f * 6.0f / 20.0f;  // calibrated for amax 20
  std::vector<float> row(K), fake(K);
  std::vector<uint8_t> c(K), s(K / 16);
  int checked = 0;
  for (int trial = 0; trial < 200; ++trial) {
    for (auto& v : row) v = nd(rng);
    nvfp4_quantize_activation_row(row.data(), K, gs, c.data(), s.data());
    nvfp4_fake_quant_activation_row(row.data(), K, gs, fake.data());
    for (int64_t b = 0; b < K / 16; ++b) {
      double amax = 0;
      for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(static_cast<double>(row[b * 16 + i])));
      const uint8_t want_sf = f32_to_fp8_e4m3(static_cast<float>(std::min(gs * amax / 6.0, 448.0)));
      ASSERT_EQ(s[b], want_sf);
      const double sfv = e4m3_def(want_sf);
      for (int i = 0; i < 16; ++i) {
        const double scaled = std::clamp(row[b * 16 + i] * gs / sfv, -6.0, 6.0);
        ASSERT_EQ(c[b * 16 + i], e2m1_def_code(scaled)) << row[b * 16 + i];
        const double xhat = e2m1_def(e2m1_def_code(scaled)) * sfv / gs;
        ASSERT_NEAR(fake[b * 16 + i], xhat, std::fabs(xhat) * 1e-6 + 1e-30);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 200 * 256);
}

TEST(Nvfp4, ZeroBlockQuantizesToZeros) {
  std::vector<float> x(32, 0.0f), out(32, 1.0f);
  x[20] = 1.0f;
  nvfp4_fake_quant_activation_row(x.data(), 32, 100.0f, out.data());
  for (int i = 0; i < 16; ++i) EXPECT_EQ(out[i], 0.0f);
  EXPECT_NEAR(out[20], 1.0f, 1.0f / 16);
}

TEST(Nvfp4, WeightQuantizationAsCompressedTensors) {
  const int64_t N = 8, K = 128;
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> w(N * K);
  for (auto& v : w) v = nd(rng);
  for (int i = 0; i < 16; ++i) w[3 * K + 32 + i] = 0.0f;  // an all-zero block -> scale = FP8 eps 0.125
  const Nvfp4Weight q = nvfp4_quantize_weight(w.data(), N, K);
  double amax = 0;
  for (float v : w) amax = std::max(amax, std::fabs(static_cast<double>(v)));
  EXPECT_NEAR(q.global_scale, 448.0 * 6.0 / amax, 448.0 * 6.0 / amax * 1e-6);
  std::vector<float> deq(N * K);
  nvfp4_dequant_ct(q.packed.data(), q.scales.data(), q.global_scale, N, K, deq.data());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t b = 0; b < K / 16; ++b) {
      double bmax = 0;
      for (int i = 0; i < 16; ++i) bmax = std::max(bmax, std::fabs(static_cast<double>(w[n * K + b * 16 + i])));
      uint8_t want_sf = f32_to_fp8_e4m3(static_cast<float>(bmax / 6.0 * q.global_scale));
      if (e4m3_def(want_sf) == 0.0) want_sf = 0x20;  // 0.125 = 2^-3: exponent field 4
      ASSERT_EQ(q.scales[n * (K / 16) + b], want_sf) << n << "," << b;
      const double eff = e4m3_def(want_sf) / q.global_scale;
      for (int i = 0; i < 16; ++i) {
        const int64_t k = b * 16 + i;
        const uint8_t code = nvfp4_code(q.packed.data() + n * K / 2, k);
        ASSERT_EQ(code, e2m1_def_code(std::clamp(w[n * K + k] / eff, -6.0, 6.0)));
        // Largest gap of the E2M1 grid is 2 (4 -> 6): error at most one effective scale step.
        ASSERT_LE(std::fabs(deq[n * K + k] - w[n * K + k]), eff * 1.0 + 1e-12);
      }
    }
  EXPECT_EQ(q.scales[3 * (K / 16) + 2], 0x20);
}

TEST(Nvfp4, W4A4LinearEqualsAlphaTimesBlockScaledSum) {
  const int64_t T = 3, K = 64, N = 4;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(N * K), x(T * K), y(T * N);
  for (auto& v : w) v = nd(rng) * 0.05f;
  for (auto& v : x) v = nd(rng) * 4.0f;
  const Nvfp4Weight q = nvfp4_quantize_weight(w.data(), N, K);
  const float igs = 448.0f * 6.0f / 16.0f;
  nvfp4_linear_w4a4_ct(x.data(), T, K, q.packed.data(), q.scales.data(), q.global_scale, igs, N, y.data());
  // vLLM: alpha = 1/(input_global_scale * weight_global_scale); y = alpha * sum (qa*sfa)(qw*sfw).
  const double alpha = 1.0 / (static_cast<double>(igs) * q.global_scale);
  std::vector<uint8_t> ca(K), sa(K / 16);
  for (int64_t t = 0; t < T; ++t) {
    nvfp4_quantize_activation_row(x.data() + t * K, K, igs, ca.data(), sa.data());
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        double a = e2m1_def(ca[k]) * e4m3_def(sa[k / 16]);
        double b = e2m1_def(nvfp4_code(q.packed.data() + n * K / 2, k)) * e4m3_def(q.scales[n * K / 16 + k / 16]);
        acc += a * b;
        mag += std::fabs(a * b);
      }
      // f32 rounding of x^ and W^ per element: relative 2^-23 each, summed over K.
      EXPECT_NEAR(y[t * N + n], alpha * acc, alpha * mag * 1e-6) << t << "," << n;
    }
  }
}

TEST(Fp8, TokenScaleHasFloor) {
  std::vector<float> zeros(8, 0.0f);
  EXPECT_EQ(fp8_token_scale(zeros.data(), 8), 1.0f / (448.0f * 512.0f));
  std::vector<float> x = {1.0f, -896.0f, 3.0f};
  EXPECT_EQ(fp8_token_scale(x.data(), 3), 2.0f);
}

TEST(Fp8, StaticScaleSaturates) {
  std::vector<float> x = {1000.0f, -1000.0f, 1.0f};
  std::vector<uint8_t> q(3);
  fp8_quantize_row(x.data(), 3, 1.0f, q.data());
  EXPECT_EQ(fp8_e4m3_to_f32(q[0]), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(q[1]), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(q[2]), 1.0f);
}

TEST(Fp8, W8A8DynamicMatchesFormula) {
  const int64_t T = 4, K = 96, N = 6;
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> w(N * K), x(T * K), y(T * N);
  for (auto& v : w) v = nd(rng) * 0.03f;
  for (auto& v : x) v = nd(rng) * 2.0f;
  x[5] = 0.0f;
  for (bool per_channel : {true, false}) {
    const Fp8Weight q = fp8_quantize_weight(w.data(), N, K, per_channel, /*round_scale_to_bf16=*/true);
    ASSERT_EQ(q.scales.size(), per_channel ? size_t(N) : size_t(1));
    // Scale = bf16(amax/448); q = fp8(w/scale).
    for (int64_t n = 0; n < N; ++n) {
      double amax = 0;
      for (int64_t k = 0; k < K; ++k)
        if (per_channel) amax = std::max(amax, std::fabs(static_cast<double>(w[n * K + k])));
      if (!per_channel)
        for (float v : w) amax = std::max(amax, std::fabs(static_cast<double>(v)));
      const float s = round_to_bf16(static_cast<float>(amax / 448.0));
      ASSERT_EQ(q.scales[per_channel ? n : 0], s);
      for (int64_t k = 0; k < K; ++k) ASSERT_EQ(q.q[n * K + k], f32_to_fp8_e4m3(w[n * K + k] / s));
    }
    fp8_linear_w8a8_dynamic(x.data(), T, K, q.q.data(), q.scales.data(), per_channel, N, y.data());
    for (int64_t t = 0; t < T; ++t) {
      double amax = 0;
      for (int64_t k = 0; k < K; ++k) amax = std::max(amax, std::fabs(static_cast<double>(x[t * K + k])));
      const double s = std::max(amax / 448.0, 1.0 / (448.0 * 512.0));
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += e4m3_def(f32_to_fp8_e4m3(static_cast<float>(x[t * K + k] / s))) * e4m3_def(q.q[n * K + k]);
        const double want = s * q.scales[per_channel ? n : 0] * acc;
        EXPECT_NEAR(y[t * N + n], want, std::fabs(want) * 1e-6 + 1e-12) << t << "," << n;
        // And the quantized product is close to the float one (FP8 has 3 mantissa bits: ~6% per factor).
        double exact = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          exact += static_cast<double>(x[t * K + k]) * w[n * K + k];
          mag += std::fabs(static_cast<double>(x[t * K + k]) * w[n * K + k]);
        }
        EXPECT_NEAR(want, exact, 0.13 * mag);
      }
    }
  }
}

TEST(Fp8, StaticLinearUsesGivenScale) {
  std::vector<float> x = {0.5f, -1.0f}, w_scale = {0.25f};
  std::vector<uint8_t> w = {f32_to_fp8_e4m3(2.0f), f32_to_fp8_e4m3(4.0f)};
  float y = 0;
  fp8_linear_w8a8_static(x.data(), 1, 2, 0.5f, w.data(), w_scale.data(), false, 1, &y);
  // xq = fp8(x / 0.5) = [1, -2]; y = 0.5 * 0.25 * (1*2 + -2*4) = -0.75.
  EXPECT_EQ(y, -0.75f);
}

}  // namespace
}  // namespace sparkserve
