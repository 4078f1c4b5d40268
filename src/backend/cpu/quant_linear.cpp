// Quantized y = x W^T on the CPU: the executable specification of the NVFP4 / FP8 kernels.
// Weights stay quantized in memory (NVFP4: packed E2M1 codes + E4M3 block scales + one f32 global
// scale per partition, ~4.5 bits/weight; FP8: E4M3 codes + f32 row scales) and are dequantized to
// f32 four rows at a time inside matmul_rows_decoded's loop, with the reference functions of
// core/nvfp4.h and core/fp8_quant.h. Activations are quantized per partition (a fused gate_up keeps
// gate's and up's own input scales) exactly as the format's library does at run time:
//   NVFP4 W4A4, compressed-tensors: x̂ = e2m1(q)·fp8(sf) / input_global_scale   (CT fake-quant)
//   NVFP4 W4A4, ModelOpt:           x̂ = e2m1(q)·fp8(sf) · input_scale, quantized with gs = 1/input_scale
//   FP8 W8A8: y = s_t · ws[n] · Σ xq·wq, the codes' sum in f32 (each product is exact in f32),
//             s_t per token (dynamic) or the static input_scale.
//   W4A16 / W8A16 (activation kNone): x stays f32, the weight is fully dequantized.
#include <cmath>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/check.h"
#include "core/dtype.h"
#include "core/fp8_quant.h"
#include "core/nvfp4.h"
#include "core/thread_pool.h"

namespace sparkserve::cpu {
namespace {

// E4M3 code -> f32 for all 256 codes (NaN codes included; the loader never hands them to us as scales).
const float* fp8_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(256);
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = fp8_e4m3_to_f32(static_cast<uint8_t>(i));
    return t;
  }();
  return table.data();
}

// x: [T, K] f32 -> xq: [T, K] f32 NVFP4 fake-quantized per 16 with this partition's scale.
void nvfp4_activation(const float* x, int64_t T, int64_t K, WeightFormat format, float input_scale, float* xq) {
  const bool modelopt = format == WeightFormat::kNvfp4ModelOpt;
  const float gs = modelopt ? 1.0f / input_scale : input_scale;  // quantize direction
  std::vector<uint8_t> codes(static_cast<size_t>(K)), sf(static_cast<size_t>(K / kNvfp4BlockSize));
  const float* f8 = fp8_table();
  for (int64_t t = 0; t < T; ++t) {
    nvfp4_quantize_activation_row(x + t * K, K, gs, codes.data(), sf.data());
    float* o = xq + t * K;
    for (int64_t k = 0; k < K; ++k) {
      const float v = e2m1_to_f32(codes[static_cast<size_t>(k)]) * f8[sf[static_cast<size_t>(k / kNvfp4BlockSize)]];
      o[k] = modelopt ? v * input_scale : v / gs;
    }
  }
}

void quant_linear_rows(ThreadPool& pool, float* out, const float* x, int64_t T, const Linear& w, int64_t e) {
  const int64_t K = w.in_features, N = w.out_features, P = w.partitions;
  CHECK(P >= 1 && N % P == 0);
  const int64_t Np = N / P;
  const float* f8 = fp8_table();
  const bool nvfp4 = is_nvfp4(w.format);
  CHECK(nvfp4 || is_fp8(w.format));
  if (nvfp4) CHECK(K % kNvfp4BlockSize == 0 && w.global_scale.numel() >= (e + 1) * P);
  const bool quant_act = w.activation != ActivationQuant::kNone;
  std::vector<float> xq(quant_act ? static_cast<size_t>(T * K) : 0);
  std::vector<float> token_scale(static_cast<size_t>(T), 1.0f);
  for (int64_t p = 0; p < P; ++p) {
    const int64_t row0 = p * Np;
    const float* xa = x;
    switch (w.activation) {
      case ActivationQuant::kNone:
        break;
      case ActivationQuant::kNvfp4:
        CHECK(nvfp4 && w.input_scale.numel() >= (e + 1) * P);
        nvfp4_activation(x, T, K, w.format, w.input_scale.ptr<const float>()[e * P + p], xq.data());
        xa = xq.data();
        break;
      case ActivationQuant::kFp8TokenDynamic:
      case ActivationQuant::kFp8TensorStatic: {
        CHECK(!nvfp4);
        // The codes themselves (unscaled): their products are exact in f32; scales apply after the sum.
        std::vector<uint8_t> codes(static_cast<size_t>(K));
        for (int64_t t = 0; t < T; ++t) {
          const float s = w.activation == ActivationQuant::kFp8TokenDynamic
                              ? fp8_token_scale(x + t * K, K)
                              : w.input_scale.ptr<const float>()[e * P + p];
          token_scale[static_cast<size_t>(t)] = s;
          fp8_quantize_row(x + t * K, K, s, codes.data());
          for (int64_t k = 0; k < K; ++k) xq[static_cast<size_t>(t * K + k)] = f8[codes[static_cast<size_t>(k)]];
        }
        xa = xq.data();
        break;
      }
    }
    RowDecoder decode;
    if (nvfp4) {
      const uint8_t* packed = w.weight.ptr<const uint8_t>() + e * N * (K / 2);
      const uint8_t* scales = w.weight_scale.ptr<const uint8_t>() + e * N * (K / kNvfp4BlockSize);
      const float gs = w.global_scale.ptr<const float>()[e * P + p];
      const bool modelopt = w.format == WeightFormat::kNvfp4ModelOpt;
      decode = [=](float* dst, int64_t n0, int64_t nr) {
        const int64_t n = row0 + n0;
        if (modelopt) {
          nvfp4_dequant_modelopt(packed + n * (K / 2), scales + n * (K / kNvfp4BlockSize), gs, nr, K, dst);
        } else {
          nvfp4_dequant_ct(packed + n * (K / 2), scales + n * (K / kNvfp4BlockSize), gs, nr, K, dst);
        }
      };
    } else {
      const uint8_t* codes = w.weight.ptr<const uint8_t>() + e * N * K;
      const float* ws = w.weight_scale.ptr<const float>() + e * N;
      decode = [=](float* dst, int64_t n0, int64_t nr) {
        for (int64_t r = 0; r < nr; ++r) {
          const int64_t n = row0 + n0 + r;
          // W8A8: unscaled codes (scaled after the sum); W8A16: the dequantized weight.
          const float s = quant_act ? 1.0f : ws[n];
          for (int64_t k = 0; k < K; ++k) dst[r * K + k] = f8[codes[n * K + k]] * s;
        }
      };
    }
    matmul_rows_decoded(pool, out + row0, N, xa, T, K, Np, decode);
    if (!nvfp4 && quant_act) {
      const float* ws = w.weight_scale.ptr<const float>() + e * N;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t n = row0; n < row0 + Np; ++n)
          out[t * N + n] = static_cast<float>(static_cast<double>(token_scale[static_cast<size_t>(t)]) * ws[n] *
                                              out[t * N + n]);
    }
  }
}

}  // namespace

void linear_rows(ThreadPool& pool, float* out, const float* x, int64_t T, const Linear& w, int64_t expert) {
  const int64_t K = w.in_features, N = w.out_features;
  if (!is_quantized(w.format)) {
    matmul_rows(pool, out, x, T, K, N, w.weight, w.format, expert * N * K);
    return;
  }
  quant_linear_rows(pool, out, x, T, w, expert);
}

}  // namespace sparkserve::cpu
