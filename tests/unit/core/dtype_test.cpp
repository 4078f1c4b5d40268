#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace sparkserve {
namespace {

// Reference E4M3FN decode straight from the definition: (-1)^s * 2^(e-7) * (1 + m/8), subnormal
// 2^-6 * m/8, computed in double.
double e4m3_reference(uint8_t v) {
  int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
  double r = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -r : r;
}

TEST(DType, ParsesSafetensorsNames) {
  EXPECT_EQ(parse_dtype("BF16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("F8_E4M3"), DType::kF8E4M3);
  EXPECT_EQ(parse_dtype("I64"), DType::kI64);
  EXPECT_FALSE(parse_dtype("F4").has_value());
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_name(DType::kU8), "U8");
}

TEST(DType, Fp8E4M3DecodeMatchesDefinition) {
  for (int v = 0; v < 256; ++v) {
    float got = fp8_e4m3_to_f32(static_cast<uint8_t>(v));
    if ((v & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(got)) << v;
      continue;
    }
    EXPECT_EQ(static_cast<double>(got), e4m3_reference(static_cast<uint8_t>(v))) << v;
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
}

TEST(DType, Fp8E4M3EncodeRoundsToNearestRepresentable) {
  // Every finite code round-trips.
  for (int v = 0; v < 256; ++v) {
    if ((v & 0x7f) == 0x7f) continue;
    float f = fp8_e4m3_to_f32(static_cast<uint8_t>(v));
    uint8_t back = f32_to_fp8_e4m3(f);
    EXPECT_EQ(fp8_e4m3_to_f32(back), f) << v;
  }
  // Random values land on the nearest code (brute force over all codes).
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-500.0f, 500.0f);
  for (int i = 0; i < 20000; ++i) {
    float x = dist(rng) * (i % 3 == 0 ? 1e-3f : 1.0f);
    float got = fp8_e4m3_to_f32(f32_to_fp8_e4m3(x));
    double best = 1e30;
    for (int v = 0; v < 256; ++v) {
      if ((v & 0x7f) == 0x7f) continue;
      best = std::min(best, std::fabs(e4m3_reference(static_cast<uint8_t>(v)) - x));
    }
    EXPECT_LE(std::fabs(static_cast<double>(got) - x), best + 1e-12) << x;
  }
}

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: round to even (1).
  EXPECT_EQ(round_to_bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  EXPECT_EQ(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16RoundTrip) {
  for (uint32_t h = 0; h < 0x7c00; ++h) {
    float f = f16_to_f32(static_cast<uint16_t>(h));
    EXPECT_EQ(f32_to_f16(f), h);
  }
}

TEST(DType, E2M1Table) {
  const float expect[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int c = 0; c < 16; ++c) EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(c)), expect[c]);
}

}  // namespace
}  // namespace sparkserve
