// Device side of backend/synth_fill.h: the `synth` generator run where the weights live, one
// random word per thread per step (grid-stride), so filling 80 GB costs about one pass of writes.
#include "backend/cuda/cuda_backend.h"
#include "backend/synth_fill.h"

namespace sparkserve {
namespace {

__device__ __forceinline__ uint64_t mix64_dev(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One thread per 64-bit random word: 8 bytes (kRandomBytes) or 4 elements (the 16-bit kinds).
__global__ void synth_fill_kernel(void* dst, uint64_t n, int kind, uint64_t seed, const void* table) {
  const uint64_t per_word = kind == static_cast<int>(SynthFillKind::kRandomBytes) ? 8 : 4;
  const uint64_t words = (n + per_word - 1) / per_word;
  for (uint64_t w = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; w < words;
       w += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64_dev(seed + w);
    const uint64_t e0 = w * per_word;
    const uint64_t m = n - e0 < per_word ? n - e0 : per_word;
    switch (static_cast<SynthFillKind>(kind)) {
      case SynthFillKind::kRandomBytes: {
        auto* out = static_cast<uint8_t*>(dst) + e0;
        if (m == 8 && (reinterpret_cast<uintptr_t>(out) & 7) == 0) {
          *reinterpret_cast<uint64_t*>(out) = r;  // little-endian: byte j = r >> 8j, as on the host
        } else {
          for (uint64_t j = 0; j < m; ++j) out[j] = static_cast<uint8_t>(r >> (8 * j));
        }
        break;
      }
      case SynthFillKind::kTableU8: {
        auto* out = static_cast<uint8_t*>(dst) + e0;
        const auto* tab = static_cast<const uint8_t*>(table);
        for (uint64_t j = 0; j < m; ++j) out[j] = tab[(r >> (16 * j)) & 0xFFFF];
        break;
      }
      case SynthFillKind::kE4M3Scales: {
        auto* out = static_cast<uint8_t*>(dst) + e0;
        for (uint64_t j = 0; j < m; ++j) out[j] = static_cast<uint8_t>(0x58 + ((r >> (16 * j)) & 31));
        break;
      }
      case SynthFillKind::kTableBf16: {
        auto* out = static_cast<uint16_t*>(dst) + e0;
        const auto* tab = static_cast<const uint16_t*>(table);
        for (uint64_t j = 0; j < m; ++j) out[j] = tab[(r >> (16 * j)) & 0xFFFF];
        break;
      }
      case SynthFillKind::kTableBf16F32: {
        auto* out = static_cast<float*>(dst) + e0;
        const auto* tab = static_cast<const uint16_t*>(table);
        for (uint64_t j = 0; j < m; ++j)
          out[j] = __uint_as_float(static_cast<uint32_t>(tab[(r >> (16 * j)) & 0xFFFF]) << 16);
        break;
      }
    }
  }
}

}  // namespace

void cuda_synth_fill(Backend& backend, const Tensor& dst, SynthFillKind kind, uint64_t seed, const Tensor& table) {
  auto& be = static_cast<CudaBackend&>(backend);
  const uint64_t n = static_cast<uint64_t>(dst.numel());
  const uint64_t per_word = kind == SynthFillKind::kRandomBytes ? 8 : 4;
  const uint64_t words = (n + per_word - 1) / per_word;
  const int threads = 256;
  const uint64_t max_blocks = static_cast<uint64_t>(be.sm_count()) * 16;
  const uint64_t want = (words + threads - 1) / threads;
  const unsigned blocks = static_cast<unsigned>(want < max_blocks ? want : max_blocks);
  synth_fill_kernel<<<blocks, threads, 0, be.stream()>>>(dst.data, n, static_cast<int>(kind), seed, table.data);
  CUDA_CHECK_LAUNCH();
}

DeviceMemory cuda_device_memory(Backend& backend) {
  auto& be = static_cast<CudaBackend&>(backend);
  CUDA_CHECK(cudaStreamSynchronize(be.stream()));
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  cudaMemPool_t pool;
  CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  uint64_t reserved = 0, used = 0;
  CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved));
  CUDA_CHECK(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used));
  DeviceMemory m;
  m.free_bytes = static_cast<int64_t>(free_b) + static_cast<int64_t>(reserved > used ? reserved - used : 0);
  m.total_bytes = static_cast<int64_t>(total_b);
  return m;
}

}  // namespace sparkserve
