// Tensor: a non-owning view of a contiguous row-major buffer on some device.
// Ownership lives with whoever allocated the buffer (a backend, the loader, a test).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/dtype.h"

namespace sparkserve {

enum class Device : uint8_t { kCpu, kCuda };

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  Device device = Device::kCpu;

  Tensor() = default;
  Tensor(void* d, DType t, std::vector<int64_t> s, Device dev = Device::kCpu)
      : data(d), dtype(t), shape(std::move(s)), device(dev) {}

  int rank() const { return static_cast<int>(shape.size()); }
  int64_t dim(int i) const {
    if (i < 0) i += rank();
    CHECK(i >= 0 && i < rank());
    return shape[static_cast<size_t>(i)];
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  template <class T>
  T* ptr() const { return static_cast<T*>(data); }
};

// "[3, 4]" for messages.
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace sparkserve
