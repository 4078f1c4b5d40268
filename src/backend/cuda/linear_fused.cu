// The dense projections of a layer with fewer launches (backend/ops.h: linears, linear_add_rmsnorm,
// gated_rmsnorm_linear_add_rmsnorm, gated_mlp), where linear would take a W8A8 GEMM from activation
// codes (fp8_small_n.cu at 5..16 tokens, the sm_90a wgmma kernel fp8_gemm_wgmma.cu from 17) or the
// small-N bf16 kernel (bf16_small_n.cu); anything else runs the ops' compositions.
//   linears: x quantized once for all its W8A8 linears (dynamic per-token scales: the codes do not
//     depend on the weight), the bf16 small-N ones in one launch, then each GEMM in its own branch.
//   linear_add_rmsnorm: a split-K product's partial sums (the wgmma kernel's; fp8_small_n.cu adds its
//     own in the kernel) are added by the add + norm kernel instead of fp8_reduce_splits;
//     gated_rmsnorm_linear_add_rmsnorm also makes the codes in the GDN's gated norm kernel.
//   gated_mlp: gate_up's product (or its partial sums) goes through silu_mul and the quantization of
//     down's input in one kernel.
// Results bitwise those of the compositions on this backend: the same quantization, the same GEMM
// kernel and plan, and the split sums added in the same order with the same f32 operations.
#include <cuda_fp16.h>

#include <functional>
#include <optional>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/tc_gemm.h"
#include "core/check.h"

