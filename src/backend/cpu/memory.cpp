// Buffers of the CPU backend are plain 64-byte aligned host allocations.
#include <cstdlib>
#include <cstring>

#include "backend/cpu/cpu_backend.h"

namespace sparkserve {

CpuBackend::CpuBackend(int num_threads) : pool_(num_threads < 1 ? 1 : num_threads) {}

std::unique_ptr<Backend> make_cpu_backend(int num_threads) {
  return std::make_unique<CpuBackend>(num_threads);
}

Tensor CpuBackend::alloc(DType dtype, std::vector<int64_t> shape) {
  Tensor t(nullptr, dtype, std::move(shape), Device::kCpu);
  size_t bytes = (t.nbytes() + 63) / 64 * 64;
  t.data = std::aligned_alloc(64, bytes == 0 ? 64 : bytes);
  CHECK_MSG(t.data != nullptr, "out of host memory");
  return t;
}

void CpuBackend::free(Tensor& t) {
  std::free(t.data);
  t.data = nullptr;
}

void CpuBackend::upload(const Tensor& dst, const void* host_src) {
  std::memcpy(dst.data, host_src, dst.nbytes());
}

void CpuBackend::download(void* host_dst, const Tensor& src) {
  std::memcpy(host_dst, src.data, src.nbytes());
}

void CpuBackend::fill_zero(const Tensor& t) { std::memset(t.data, 0, t.nbytes()); }

void CpuBackend::copy(const Tensor& dst, const Tensor& src) {
  CHECK(dst.dtype == src.dtype && dst.numel() == src.numel());
  const auto* s = static_cast<const char*>(src.data);
  auto* d = static_cast<char*>(dst.data);
  CHECK_MSG(d + dst.nbytes() <= s || s + src.nbytes() <= d, "copy between overlapping tensors");
  std::memcpy(dst.data, src.data, dst.nbytes());
}

}  // namespace sparkserve
