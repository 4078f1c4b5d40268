#include "core/dtype.h"

#include <cmath>

namespace sparkserve {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kInfos[] = {
    {DType::kF32, "F32", 4},       {DType::kF16, "F16", 2},      {DType::kBF16, "BF16", 2},
    {DType::kF64, "F64", 8},       {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kU8, "U8", 1},         {DType::kI8, "I8", 1},        {DType::kI16, "I16", 2},
    {DType::kU16, "U16", 2},       {DType::kI32, "I32", 4},      {DType::kU32, "U32", 4},
    {DType::kI64, "I64", 8},       {DType::kU64, "U64", 8},      {DType::kBool, "BOOL", 1},
};
const DTypeInfo& info(DType t) {
  for (const auto& i : kInfos)
    if (i.type == t) return i;
  return kInfos[0];  // unreachable: every enumerator is listed
}
}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
std::string_view dtype_name(DType t) { return info(t).name; }

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& i : kInfos)
    if (i.name == name) return i.type;
  return std::nullopt;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffff;
  if (absx > 0x7f800000) return static_cast<uint16_t>(sign | 0x7e00);
  if (absx >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // rounds to inf
  if (absx < 0x38800000) {  // subnormal or zero in f16: value = m * 2^-24
    float a;
    std::memcpy(&a, &absx, 4);
    float m = std::nearbyint(a * 16777216.0f);  // round-half-even in default FP env
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(m));
  }
  uint32_t exp = ((absx >> 23) - 112) << 10;
  uint32_t mant = (absx >> 13) & 0x3ff;
  uint32_t rest = absx & 0x1fff;
  uint32_t h = exp | mant;
  if (rest > 0x1000 || (rest == 0x1000 && (mant & 1))) h += 1;
  return static_cast<uint16_t>(sign | h);
}

float fp8_e4m3_to_f32(uint8_t v) {
  uint32_t sign = v >> 7, exp = (v >> 3) & 0xf, mant = v & 7;
  float r;
  if (exp == 0xf && mant == 7) {
    r = NAN;
  } else if (exp == 0) {
    r = std::ldexp(static_cast<float>(mant), -9);  // 2^-6 * m/8
  } else {
    r = std::ldexp(static_cast<float>(8 + mant), static_cast<int>(exp) - 10);
  }
  return sign ? -r : r;
}

uint8_t f32_to_fp8_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  uint8_t sign = std::signbit(f) ? 0x80 : 0;
  float a = std::fabs(f);
  if (a >= 448.0f) return sign | 0x7e;  // saturate
  // Find the best code by rounding in the binade of a (round-half-even on the 3-bit mantissa).
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  int exp_unbiased = e - 1;  // a in [2^exp, 2^(exp+1))
  if (exp_unbiased < -6) exp_unbiased = -6;  // subnormal range shares the 2^-6 binade's spacing
  float step = std::ldexp(1.0f, exp_unbiased - 3);
  float q = std::nearbyint(a / step) * step;  // exact: a/step is representable and small
  if (q == 0.0f) return sign;
  int qe;
  float qm = std::frexp(q, &qe);
  int biased = qe - 1 + 7;
  if (biased <= 0) {  // subnormal: q = m * 2^-9
    return sign | static_cast<uint8_t>(std::lround(q * 512.0f));
  }
  int mant = static_cast<int>(std::lround((qm * 2.0f - 1.0f) * 8.0f));
  return sign | static_cast<uint8_t>((biased << 3) | mant);
}

float fp8_e5m2_to_f32(uint8_t v) {
  // E5M2 is the top byte of an f16.
  return f16_to_f32(static_cast<uint16_t>(v) << 8);
}

}  // namespace sparkserve
