// The GDN recurrent state pool as the delta-rule kernels (gdn.cu, gdn_chunked.cu) load and store it:
// f32, or bf16 (backend/ops.h, "The recurrent state pool"). A kernel is instantiated for the storage
// type St (float, or uint16_t holding bf16 bits) and computes in f32 either way: loads widen, stores
// round to nearest even with the CPU backend's rounding (f32_to_bf16_bits), so a bf16 value stored
// here is bit for bit the one the CPU stores for the same f32 value.
#pragma once

#include <cstdint>

#include "backend/cuda/bf16_round.cuh"
#include "backend/cuda/cuda_backend.h"

namespace sparkserve {

// The pool's storage type for a dtype: float (kF32) or uint16_t (kBF16).
template <class St>
inline constexpr bool kStateBf16 = sizeof(St) == 2;

// Four adjacent state values at p (16-byte aligned for f32, 8-byte for bf16), widened.
template <class St>
__device__ __forceinline__ float4 state_load4(const St* p) {
  if constexpr (kStateBf16<St>) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
  } else {
    return *reinterpret_cast<const float4*>(p);
  }
}
// The same, evict-first (ld.global.cs: read once, not again before the rest of the step has
// streamed through L2).
template <class St>
__device__ __forceinline__ float4 state_load4_cs(const St* p) {
  if constexpr (kStateBf16<St>) {
    const uint2 u = __ldcs(reinterpret_cast<const uint2*>(p));
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
  } else {
    return __ldcs(reinterpret_cast<const float4*>(p));
  }
}

__device__ __forceinline__ uint2 bf16x4_bits(float4 v) {
  return make_uint2(static_cast<uint32_t>(f32_to_bf16_bits(v.x)) | (static_cast<uint32_t>(f32_to_bf16_bits(v.y)) << 16),
                    static_cast<uint32_t>(f32_to_bf16_bits(v.z)) | (static_cast<uint32_t>(f32_to_bf16_bits(v.w)) << 16));
}

// Stores four adjacent values at p (alignment as state_load4), rounded to the storage type.
template <class St>
__device__ __forceinline__ void state_store4(St* p, float4 v) {
  if constexpr (kStateBf16<St>) {
    *reinterpret_cast<uint2*>(p) = bf16x4_bits(v);
  } else {
    *reinterpret_cast<float4*>(p) = v;
  }
}
// The same, evict-first (st.global.cs).
template <class St>
__device__ __forceinline__ void state_store4_cs(St* p, float4 v) {
  if constexpr (kStateBf16<St>) {
    __stcs(reinterpret_cast<uint2*>(p), bf16x4_bits(v));
  } else {
    __stcs(reinterpret_cast<float4*>(p), v);
  }
}

// One state value, widened / rounded.
template <class St>
__device__ __forceinline__ float state_load1(const St* p) {
  if constexpr (kStateBf16<St>) return bf16_bits_to_f32(*p);
  else return *p;
}
template <class St>
__device__ __forceinline__ void state_store1(St* p, float v) {
  if constexpr (kStateBf16<St>) *p = f32_to_bf16_bits(v);
  else *p = v;
}

}  // namespace sparkserve
