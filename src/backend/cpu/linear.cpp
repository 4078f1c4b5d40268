// y = x W^T. Parallel over output features: each worker converts one weight row to f32 once and
// reuses it for every token row, so bf16 weights are read once per call whatever T is.
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"

namespace sparkserve {

namespace cpu {
// out[t, n] = x[t, :] . W[n, :] for W = rows [0, N) of the payload starting at element w_offset.
// x: [T, K] f32 -> out: [T, N] f32 (row stride N).
void matmul_rows(ThreadPool& pool, float* out, const float* x, int64_t T, int64_t K, int64_t N,
                 const Tensor& w, WeightFormat format, int64_t w_offset) {
  pool.parallel_for(N, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> row;
    row.resize(static_cast<size_t>(K));
    for (int64_t n = b; n < e; ++n) {
      weight_row_to_f32(row.data(), w, format, w_offset + n * K, K);
      for (int64_t t = 0; t < T; ++t) out[t * N + n] = dot(x + t * K, row.data(), K);
    }
  }, 4);
}
}  // namespace cpu

void CpuBackend::linear(const Tensor& out, const Tensor& x, const Linear& w) {
  const int64_t K = w.in_features, N = w.out_features, T = x.numel() / K;
  CHECK(x.numel() == T * K && out.numel() == T * N);
  cpu::matmul_rows(pool_, out.ptr<float>(), x.ptr<const float>(), T, K, N, w.weight, w.format, 0);
}

}  // namespace sparkserve
