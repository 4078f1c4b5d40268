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

  // Rows [begin, begin + n) of the first dimension, as a view of the same buffer.
  Tensor rows(int64_t begin, int64_t n) const {
    CHECK(rank() >= 1 && begin >= 0 && n >= 0 && begin + n <= shape[0]);
    std::vector<int64_t> s = shape;
    s[0] = n;
    size_t row_bytes = shape[0] == 0 ? 0 : nbytes() / static_cast<size_t>(shape[0]);
    return Tensor(static_cast<char*>(data) + static_cast<size_t>(begin) * row_bytes, dtype, std::move(s), device);
  }
  // The same buffer seen with another shape of equal element count.
  Tensor view(std::vector<int64_t> new_shape) const {
    Tensor t(data, dtype, std::move(new_shape), device);
    CHECK(t.numel() == numel());
    return t;
  }
};

// "[3, 4]" for messages.
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace sparkserve
