// Embedding lookup, elementwise activations and gates, row gathers, argmax and draws.
#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "core/truncated_draw.h"

namespace sparkserve {

void CpuBackend::embedding(const Tensor& out, const Tensor& ids, const Linear& table) {
  const int64_t T = ids.numel(), H = table.in_features;
  CHECK(out.numel() == T * H && ids.dtype == DType::kI32);
  const int32_t* id = ids.ptr<const int32_t>();
  float* o = out.ptr<float>();
  pool_.parallel_for(T, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      CHECK(id[t] >= 0 && id[t] < table.out_features);
      cpu::weight_row_to_f32(o + t * H, table.weight, table.format, static_cast<int64_t>(id[t]) * H, H);
    }
  }, cpu::min_chunk_for(H));
}

void CpuBackend::silu_mul(const Tensor& out, const Tensor& gate_up) {
  const int64_t T = gate_up.dim(0), I = gate_up.dim(1) / 2;
  CHECK(out.numel() == T * I);
  const float* gu = gate_up.ptr<const float>();
  float* o = out.ptr<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < I; ++i) o[t * I + i] = cpu::silu(gu[t * 2 * I + i]) * gu[t * 2 * I + I + i];
}

void CpuBackend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  CHECK(out.numel() == a.numel() && a.numel() == b.numel());
  const float* pa = a.ptr<const float>();
  const float* pb = b.ptr<const float>();
  float* o = out.ptr<float>();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) o[i] = pa[i] + pb[i];
}

void CpuBackend::sigmoid_mul(const Tensor& x, const Tensor& gate) {
  CHECK(x.numel() == gate.numel());
  float* px = x.ptr<float>();
  const float* pg = gate.ptr<const float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) px[i] *= cpu::sigmoid(pg[i]);
}

void CpuBackend::add_sigmoid_scaled(const Tensor& out, const Tensor& y, const Tensor& gate_logit) {
  const int64_t T = out.dim(0), H = out.dim(1);
  CHECK(y.numel() == T * H && gate_logit.numel() == T);
  float* o = out.ptr<float>();
  const float* py = y.ptr<const float>();
  const float* g = gate_logit.ptr<const float>();
  for (int64_t t = 0; t < T; ++t) {
    float s = cpu::sigmoid(g[t]);
    for (int64_t i = 0; i < H; ++i) o[t * H + i] += s * py[t * H + i];
  }
}

void CpuBackend::gather_rows(const Tensor& out, const Tensor& x, const std::vector<int64_t>& rows) {
  const int64_t D = x.numel() / x.dim(0);
  CHECK(out.numel() == static_cast<int64_t>(rows.size()) * D);
  for (size_t i = 0; i < rows.size(); ++i) {
    CHECK(rows[i] >= 0 && rows[i] < x.dim(0));
    std::memcpy(out.ptr<float>() + static_cast<int64_t>(i) * D, x.ptr<const float>() + rows[i] * D,
                static_cast<size_t>(D) * 4);
  }
}

void CpuBackend::gather_rows_at(const Tensor& out, const Tensor& x, const Tensor& rows) {
  const int64_t T = x.dim(0), D = x.numel() / T, R = rows.numel();
  CHECK(rows.dtype == DType::kI32 && out.numel() == R * D);
  for (int64_t i = 0; i < R; ++i) {
    const int64_t r = rows.ptr<const int32_t>()[i];
    float* o = out.ptr<float>() + i * D;
    if (r < 0 || r >= T) {
      std::fill(o, o + D, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    std::memcpy(o, x.ptr<const float>() + r * D, static_cast<size_t>(D) * 4);
  }
}

std::vector<RowArgmax> CpuBackend::argmax(const Tensor& logits, int64_t vocab, const std::vector<int32_t>& excluded) {
  const int64_t R = logits.dim(0), V = logits.dim(1);
  CHECK(vocab >= 1 && vocab <= V && excluded.size() <= kArgmaxMaxExcluded);
  std::vector<RowArgmax> out(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const float* row = logits.ptr<const float>() + r * V;
    RowArgmax& a = out[static_cast<size_t>(r)];
    bool found = false;
    for (int64_t i = 0; i < vocab; ++i) {
      const float v = row[i];
      if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) {
        if (a.nonfinite < 0) a.nonfinite = static_cast<int32_t>(i);
        if (std::isnan(v)) continue;
      }
      if (std::find(excluded.begin(), excluded.end(), static_cast<int32_t>(i)) != excluded.end()) continue;
      if (!found || v > row[a.id]) {
        a.id = static_cast<int32_t>(i);
        found = true;
      }
    }
  }
  return out;
}

std::vector<RowArgmax> CpuBackend::draw(const Tensor& logits, int64_t vocab, const std::vector<int32_t>& excluded,
                                        const std::vector<RowDraw>& rows) {
  const int64_t R = logits.dim(0), V = logits.dim(1);
  CHECK(vocab >= 1 && vocab <= V && excluded.size() <= kArgmaxMaxExcluded && static_cast<int64_t>(rows.size()) == R);
  std::vector<RowArgmax> out(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const RowDraw& p = rows[static_cast<size_t>(r)];
    if (!(p.temperature > 0.0f)) continue;
    const float* row = logits.ptr<const float>() + r * V;
    RowArgmax& a = out[static_cast<size_t>(r)];
    for (int64_t i = 0; i < vocab && a.nonfinite < 0; ++i)
      if (std::isnan(row[i]) || row[i] == std::numeric_limits<float>::infinity()) a.nonfinite = static_cast<int32_t>(i);
    if (a.nonfinite >= 0) continue;
    std::vector<float> work(row, row + vocab);
    for (int32_t id : excluded)
      if (id >= 0 && id < vocab) work[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
    a.id = draw_truncated(work, p.temperature, p.top_k, p.top_p, p.min_p, p.u);
    if (a.id < 0) {  // no possible token: the lowest column not excluded
      a.id = 0;
      while (a.id + 1 < vocab && std::find(excluded.begin(), excluded.end(), a.id) != excluded.end()) ++a.id;
    }
  }
  return out;
}

}  // namespace sparkserve
