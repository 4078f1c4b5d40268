// Helpers for the CPU op tests: host tensors filled with fresh random values, and comparisons
// against double-precision formulas written in the tests themselves.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace sparkserve::test {

// A host f32/i32/bf16 tensor that owns its storage.
struct HostTensor {
  std::vector<uint8_t> bytes;
  Tensor t;
  HostTensor(DType dtype, std::vector<int64_t> shape) {
    Tensor probe(nullptr, dtype, shape);
    bytes.assign(probe.nbytes() + 64, 0);
    t = Tensor(bytes.data(), dtype, std::move(shape));
  }
  float* f() const { return t.ptr<float>(); }
  int32_t* i() const { return t.ptr<int32_t>(); }
  uint16_t* h() const { return t.ptr<uint16_t>(); }
  int64_t n() const { return t.numel(); }
  operator const Tensor&() const { return t; }  // NOLINT
};

inline std::mt19937& rng() {
  static std::mt19937 g(12345);
  return g;
}

inline HostTensor random_f32(std::vector<int64_t> shape, float scale = 1.0f) {
  HostTensor h(DType::kF32, std::move(shape));
  std::normal_distribution<float> d(0.0f, scale);
  for (int64_t i = 0; i < h.n(); ++i) h.f()[i] = d(rng());
  return h;
}

// A bf16 matrix with random values; `values` receives the exact (bf16-representable) numbers.
inline HostTensor random_bf16(std::vector<int64_t> shape, std::vector<double>& values, float scale = 1.0f) {
  HostTensor h(DType::kBF16, std::move(shape));
  std::normal_distribution<float> d(0.0f, scale);
  values.resize(static_cast<size_t>(h.n()));
  for (int64_t i = 0; i < h.n(); ++i) {
    h.h()[i] = f32_to_bf16(d(rng()));
    values[static_cast<size_t>(i)] = bf16_to_f32(h.h()[i]);
  }
  return h;
}

inline Linear make_linear(const HostTensor& w, int64_t out, int64_t in) {
  Linear l;
  l.format = w.t.dtype == DType::kBF16 ? WeightFormat::kBf16 : WeightFormat::kF32;
  l.weight = w.t;
  l.out_features = out;
  l.in_features = in;
  return l;
}

// |got - want| <= atol + rtol * |want| elementwise, with the first failure reported.
inline void expect_close(const float* got, const std::vector<double>& want, double rtol, double atol,
                         const char* what) {
  for (size_t i = 0; i < want.size(); ++i) {
    double tol = atol + rtol * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= tol)) {
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i] << " (tol " << tol << ")";
      return;
    }
  }
}

inline double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double silu_d(double x) { return x * sigmoid_d(x); }

}  // namespace sparkserve::test
