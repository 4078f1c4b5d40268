// Backend::copy_batch: up to kMaxCopies independent copies per launch, their addresses and sizes
// passed by value as the kernel's parameters (no upload, no allocation): one launch instead of one
// cudaMemcpyAsync per copy.
#include "backend/cuda/cuda_backend.h"

namespace sparkserve {
namespace {

constexpr int kMaxCopies = 128;  // 3 KB of parameters, under the 4 KB every architecture accepts
constexpr int kThreads = 256;
constexpr uint64_t kChunk = 32 * 1024;  // bytes per block: 8 x 16 B per thread

struct CopyList {
  const char* src[kMaxCopies];
  char* dst[kMaxCopies];
  uint64_t bytes[kMaxCopies];
};

// grid: (chunks of the largest copy, copies). Block (x, y) moves bytes [x * kChunk, (x + 1) * kChunk)
// of copy y; a copy smaller than that has nothing to do in it.
__global__ void __launch_bounds__(kThreads) copy_batch_kernel(const __grid_constant__ CopyList list) {
  const int c = static_cast<int>(blockIdx.y);
  const uint64_t bytes = list.bytes[c];
  const uint64_t begin = static_cast<uint64_t>(blockIdx.x) * kChunk;
  if (begin >= bytes) return;
  const uint64_t end = min(bytes, begin + kChunk);
  const char* s = list.src[c];
  char* d = list.dst[c];
  if (((reinterpret_cast<uintptr_t>(s) | reinterpret_cast<uintptr_t>(d) | end) & 15) == 0) {
    for (uint64_t i = begin + 16 * threadIdx.x; i < end; i += 16 * kThreads)
      *reinterpret_cast<uint4*>(d + i) = *reinterpret_cast<const uint4*>(s + i);
  } else {
    for (uint64_t i = begin + threadIdx.x; i < end; i += kThreads) d[i] = s[i];
  }
}

}  // namespace

void CudaBackend::copy_batch(const std::vector<TensorCopy>& copies) {
  check_copy_batch(copies);
  for (size_t first = 0; first < copies.size(); first += kMaxCopies) {
    CopyList list{};
    int n = 0;
    uint64_t largest = 0;
    for (size_t i = first; i < std::min(copies.size(), first + kMaxCopies); ++i) {
      const TensorCopy& c = copies[i];
      if (c.dst.nbytes() == 0) continue;
      list.src[n] = static_cast<const char*>(c.src.data);
      list.dst[n] = static_cast<char*>(c.dst.data);
      list.bytes[n] = c.dst.nbytes();
      largest = std::max<uint64_t>(largest, list.bytes[n]);
      ++n;
    }
    if (n == 0) continue;
    // Stream-ordered like every op: a snapshot taken after a forward sees that forward's writes.
    const dim3 grid(static_cast<unsigned>((largest + kChunk - 1) / kChunk), static_cast<unsigned>(n));
    copy_batch_kernel<<<grid, kThreads, 0, stream_>>>(list);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace sparkserve
