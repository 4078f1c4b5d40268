// f32 -> bf16 rounding on the device, bit for bit the CPU's f32_to_bf16 (core/dtype.h): round to nearest
// even, NaN stays NaN. Every kernel that stores a bf16 copy of an f32 value the CPU backend also stores
// (KV cache rows, the GDN recurrent state) rounds with this.
#pragma once

#include <cstdint>

namespace sparkserve {

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  const uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace sparkserve
