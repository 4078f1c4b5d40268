// The CPU quantized linear (backend/cpu/quant_linear.cpp) against a double-precision reference
// built only from the pure numerics of core/nvfp4.h and core/fp8_quant.h: weights dequantized in
// full, activations fake-quantized with the reference functions, products summed in double.
//
// Tolerance: the kernel sums K f32 products in 8 lanes (tile_rows), the reference in double. The
// f32 summation error is bounded by ~(K/8 + 3)·2^-24 · Σ|x̂_k·w_k| (≈ 2.2e-6 · Σ|x̂w| at K = 256);
// we allow 1e-5 · Σ|x̂_k·w_k| + 1e-30 per output, i.e. ~4x the worst case, while a wrong nibble order,
// a multiplied-instead-of-divided global scale, a wrong partition's scale or an unquantized
// activation gives errors of order 1 (relative), which the "can fail" checks below confirm.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "core/dtype.h"
#include "core/fp8_quant.h"
#include "core/nvfp4.h"

namespace sparkserve {
namespace {

std::vector<float> normals(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Owns the uploaded tensors of a Linear.
struct Built {
  Linear lin;
  std::vector<Buffer> bufs;
  Tensor up(Backend& be, DType dt, std::vector<int64_t> shape, const void* data) {
    bufs.emplace_back(&be, dt, std::move(shape));
    be.upload(bufs.back().tensor(), data);
    return bufs.back().tensor();
  }
};

// One quantized partition (a checkpoint module [rows, K]) with its reference dequantized weight.
struct PartData {
  std::vector<uint8_t> weight;       // packed codes (NVFP4) or E4M3 codes (FP8)
  std::vector<uint8_t> block_scales; // NVFP4
  std::vector<float> row_scales;     // FP8 [rows]
  float global = 1.0f;               // CT weight_global_scale (ModelOpt stores 1/global)
  float input = 1.0f;                // CT input_global_scale / FP8 static input_scale
  std::vector<float> deq;            // [rows, K] dequantized as the format defines
};

struct Case {
  WeightFormat format;
  ActivationQuant act;
  int64_t E, P, rows, K;
};

// Builds E experts x P partitions of random data, the Linear, and the per-part references.
void build(Backend& be, const Case& c, Built& b, std::vector<PartData>& parts, uint32_t seed) {
  const bool nvfp4 = is_nvfp4(c.format);
  const int64_t N = c.P * c.rows, K = c.K;
  for (int64_t i = 0; i < c.E * c.P; ++i) {
    // Different magnitudes per part so each has its own global / input scale.
    const float sigma = 0.05f * static_cast<float>(1 + (i * 7) % 5);
    std::vector<float> w = normals(static_cast<size_t>(c.rows * K), seed + static_cast<uint32_t>(i), sigma);
    PartData p;
    p.deq.resize(w.size());
    if (nvfp4) {
      Nvfp4Weight q = nvfp4_quantize_weight(w.data(), c.rows, K);
      p.weight = q.packed;
      p.block_scales = q.scales;
      p.global = q.global_scale;
      p.input = 448.0f * 6.0f / (3.0f + static_cast<float>(i));  // as if calibrated on amax 3, 4, ...
      if (c.format == WeightFormat::kNvfp4) {
        nvfp4_dequant_ct(p.weight.data(), p.block_scales.data(), p.global, c.rows, K, p.deq.data());
      } else {
        nvfp4_dequant_modelopt(p.weight.data(), p.block_scales.data(), 1.0f / p.global, c.rows, K, p.deq.data());
      }
    } else {
      const bool per_channel = c.format == WeightFormat::kFp8Channel;
      Fp8Weight q = fp8_quantize_weight(w.data(), c.rows, K, per_channel, true);
      p.weight = q.q;
      p.row_scales.resize(static_cast<size_t>(c.rows));
      for (int64_t r = 0; r < c.rows; ++r) p.row_scales[static_cast<size_t>(r)] = q.scales[per_channel ? r : 0];
      p.input = 3.5f / 448.0f * static_cast<float>(1 + i);
      fp8_dequant_weight(q.q.data(), q.scales.data(), per_channel, c.rows, K, p.deq.data());
    }
    parts.push_back(std::move(p));
  }
  std::vector<uint8_t> w, bs;
  std::vector<float> rs, gs, is;
  for (const PartData& p : parts) {
    w.insert(w.end(), p.weight.begin(), p.weight.end());
    bs.insert(bs.end(), p.block_scales.begin(), p.block_scales.end());
    rs.insert(rs.end(), p.row_scales.begin(), p.row_scales.end());
    const bool mo = c.format == WeightFormat::kNvfp4ModelOpt;
    gs.push_back(mo ? 1.0f / p.global : p.global);
    is.push_back(mo ? 1.0f / p.input : p.input);
  }
  Linear& l = b.lin;
  l.format = c.format;
  l.activation = c.act;
  l.out_features = N;
  l.in_features = K;
  l.partitions = c.P;
  if (nvfp4) {
    l.weight = b.up(be, DType::kU8, {c.E, N, K / 2}, w.data());
    l.weight_scale = b.up(be, DType::kF8E4M3, {c.E, N, K / 16}, bs.data());
    l.global_scale = b.up(be, DType::kF32, {c.E, c.P}, gs.data());
  } else {
    l.weight = b.up(be, DType::kF8E4M3, {c.E, N, K}, w.data());
    l.weight_scale = b.up(be, DType::kF32, {c.E, N}, rs.data());
  }
  l.input_scale = b.up(be, DType::kF32, {c.E, c.P}, is.data());
}

// The activation the format's library feeds the product, from the reference functions.
std::vector<float> reference_activation(const Case& c, const PartData& p, const float* x, int64_t T) {
  const int64_t K = c.K;
  std::vector<float> xa(x, x + T * K);
  for (int64_t t = 0; t < T; ++t) {
    float* row = xa.data() + t * K;
    switch (c.act) {
      case ActivationQuant::kNone: break;
      case ActivationQuant::kNvfp4: {
        // ModelOpt stores input_scale = 1/gs and quantizes with 1/input_scale.
        const float gs = c.format == WeightFormat::kNvfp4ModelOpt ? 1.0f / (1.0f / p.input) : p.input;
        nvfp4_fake_quant_activation_row(x + t * K, K, gs, row);
        break;
      }
      case ActivationQuant::kFp8TokenDynamic:
      case ActivationQuant::kFp8TensorStatic: {
        const float s = c.act == ActivationQuant::kFp8TokenDynamic ? fp8_token_scale(x + t * K, K) : p.input;
        std::vector<uint8_t> q(static_cast<size_t>(K));
        fp8_quantize_row(x + t * K, K, s, q.data());
        for (int64_t k = 0; k < K; ++k) row[k] = fp8_e4m3_to_f32(q[static_cast<size_t>(k)]) * s;
        break;
      }
    }
  }
  return xa;
}

struct Errors {
  double max_rel = 0;  // max |y - ref| / Σ|x̂w|
  int bad = 0;
};

Errors compare(CpuBackend& be, const Case& c, uint32_t seed) {
  Built b;
  std::vector<PartData> parts;
  build(be, c, b, parts, seed);
  const int64_t T = 5, K = c.K, N = c.P * c.rows;
  std::vector<float> x = normals(static_cast<size_t>(T * K), seed + 1000, 1.5f);
  x[3] = 9.0f;  // an outlier, so per-block / per-token scales differ across blocks
  Errors err;
  for (int64_t e = 0; e < c.E; ++e) {
    std::vector<float> y(static_cast<size_t>(T * N));
    cpu::linear_rows(be.pool(), y.data(), x.data(), T, b.lin, e);
    for (int64_t p = 0; p < c.P; ++p) {
      const PartData& pd = parts[static_cast<size_t>(e * c.P + p)];
      std::vector<float> xa = reference_activation(c, pd, x.data(), T);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t r = 0; r < c.rows; ++r) {
          double ref = 0, mag = 0;
          for (int64_t k = 0; k < K; ++k) {
            const double v = static_cast<double>(xa[static_cast<size_t>(t * K + k)]) * pd.deq[static_cast<size_t>(r * K + k)];
            ref += v;
            mag += std::fabs(v);
          }
          const double got = y[static_cast<size_t>(t * N + p * c.rows + r)];
          const double rel = std::fabs(got - ref) / (mag + 1e-30);
          err.max_rel = std::max(err.max_rel, rel);
          if (!(rel <= 1e-5)) ++err.bad;
        }
    }
  }
  return err;
}

struct Named {
  const char* name;
  Case c;
};

class QuantLinearVsReference : public ::testing::TestWithParam<Named> {};

TEST_P(QuantLinearVsReference, MatchesDoubleReference) {
  CpuBackend be(2);
  const Case& c = GetParam().c;
  Errors e = compare(be, c, 11);
  EXPECT_EQ(e.bad, 0) << GetParam().name << " max relative error " << e.max_rel;
  std::printf("[measured] %s: max |y-ref|/sum|x*w| = %.3g\n", GetParam().name, e.max_rel);
}

// E = 3 experts, P = 2 partitions (gate / up) with different global and input scales; K = 256;
// 7 rows per partition so the 4-row tiles straddle the partition boundary of the decoder.
INSTANTIATE_TEST_SUITE_P(
    Formats, QuantLinearVsReference,
    ::testing::Values(Named{"nvfp4_ct_w4a4", {WeightFormat::kNvfp4, ActivationQuant::kNvfp4, 3, 2, 7, 256}},
                      Named{"nvfp4_modelopt_w4a4", {WeightFormat::kNvfp4ModelOpt, ActivationQuant::kNvfp4, 3, 2, 7, 256}},
                      Named{"nvfp4_ct_w4a16", {WeightFormat::kNvfp4, ActivationQuant::kNone, 2, 2, 8, 128}},
                      Named{"fp8_channel_dynamic", {WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 3, 2, 7, 256}},
                      Named{"fp8_tensor_dynamic", {WeightFormat::kFp8Tensor, ActivationQuant::kFp8TokenDynamic, 2, 2, 5, 64}},
                      Named{"fp8_tensor_static", {WeightFormat::kFp8Tensor, ActivationQuant::kFp8TensorStatic, 2, 2, 5, 64}},
                      Named{"fp8_channel_w8a16", {WeightFormat::kFp8Channel, ActivationQuant::kNone, 1, 1, 9, 48}}),
    [](const auto& info) { return std::string(info.param.name); });

// The comparison can fail: the same data read with the other NVFP4 convention (global scale
// multiplying instead of dividing), with the partitions' scales swapped, or without activation
// quantization, is far outside the tolerance.
TEST(QuantLinear, WrongConventionsAreDetected) {
  CpuBackend be(1);
  const Case c{WeightFormat::kNvfp4, ActivationQuant::kNvfp4, 1, 2, 4, 64};
  Built b;
  std::vector<PartData> parts;
  build(be, c, b, parts, 5);
  const int64_t T = 2, K = c.K, N = 2 * c.rows;
  std::vector<float> x = normals(static_cast<size_t>(T * K), 77, 1.0f);
  std::vector<float> good(static_cast<size_t>(T * N));
  cpu::linear_rows(be.pool(), good.data(), x.data(), T, b.lin, 0);
  auto max_diff = [&](const Linear& l) {
    std::vector<float> y(static_cast<size_t>(T * N));
    cpu::linear_rows(be.pool(), y.data(), x.data(), T, l, 0);
    double d = 0, m = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      d = std::max(d, static_cast<double>(std::fabs(y[i] - good[i])));
      m = std::max(m, static_cast<double>(std::fabs(good[i])));
    }
    return d / m;
  };
  Linear wrong = b.lin;
  wrong.format = WeightFormat::kNvfp4ModelOpt;  // multiplies by the CT (quantize-direction) scale
  EXPECT_GT(max_diff(wrong), 0.5);
  Linear no_act = b.lin;
  no_act.activation = ActivationQuant::kNone;
  EXPECT_GT(max_diff(no_act), 1e-3);
  // Partition 1 read with partition 0's scales (what collapsing gate/up to one scale does).
  std::vector<float> gs = {parts[0].global, parts[0].global}, is = {parts[0].input, parts[0].input};
  Linear collapsed = b.lin;
  collapsed.global_scale = b.up(be, DType::kF32, {1, 2}, gs.data());
  collapsed.input_scale = b.up(be, DType::kF32, {1, 2}, is.data());
  EXPECT_GT(max_diff(collapsed), 0.1);
}

// Bits per weight in memory: NVFP4 keeps 4-bit codes + one E4M3 per 16 (4.5 bits) + a few floats.
TEST(QuantLinear, Nvfp4StaysQuantizedInMemory) {
  CpuBackend be(1);
  const Case c{WeightFormat::kNvfp4, ActivationQuant::kNvfp4, 2, 2, 16, 256};
  Built b;
  std::vector<PartData> parts;
  build(be, c, b, parts, 3);
  const double bits = 8.0 * static_cast<double>(b.lin.weight.nbytes() + b.lin.weight_scale.nbytes() +
                                                b.lin.global_scale.nbytes() + b.lin.input_scale.nbytes()) /
                      static_cast<double>(c.E * c.P * c.rows * c.K);
  EXPECT_LT(bits, 4.6);
  EXPECT_GE(bits, 4.5);
}

}  // namespace
}  // namespace sparkserve
