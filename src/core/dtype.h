// Element types as stored in checkpoints and device buffers, and scalar conversions to/from f32.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace sparkserve {

enum class DType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kF8E4M3,  // E4M3FN: no infinities, 0x7F/0xFF NaN, max 448
  kF8E5M2,
  kU8,
  kI8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kBool,
};

// Bytes per element.
size_t dtype_size(DType t);
// safetensors spelling ("BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t);
// Parses the safetensors spelling; nullopt for unknown names.
std::optional<DType> parse_dtype(std::string_view name);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// Rounds an f32 to the nearest bf16 value and returns it as f32.
inline float round_to_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// FP8 E4M3FN (bias 7, no inf, NaN = S.1111.111).
float fp8_e4m3_to_f32(uint8_t v);
// Round-to-nearest-even with saturation to +-448, as torch's float8_e4m3fn cast of an in-range value.
uint8_t f32_to_fp8_e4m3(float f);
float fp8_e5m2_to_f32(uint8_t v);

// FP4 E2M1 code (bit 3 sign, bits 0..2 magnitude index) to its value.
inline float e2m1_to_f32(uint8_t code) {
  static constexpr float kValues[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float v = kValues[code & 7];
  return (code & 8) ? -v : v;
}

}  // namespace sparkserve