namespace sparkserve {
namespace {

// Where linear's dispatch takes a GEMM from codes and they can be shared (dynamic per-token scales:
// the codes do not depend on the weight): fp8_small_n.cu's kernel from kFp8FewTokensMax + 1 tokens
// below the wgmma kernel's threshold, the sm_90a wgmma kernel (fp8_gemm_wgmma.cu) from it. At
// 2..kFp8FewTokensMax tokens fp8_few_tokens.cu quantizes in its own prologue: nothing to share.
bool small_n_codes(int64_t T, const Linear& w) {
  return T > kFp8FewTokensMax && T < kFp8WgmmaSmallMinTokens && fp8_small_n_takes_codes(w, T);
}
bool takes_codes(int64_t T, const Linear& w) {
  return small_n_codes(T, w) || (T >= kFp8WgmmaSmallMinTokens && fp8_wgmma_takes_codes(w));
}
bool shares_codes(int64_t T, const Linear& w, const float* x) {
  return takes_codes(T, w) && (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
}

// The K split of the GEMM from codes at (T, w): 1 (out written by the kernel; fp8_small_n.cu adds its
// splits inside the kernel) or the wgmma kernel's partial sums' count.
int codes_splits(CudaBackend& b, int64_t T, const Linear& w) {
  return small_n_codes(T, w) ? 1 : fp8_wgmma_splits(b, T, w);
}
// splits == codes_splits(b, T, w); 1: out = x W^T; > 1: part gets the wgmma kernel's partial sums.
void codes_gemm(CudaBackend& b, float* out, float* part, int splits, const __half* xq, const float* ts, int64_t T,
                const Linear& w) {
  if (small_n_codes(T, w)) {
    CHECK(splits == 1);
    fp8_small_n_codes_linear(b, out, xq, ts, T, w);
  } else {
    fp8_wgmma_codes_linear(b, out, part, splits, xq, ts, T, w);
  }
}

// Activation codes of x in the wgmma order and their scales.
struct Codes {
  CudaBackend::Scratch values, scales;
  Codes(CudaBackend& b, const float* x, int64_t T, int64_t K)
      : values(&b, static_cast<size_t>(T * fp8_wgmma_row(K)) * 2), scales(&b, static_cast<size_t>(T) * 4) {
    fp8_quantize_rows_f16(b.stream(), values.as<__half>(), scales.as<float>(), x, T, K, nullptr,
                          Fp8CodeOrder::kWgmma64);
  }
  Codes(CudaBackend& b, int64_t T, int64_t K)
      : values(&b, static_cast<size_t>(T * fp8_wgmma_row(K)) * 2), scales(&b, static_cast<size_t>(T) * 4) {}
};

// out = x W^T from codes: the kernel, then fp8_reduce_splits where it leaves partial sums.
void codes_linear(CudaBackend& b, float* out, const Codes& c, int64_t T, const Linear& w) {
  const int splits = codes_splits(b, T, w);
  CudaBackend::Scratch part(&b, splits > 1 ? static_cast<size_t>(splits * T * w.out_features) * 4 : 0);
  codes_gemm(b, out, part.as<float>(), splits, c.values.as<__half>(), c.scales.as<float>(), T, w);
  if (splits > 1)
    fp8_reduce_splits(b.stream(), out, w.out_features, part.as<float>(), splits, T, w.out_features,
                      c.scales.as<float>(), static_cast<const float*>(w.weight_scale.data));
}

}  // namespace

void CudaBackend::linears(const std::vector<Tensor>& outs, const Tensor& x, const std::vector<const Linear*>& ws) {
  CHECK(outs.size() == ws.size());
  if (ws.empty()) return;
  const int64_t K = ws[0]->in_features, T = K == 0 ? 0 : x.numel() / K;
  const auto* xp = x.ptr<const float>();
  std::vector<size_t> fp8, bf16, rest;
  for (size_t i = 0; i < ws.size(); ++i) {
    const Linear& w = *ws[i];
    CHECK(w.in_features == K && x.numel() == T * K && outs[i].numel() == T * w.out_features);
    if (shares_codes(T, w, xp))
      fp8.push_back(i);
    else if (bf16_small_n_takes(w, T) && bf16.size() < kBf16SmallNMaxLinears)
      bf16.push_back(i);
    else
      rest.push_back(i);
  }
  if (T == 0) return;
  if (fp8.size() < 2) {  // nothing to share
    rest.insert(rest.end(), fp8.begin(), fp8.end());
    fp8.clear();
  }
  // The codes are made on the stream before the fork and freed after the join.
  std::optional<Codes> codes;
  if (!fp8.empty()) codes.emplace(*this, xp, T, K);
  std::vector<std::function<void()>> branches;
  for (size_t i : fp8) branches.push_back([&, i] { codes_linear(*this, outs[i].ptr<float>(), *codes, T, *ws[i]); });
  if (!bf16.empty()) {
    branches.push_back([&] {
      std::vector<float*> o;
      std::vector<const Linear*> w;
      for (size_t i : bf16) {
        o.push_back(outs[i].ptr<float>());
        w.push_back(ws[i]);
      }
      if (!bf16_small_n_linears(*this, o, xp, T, w))
        for (size_t i : bf16) linear(outs[i], x, *ws[i]);
    });
  }
  for (size_t i : rest) branches.push_back([&, i] { linear(outs[i], x, *ws[i]); });
  run_branches(branches);
}

namespace {

// residual += (codes of x) W^T, out = rmsnorm(residual): the partial sums of a K split added by the
// add + norm kernel, else the product into scratch and add_rmsnorm.
void codes_add_rmsnorm(CudaBackend& b, const Tensor& residual, const Tensor& out, const Codes& c, int64_t T,
                       const Linear& w, const Tensor& norm_w, float eps) {
  const int64_t D = w.out_features;
  CHECK(residual.numel() == T * D && out.numel() == T * D && norm_w.numel() == D);
  const int splits = codes_splits(b, T, w);
  CudaBackend::Scratch part(&b, static_cast<size_t>(splits * T * D) * 4);
  codes_gemm(b, part.as<float>(), part.as<float>(), splits, c.values.as<__half>(), c.scales.as<float>(), T, w);
  if (splits > 1)
    fp8_splits_add_rmsnorm(b.stream(), residual.ptr<float>(), out.ptr<float>(), part.as<float>(), splits,
                           c.scales.as<float>(), static_cast<const float*>(w.weight_scale.data),
                           norm_w.ptr<const float>(), T, D, eps);
  else
    b.add_rmsnorm(residual, out, Tensor(part.ptr, DType::kF32, {T, D}, Device::kCuda), norm_w, eps);
}

}  // namespace

void CudaBackend::linear_add_rmsnorm(const Tensor& residual, const Tensor& out, const Tensor& x, const Linear& w,
                                     const Tensor& norm_w, float eps) {
  const int64_t K = w.in_features, T = K == 0 ? 0 : x.numel() / K;
  if (w.out_features != norm_w.numel() || !shares_codes(T, w, x.ptr<const float>())) {
    Backend::linear_add_rmsnorm(residual, out, x, w, norm_w, eps);  // the op chain
    return;
  }
  CHECK(x.numel() == T * K);
  codes_add_rmsnorm(*this, residual, out, Codes(*this, x.ptr<const float>(), T, K), T, w, norm_w, eps);
}

void CudaBackend::gated_rmsnorm_linear_add_rmsnorm(const Tensor& residual, const Tensor& out, const Tensor& core,
                                                   const Tensor& z, const Tensor& gate_norm_w, const Linear& w,
                                                   const Tensor& norm_w, float eps) {
  const int64_t K = w.in_features, T = K == 0 ? 0 : core.numel() / K, dv = gate_norm_w.numel();
  if (w.out_features != norm_w.numel() || !shares_codes(T, w, core.ptr<const float>()) || dv == 0 || K % dv != 0 ||
      dv > kFp8GatedNormMaxDv || K > kFp8GatedNormMaxK) {
    Backend::gated_rmsnorm_linear_add_rmsnorm(residual, out, core, z, gate_norm_w, w, norm_w, eps);  // the op chain
    return;
  }
  CHECK(core.numel() == T * K && z.numel() == T * K);
  Codes c(*this, T, K);
  fp8_gated_rmsnorm_codes(stream_, c.values.as<__half>(), c.scales.as<float>(), core.ptr<const float>(),
                          z.ptr<const float>(), gate_norm_w.ptr<const float>(), T, K / dv, dv, eps);
  codes_add_rmsnorm(*this, residual, out, c, T, w, norm_w, eps);
}

void CudaBackend::gated_mlp(const Tensor& out, const Tensor& x, const Linear& gate_up, const Linear& down) {
  const int64_t H = gate_up.in_features, I = down.in_features, T = H == 0 ? 0 : x.numel() / H;
  const auto* xp = x.ptr<const float>();
  if (gate_up.out_features != 2 * I || !shares_codes(T, gate_up, xp) || !takes_codes(T, down) || I % 16 != 0 ||
      I > kFp8SiluQuantMaxI) {
    Backend::gated_mlp(out, x, gate_up, down);  // the op chain
    return;
  }
  CHECK(x.numel() == T * H && out.numel() == T * down.out_features);
  const int splits = codes_splits(*this, T, gate_up);
  const Codes in(*this, xp, T, H);
  Scratch gu(this, static_cast<size_t>(splits * T * 2 * I) * 4);
  codes_gemm(*this, gu.as<float>(), gu.as<float>(), splits, in.values.as<__half>(), in.scales.as<float>(), T, gate_up);
  Codes act(*this, T, I);
  fp8_silu_mul_quantize(stream_, act.values.as<__half>(), act.scales.as<float>(), gu.as<float>(), splits, T, I,
                        in.scales.as<float>(), static_cast<const float*>(gate_up.weight_scale.data));
  codes_linear(*this, out.ptr<float>(), act, T, down);
}

}  // namespace sparkserve
