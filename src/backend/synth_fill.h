// Random weight bytes generated where a tensor lives (`sparkserve bench --synth`): on the CPU
// backend by host loops, on the CUDA backend by a device kernel, so a 122B-sized model never passes
// through host memory or disk. Element e of a tensor is a pure function of (seed, e) and the
// 65536-entry lookup table, with the same counter-based generator as `sparkserve synth`
// (loader/synth_checkpoint.cpp), so both produce identical bytes for the same tensor name and seed:
//   kRandomBytes   U8:        byte e%8 of mix64(seed + e/8)
//   kTableU8       U8 / F8:   table[bits(e)]                       (FP8 codes: table of E4M3 codes)
//   kE4M3Scales    F8:        0x58 + (bits(e) & 31)                (positive E4M3 in [16, 240])
//   kTableBf16     BF16:      table[bits(e)]                       (table of BF16 values)
//   kTableBf16F32  F32:       bf16_to_f32(table[bits(e)])          (the loader's BF16 -> F32 widening)
// where bits(e) = (mix64(seed + e/4) >> (16 * (e%4))) & 0xFFFF.
#pragma once

#include <cstdint>

#include "backend/ops.h"

namespace sparkserve {

enum class SynthFillKind : uint8_t { kRandomBytes, kTableU8, kE4M3Scales, kTableBf16, kTableBf16F32 };

// SplitMix64 finaliser, as in loader/synth_checkpoint.cpp (the word generator of `synth`).
inline uint64_t synth_mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Fills the whole of dst (numel elements) on its backend. table: [65536] U8 (kTableU8) or BF16
// (kTableBf16*) in the same backend's memory; ignored otherwise. Queued on the backend's stream.
void synth_fill(Backend& backend, const Tensor& dst, SynthFillKind kind, uint64_t seed, const Tensor& table);

// Free and total device memory in bytes, counting memory the backend's pool holds but does not use
// as free; {-1, -1} where not tracked (CPU).
struct DeviceMemory {
  int64_t free_bytes = -1;
  int64_t total_bytes = -1;
};
DeviceMemory device_memory(Backend& backend);

}  // namespace sparkserve
