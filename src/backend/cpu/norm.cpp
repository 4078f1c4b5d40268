// RMSNorm variants (model-qwen35.md §2.3): zero-centred x̂·(1+w) for the decoder, final and q/k
// norms; plain-weight gated x̂·w·silu(z) inside GDN. Sums of squares in double: cheap, and it keeps
// the reference free of length-dependent rounding.
#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"

namespace sparkserve {

namespace {
float inv_rms(const float* x, int64_t D, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(D) + eps));
}
}  // namespace

void CpuBackend::rmsnorm(const Tensor& out, const Tensor& x, const Tensor& w, float eps) {
  const int64_t D = w.numel(), R = x.numel() / D;
  CHECK(x.numel() == R * D && out.numel() == x.numel());
  const float* px = x.ptr<const float>();
  const float* pw = w.ptr<const float>();
  float* po = out.ptr<float>();
  pool_.parallel_for(R, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float s = inv_rms(px + r * D, D, eps);
      for (int64_t i = 0; i < D; ++i) po[r * D + i] = px[r * D + i] * s * (1.0f + pw[i]);
    }
  }, cpu::min_chunk_for(2 * D));
}

void CpuBackend::add_rmsnorm(const Tensor& residual, const Tensor& out, const Tensor& delta,
                             const Tensor& w, float eps) {
  CHECK(residual.numel() == delta.numel());
  add(residual, residual, delta);
  rmsnorm(out, residual, w, eps);
}

void CpuBackend::gated_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& z, const Tensor& w,
                               float eps) {
  const int64_t D = w.numel(), R = x.numel() / D;
  CHECK(x.numel() == R * D && z.numel() == x.numel() && out.numel() == x.numel());
  const float* px = x.ptr<const float>();
  const float* pz = z.ptr<const float>();
  const float* pw = w.ptr<const float>();
  float* po = out.ptr<float>();
  pool_.parallel_for(R, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      float s = inv_rms(px + r * D, D, eps);
      for (int64_t i = 0; i < D; ++i)
        po[r * D + i] = px[r * D + i] * s * pw[i] * cpu::silu(pz[r * D + i]);
    }
  }, cpu::min_chunk_for(2 * D));
}

}  // namespace sparkserve
