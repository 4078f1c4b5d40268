// y = x W^T. Parallel over output features: each worker converts a group of 4 weight rows to f32
// once and reuses them for every token row, so bf16 weights are read once per call whatever T is.
// The inner kernel computes a 4 (weight rows) x 2 (tokens) tile so each loaded value is used
// several times; every output element is still the same 8-lane sum as cpu::dot, so results do not
// depend on T, the tiling or the thread split (batched == alone, bit for bit).
#include <algorithm>
#include <cstring>
#include <vector>

// The AVX2 clones pass 32-byte vectors between inlined helpers; no ABI boundary is crossed.
#pragma GCC diagnostic ignored "-Wpsabi"

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"

namespace sparkserve {

namespace cpu {
namespace {

constexpr int kRows = 4;

// Weight rows to f32 (bf16 -> f32 is a shift); cloned for AVX2 like the tile kernel.
__attribute__((target_clones("avx2", "default")))
void bf16_rows_to_f32(float* dst, const uint16_t* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(&dst[i], &bits, 4);
  }
}

// 8 floats as one value: SSE pairs by default, one AVX register in the avx2 clone.
typedef float v8f __attribute__((vector_size(32)));
inline v8f load8(const float* p) {
  v8f v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Same arithmetic as dot(): 8 lane sums, combined pairwise, then the tail.
inline float finish(v8f acc, const float* a, const float* b, int64_t from, int64_t n) {
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (int64_t i = from; i < n; ++i) s += a[i] * b[i];
  return s;
}

// out[t * N + r] = x[t] . w[r] for r < kRows, t < T. w: [kRows, K] f32 rows.
// Built for AVX2 too where the CPU has it (same operations, so identical results).
__attribute__((target_clones("avx2", "default")))
void tile_rows(float* out, int64_t N, const float* x, int64_t T, int64_t K, const float* w) {
  const int64_t K8 = K / 8 * 8;
  const float* w0 = w;
  const float* w1 = w + K;
  const float* w2 = w + 2 * K;
  const float* w3 = w + 3 * K;
  int64_t t = 0;
  for (; t + 2 <= T; t += 2) {
    const float* x0 = x + t * K;
    const float* x1 = x0 + K;
    v8f a00 = {}, a01 = {}, a02 = {}, a03 = {}, a10 = {}, a11 = {}, a12 = {}, a13 = {};
    for (int64_t k = 0; k < K8; k += 8) {
      const v8f u = load8(x0 + k), v = load8(x1 + k);
      const v8f b0 = load8(w0 + k), b1 = load8(w1 + k), b2 = load8(w2 + k), b3 = load8(w3 + k);
      a00 += u * b0; a01 += u * b1; a02 += u * b2; a03 += u * b3;
      a10 += v * b0; a11 += v * b1; a12 += v * b2; a13 += v * b3;
    }
    out[t * N + 0] = finish(a00, x0, w0, K8, K);
    out[t * N + 1] = finish(a01, x0, w1, K8, K);
    out[t * N + 2] = finish(a02, x0, w2, K8, K);
    out[t * N + 3] = finish(a03, x0, w3, K8, K);
    out[(t + 1) * N + 0] = finish(a10, x1, w0, K8, K);
    out[(t + 1) * N + 1] = finish(a11, x1, w1, K8, K);
    out[(t + 1) * N + 2] = finish(a12, x1, w2, K8, K);
    out[(t + 1) * N + 3] = finish(a13, x1, w3, K8, K);
  }
  for (; t < T; ++t) {
    const float* x0 = x + t * K;
    v8f a0 = {}, a1 = {}, a2 = {}, a3 = {};
    for (int64_t k = 0; k < K8; k += 8) {
      const v8f u = load8(x0 + k);
      a0 += u * load8(w0 + k); a1 += u * load8(w1 + k); a2 += u * load8(w2 + k); a3 += u * load8(w3 + k);
    }
    out[t * N + 0] = finish(a0, x0, w0, K8, K);
    out[t * N + 1] = finish(a1, x0, w1, K8, K);
    out[t * N + 2] = finish(a2, x0, w2, K8, K);
    out[t * N + 3] = finish(a3, x0, w3, K8, K);
  }
}

}  // namespace

void matmul_rows_decoded(ThreadPool& pool, float* out, int64_t ldo, const float* x, int64_t T, int64_t K,
                         int64_t N, const RowDecoder& decode) {
  const int64_t groups = (N + kRows - 1) / kRows;
  pool.parallel_for(groups, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> rows;
    rows.resize(static_cast<size_t>(kRows * K));
    for (int64_t g = b; g < e; ++g) {
      const int64_t n0 = g * kRows, nr = std::min<int64_t>(kRows, N - n0);
      decode(rows.data(), n0, nr);
      if (nr == kRows) {
        tile_rows(out + n0, ldo, x, T, K, rows.data());
      } else {  // the last, partial group
        for (int64_t r = 0; r < nr; ++r)
          for (int64_t t = 0; t < T; ++t) out[t * ldo + n0 + r] = dot(x + t * K, &rows[static_cast<size_t>(r * K)], K);
      }
    }
  }, min_chunk_for(T * K * kRows));
}

void matmul_rows(ThreadPool& pool, float* out, const float* x, int64_t T, int64_t K, int64_t N,
                 const Tensor& w, WeightFormat format, int64_t w_offset) {
  matmul_rows_decoded(pool, out, N, x, T, K, N, [&](float* rows, int64_t n0, int64_t nr) {
    if (format == WeightFormat::kBf16) {  // nr consecutive rows are contiguous in memory
      bf16_rows_to_f32(rows, w.ptr<const uint16_t>() + w_offset + n0 * K, nr * K);
    } else {
      weight_row_to_f32(rows, w, format, w_offset + n0 * K, nr * K);
    }
  });
}

}  // namespace cpu

void CpuBackend::linear(const Tensor& out, const Tensor& x, const Linear& w) {
  const int64_t K = w.in_features, N = w.out_features, T = x.numel() / K;
  CHECK(x.numel() == T * K && out.numel() == T * N);
  cpu::linear_rows(pool_, out.ptr<float>(), x.ptr<const float>(), T, w, 0);
}

}  // namespace sparkserve
