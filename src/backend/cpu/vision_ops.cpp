// The vision tower's ops (ops.h "vision tower"): LayerNorm, bias, GELU, the interpolated position
// embedding, axis rotary and bidirectional segment attention. Moments and softmax sums in double,
// as norm.cpp does, so the reference has no length-dependent rounding.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"

namespace sparkserve {

void CpuBackend::layernorm(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, float eps) {
  const int64_t D = w.numel(), R = x.numel() / D;
  CHECK(x.numel() == R * D && out.numel() == x.numel() && b.numel() == D);
  const float* px = x.ptr<const float>();
  const float* pw = w.ptr<const float>();
  const float* pb = b.ptr<const float>();
  float* po = out.ptr<float>();
  pool_.parallel_for(R, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = px + r * D;
      double sum = 0;
      for (int64_t i = 0; i < D; ++i) sum += xr[i];
      const double mean = sum / static_cast<double>(D);
      double var = 0;
      for (int64_t i = 0; i < D; ++i) var += (xr[i] - mean) * (xr[i] - mean);
      const float m = static_cast<float>(mean);
      const float rstd = static_cast<float>(1.0 / std::sqrt(var / static_cast<double>(D) + eps));
      for (int64_t i = 0; i < D; ++i) po[r * D + i] = (xr[i] - m) * rstd * pw[i] + pb[i];
    }
  }, cpu::min_chunk_for(3 * D));
}

void CpuBackend::add_bias(const Tensor& x, const Tensor& b) {
  const int64_t D = b.numel(), R = x.numel() / D;
  CHECK(x.numel() == R * D);
  float* px = x.ptr<float>();
  const float* pb = b.ptr<const float>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < D; ++i) px[r * D + i] += pb[i];
}

void CpuBackend::linear_bias(const Tensor& out, const Tensor& x, const Linear& w, const Tensor& b, bool accumulate) {
  if (!accumulate) {
    linear(out, x, w);
    add_bias(out, b);
    return;
  }
  Tensor d = alloc(DType::kF32, {out.numel() / w.out_features, w.out_features});
  linear(d, x, w);
  add_bias(d, b);
  add(out, out, d);
  free(d);
}

void CpuBackend::gelu(const Tensor& out, const Tensor& x, bool tanh_approx) {
  CHECK(out.numel() == x.numel());
  const float* px = x.ptr<const float>();
  float* po = out.ptr<float>();
  const int64_t N = x.numel();
  pool_.parallel_for(N, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float v = px[i];
      if (tanh_approx) {
        const float k = 0.7978845608028654f;  // sqrt(2 / pi)
        po[i] = 0.5f * v * (1.0f + std::tanh(k * (v + 0.044715f * v * v * v)));
      } else {
        po[i] = 0.5f * v * (1.0f + std::erf(v * 0.7071067811865476f));
      }
    }
  }, 4096);
}

void CpuBackend::embedding_mix(const Tensor& out, const Tensor& ids, const Tensor& weights, const Linear& table) {
  const int64_t N = ids.dim(0), K = ids.dim(1), D = table.in_features;
  CHECK(ids.dtype == DType::kI32 && weights.numel() == N * K && out.numel() == N * D);
  const int32_t* id = ids.ptr<const int32_t>();
  const float* wt = weights.ptr<const float>();
  float* po = out.ptr<float>();
  pool_.parallel_for(N, [&](int64_t lo, int64_t hi) {
    std::vector<float> row(static_cast<size_t>(D));
    for (int64_t n = lo; n < hi; ++n) {
      float* o = po + n * D;
      for (int64_t k = 0; k < K; ++k) {
        const int32_t r = id[n * K + k];
        CHECK(r >= 0 && r < table.out_features);
        cpu::weight_row_to_f32(row.data(), table.weight, table.format, static_cast<int64_t>(r) * D, D);
        const float w = wt[n * K + k];
        for (int64_t i = 0; i < D; ++i) o[i] = k == 0 ? row[static_cast<size_t>(i)] * w : o[i] + row[static_cast<size_t>(i)] * w;
      }
    }
  }, cpu::min_chunk_for(K * D));
}

