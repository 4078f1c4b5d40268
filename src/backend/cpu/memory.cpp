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

void CpuBackend::copy_batch(const std::vector<TensorCopy>& copies) {
  check_copy_batch(copies);
  for (const TensorCopy& c : copies) std::memcpy(c.dst.data, c.src.data, c.dst.nbytes());
}

}  // namespace sparkserve
