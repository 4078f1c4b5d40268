#include "backend/synth_fill.h"

#include <cstring>

#include "core/dtype.h"

namespace sparkserve {

#ifdef SPARKSERVE_WITH_CUDA
// Defined in backend/cuda/synth_fill.cu.
void cuda_synth_fill(Backend& backend, const Tensor& dst, SynthFillKind kind, uint64_t seed, const Tensor& table);
DeviceMemory cuda_device_memory(Backend& backend);
#endif

namespace {

void host_fill(const Tensor& dst, SynthFillKind kind, uint64_t seed, const Tensor& table) {
  const uint64_t n = static_cast<uint64_t>(dst.numel());
  auto bits = [&](uint64_t e) { return static_cast<uint16_t>(synth_mix64(seed + e / 4) >> (16 * (e % 4))); };
  switch (kind) {
    case SynthFillKind::kRandomBytes: {
      auto* out = dst.ptr<uint8_t>();
      for (uint64_t e = 0; e < n; ++e) out[e] = static_cast<uint8_t>(synth_mix64(seed + e / 8) >> (8 * (e % 8)));
      return;
    }
    case SynthFillKind::kTableU8: {
      auto* out = dst.ptr<uint8_t>();
      const auto* tab = table.ptr<uint8_t>();
      for (uint64_t e = 0; e < n; ++e) out[e] = tab[bits(e)];
      return;
    }
    case SynthFillKind::kE4M3Scales: {
      auto* out = dst.ptr<uint8_t>();
      for (uint64_t e = 0; e < n; ++e) out[e] = static_cast<uint8_t>(0x58 + (bits(e) & 31));
      return;
    }
    case SynthFillKind::kTableBf16: {
      auto* out = dst.ptr<uint16_t>();
      const auto* tab = table.ptr<uint16_t>();
      for (uint64_t e = 0; e < n; ++e) out[e] = tab[bits(e)];
      return;
    }
    case SynthFillKind::kTableBf16F32: {
      auto* out = dst.ptr<float>();
      const auto* tab = table.ptr<uint16_t>();
      for (uint64_t e = 0; e < n; ++e) out[e] = bf16_to_f32(tab[bits(e)]);
      return;
    }
  }
}

}  // namespace

void synth_fill(Backend& backend, const Tensor& dst, SynthFillKind kind, uint64_t seed, const Tensor& table) {
  const size_t want = kind == SynthFillKind::kTableBf16 ? 2 : kind == SynthFillKind::kTableBf16F32 ? 4 : 1;
  CHECK_MSG(dtype_size(dst.dtype) == want, "synth_fill: destination dtype does not match the fill kind");
  const bool tabled = kind == SynthFillKind::kTableU8 || kind == SynthFillKind::kTableBf16 ||
                      kind == SynthFillKind::kTableBf16F32;
  CHECK_MSG(!tabled || table.numel() == 65536, "synth_fill: the table must hold 65536 entries");
  if (dst.numel() == 0) return;
#ifdef SPARKSERVE_WITH_CUDA
  if (backend.device() == Device::kCuda) return cuda_synth_fill(backend, dst, kind, seed, table);
#endif
  CHECK_MSG(backend.device() == Device::kCpu, "synth_fill: backend not supported");
  host_fill(dst, kind, seed, table);
}

DeviceMemory device_memory(Backend& backend) {
#ifdef SPARKSERVE_WITH_CUDA
  if (backend.device() == Device::kCuda) return cuda_device_memory(backend);
#endif
  return {};
}

}  // namespace sparkserve