void CpuBackend::rope_axes(const Tensor& x, const Tensor& positions, const Tensor& axis, const Tensor& inv_freq) {
  const int64_t T = x.dim(0), heads = x.dim(1), hd = x.dim(2), P = inv_freq.numel();
  const int64_t A = positions.numel() / std::max<int64_t>(T, 1);
  CHECK(2 * P <= hd && axis.numel() == P && positions.numel() == T * A && positions.dtype == DType::kI32);
  const int32_t* pos = positions.ptr<const int32_t>();
  const int32_t* ax = axis.ptr<const int32_t>();
  const float* f = inv_freq.ptr<const float>();
  pool_.parallel_for(T, [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      for (int64_t i = 0; i < P; ++i) {
        CHECK(ax[i] >= 0 && ax[i] < A);
        const float angle = static_cast<float>(pos[t * A + ax[i]]) * f[i];
        const float c = std::cos(angle), s = std::sin(angle);
        for (int64_t h = 0; h < heads; ++h) {
          float* v = x.ptr<float>() + (t * heads + h) * hd;
          const float x1 = v[i], x2 = v[i + P];
          v[i] = x1 * c - x2 * s;
          v[i + P] = x2 * c + x1 * s;
        }
      }
    }
  }, cpu::min_chunk_for(P * heads * 4));
}

void CpuBackend::attention_segments(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const std::vector<int64_t>& segment_lengths, float scale) {
  const int64_t N = q.dim(0), H = q.dim(1), hd = q.dim(2);
  CHECK(k.numel() == q.numel() && v.numel() == q.numel() && out.numel() == q.numel());
  std::vector<int64_t> seg_begin(static_cast<size_t>(N));  // first row of each row's segment
  std::vector<int64_t> seg_len(static_cast<size_t>(N));
  int64_t row = 0;
  for (int64_t len : segment_lengths) {
    CHECK(len > 0 && row + len <= N);
    for (int64_t i = 0; i < len; ++i) {
      seg_begin[static_cast<size_t>(row + i)] = row;
      seg_len[static_cast<size_t>(row + i)] = len;
    }
    row += len;
  }
  CHECK_MSG(row == N, "segment lengths must sum to the number of rows");
  const float* pq = q.ptr<const float>();
  const float* pk = k.ptr<const float>();
  const float* pv = v.ptr<const float>();
  float* po = out.ptr<float>();
  pool_.parallel_for(N * H, [&](int64_t lo, int64_t hi) {
    std::vector<float> p;
    std::vector<double> acc(static_cast<size_t>(hd));
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t n = item / H, h = item % H;
      const int64_t b = seg_begin[static_cast<size_t>(n)], L = seg_len[static_cast<size_t>(n)];
      const float* qi = pq + (n * H + h) * hd;
      p.resize(static_cast<size_t>(L));
      float mx = -INFINITY;
      for (int64_t j = 0; j < L; ++j) {
        p[static_cast<size_t>(j)] = cpu::dot(qi, pk + ((b + j) * H + h) * hd, hd) * scale;
        mx = std::max(mx, p[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (int64_t j = 0; j < L; ++j) {
        p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx);
        sum += p[static_cast<size_t>(j)];
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < L; ++j) {
        const float* vj = pv + ((b + j) * H + h) * hd;
        const double pj = p[static_cast<size_t>(j)];
        for (int64_t d = 0; d < hd; ++d) acc[static_cast<size_t>(d)] += pj * vj[d];
      }
      float* o = po + (n * H + h) * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = static_cast<float>(acc[static_cast<size_t>(d)] / sum);
    }
  }, cpu::min_chunk_for(seg_len.empty() ? 1 : 2 * hd * seg_len[0]));
}

}  // namespace sparkserve
