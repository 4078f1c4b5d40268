// gpu_ops group "dense_fused": the dense-projection ops of backend/ops.h that the CUDA backend runs
// with fewer launches (backend/cuda/linear_fused.cu): linears (one activation quantization for all
// W8A8 linears of an input, the small bf16 ones in one launch), linear_add_rmsnorm (split-K sums
// added by the add + norm kernel), gated_rmsnorm_linear_add_rmsnorm (the codes made by the gated
// norm kernel) and gated_mlp (silu_mul and the down input's quantization in one kernel after
// gate_up), at the 35B-A3B shapes, on fresh random inputs.
// Bounds. Against the same ops run one by one on the GPU (the compositions Backend:: defines):
// bitwise (kExact), since the fused kernels compute the same f32 operations in the same order and
// the codes the same quantization. Against the CPU backend: W8A8 outputs kFp32 (the codes are the
// CPU's, both sides sum the same exact products in f32: gemm_checks.cpp), the bf16 small-N outputs
// kForms (x = hi + lo to 2^-16 relative: gemm_checks.cpp's split-bf16 bound, 1.5e-5 plus the f32
// sums' 2 K 2^-24 = 2.4e-4 of the norm product at worst, ~1e-6 of max|ref| on random data), and the
// MLP, whose down input is re-quantized, by token_errors (gpu_harness.h) with the kFp32 threshold.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "backend/cuda/linear_probe.h"
#include "gpu_harness.h"

namespace sparkserve {
namespace {

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(static_cast<double>(a[i]) - b[i]);
    d = std::max(d, std::isfinite(e) ? e : INFINITY);
  }
  return d;
}

// Which GEMM runs a W8A8 linear at T tokens and how it splits K, for the check names: the few-token
// kernel up to 4 tokens (no shared codes), fp8_small_n.cu below 17 (its K splits added in a
// cluster), the wgmma kernel from 17 (its partial sums added by the fused consumers).
std::string plan_note(Harness& h, int64_t T, const Linear& w) {
  if (T <= 4) return " (few-token kernel)";
  if (T < 17) return " (small-n, cluster of " + std::to_string(fp8_small_n_plan_splits(*h.gpu, T, w)) + ")";
  return " (wgmma, K splits " + std::to_string(fp8_wgmma_plan_splits(*h.gpu, T, w)) + ")";
}

// The GDN in_proj family of one input: qkv and z (W8A8, dynamic scales), b and a (bf16, 32 rows).
void check_linears(Harness& h, int64_t T) {
  const int64_t H = 2048;
  const auto dyn = ActivationQuant::kFp8TokenDynamic;
  QWeight qkv = make_qweight(h, 1, 1024, H, 1, WeightFormat::kFp8Channel, dyn, 4.0f);
  QWeight z = make_qweight(h, 1, 512, H, 1, WeightFormat::kFp8Channel, dyn, 4.0f);
  Weight b = make_weight(h, {32, H}, true, 1.0f / std::sqrt(static_cast<float>(H)));
  Weight a = make_weight(h, {32, H}, true, 1.0f / std::sqrt(static_cast<float>(H)));
  Pair x = h.f32({T, H}, randn(T * H));
  const std::vector<int64_t> rows = {1024, 512, 32, 32};
  std::vector<Pair> fused, alone;
  for (int64_t n : rows) fused.push_back(h.out({T, n})), alone.push_back(h.out({T, n}));
  const std::vector<const Linear*> gw = {&qkv.gpu_lin, &z.gpu_lin, &b.gpu_lin, &a.gpu_lin};
  const std::vector<const Linear*> cw = {&qkv.cpu_lin, &z.cpu_lin, &b.cpu_lin, &a.cpu_lin};
  std::vector<Tensor> go, co;
  for (size_t i = 0; i < rows.size(); ++i) go.push_back(fused[i].gpu()), co.push_back(fused[i].cpu());
  h.gpu->linears(go, x.gpu(), gw);
  h.cpu->linears(co, x.cpu(), cw);
  for (size_t i = 0; i < rows.size(); ++i) h.gpu->linear(alone[i].gpu(), x.gpu(), *gw[i]);
  const char* names[] = {"qkv", "z", "b", "a"};
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::string name = std::string("linears ") + names[i] + " T " + std::to_string(T);
    record("dense_fused", name + " == linear alone", max_abs_diff(h.gpu_f(fused[i]), h.gpu_f(alone[i])), kExact);
    record("dense_fused", name + " vs cpu", h.err(fused[i]), i < 2 ? kFp32 : kForms);
  }
}

// out_proj (35B: 2048 rows, K 4096) and the residual step after it.
void check_linear_add_rmsnorm(Harness& h, int64_t T) {
  const int64_t D = 2048, K = 4096;
  QWeight w = make_qweight(h, 1, D, K, 1, WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 4.0f);
  const auto rv = randn(T * D, 3.0f), nv = randn(D, 0.1f);
  Pair x = h.f32({T, K}, randn(T * K)), norm = h.f32({D}, nv);
  Pair res = h.f32({T, D}, rv), res2 = h.f32({T, D}, rv), out = h.out({T, D}), out2 = h.out({T, D});
  h.gpu->linear_add_rmsnorm(res.gpu(), out.gpu(), x.gpu(), w.gpu_lin, norm.gpu(), 1e-6f);
  h.cpu->linear_add_rmsnorm(res.cpu(), out.cpu(), x.cpu(), w.cpu_lin, norm.cpu(), 1e-6f);
  h.gpu->Backend::linear_add_rmsnorm(res2.gpu(), out2.gpu(), x.gpu(), w.gpu_lin, norm.gpu(), 1e-6f);
  const std::string name = "linear_add_rmsnorm T " + std::to_string(T) + plan_note(h, T, w.gpu_lin);
  record("dense_fused", name + " residual == op chain", max_abs_diff(h.gpu_f(res), h.gpu_f(res2)), kExact);
  record("dense_fused", name + " out == op chain", max_abs_diff(h.gpu_f(out), h.gpu_f(out2)), kExact);
  record("dense_fused", name + " residual vs cpu", h.err(res), kFp32);
  record("dense_fused", name + " out vs cpu", h.err(out), kFp32);
}

// The GDN block's end (35B: 32 heads of 128, out_proj 2048 x 4096) and the residual step. The
// gated norm's values differ from the CPU's in the last bits (expf, summation order), so a code of
// out_proj's input can take the neighbouring value: token_errors, as for re-quantized MoE inputs.
void check_gated_norm_out(Harness& h, int64_t T) {
  const int64_t Hv = 32, dv = 128, K = Hv * dv, D = 2048;
  QWeight w = make_qweight(h, 1, D, K, 1, WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 4.0f);
  const auto rv = randn(T * D, 3.0f);
  Pair core = h.f32({T, Hv, dv}, randn(T * K)), z = h.f32({T, K}, randn(T * K)), gw = h.f32({dv}, randn(dv, 0.5f));
  Pair norm = h.f32({D}, randn(D, 0.1f));
  Pair res = h.f32({T, D}, rv), res2 = h.f32({T, D}, rv), out = h.out({T, D}), out2 = h.out({T, D});
  h.gpu->gated_rmsnorm_linear_add_rmsnorm(res.gpu(), out.gpu(), core.gpu(), z.gpu(), gw.gpu(), w.gpu_lin, norm.gpu(),
                                          1e-6f);
  h.cpu->gated_rmsnorm_linear_add_rmsnorm(res.cpu(), out.cpu(), core.cpu(), z.cpu(), gw.cpu(), w.cpu_lin, norm.cpu(),
                                          1e-6f);
  h.gpu->Backend::gated_rmsnorm_linear_add_rmsnorm(res2.gpu(), out2.gpu(), core.gpu(), z.gpu(), gw.gpu(), w.gpu_lin,
                                                   norm.gpu(), 1e-6f);
  const std::string name = "gated_rmsnorm_linear_add_rmsnorm T " + std::to_string(T);
  record("dense_fused", name + " residual == op chain", max_abs_diff(h.gpu_f(res), h.gpu_f(res2)), kExact);
  record("dense_fused", name + " out == op chain", max_abs_diff(h.gpu_f(out), h.gpu_f(out2)), kExact);
  const auto [worst, flipped] = token_errors(h, res, T, D, kFp32);
  record("dense_fused", name + " residual worst token vs cpu", worst, kFlippedTokenErr);
  record("dense_fused", name + " residual flipped tokens vs cpu", flipped, flipped_tokens_bound(T));
}

// The shared expert (35B: I 512, H 2048).
void check_gated_mlp(Harness& h, int64_t T) {
  const int64_t H = 2048, I = 512;
  const auto dyn = ActivationQuant::kFp8TokenDynamic;
  QWeight gu = make_qweight(h, 1, 2 * I, H, 1, WeightFormat::kFp8Channel, dyn, 4.0f);
  QWeight dn = make_qweight(h, 1, H, I, 1, WeightFormat::kFp8Channel, dyn, 1.0f);
  Pair x = h.f32({T, H}, randn(T * H)), out = h.out({T, H}), out2 = h.out({T, H});
  h.gpu->gated_mlp(out.gpu(), x.gpu(), gu.gpu_lin, dn.gpu_lin);
  h.cpu->gated_mlp(out.cpu(), x.cpu(), gu.cpu_lin, dn.cpu_lin);
  h.gpu->Backend::gated_mlp(out2.gpu(), x.gpu(), gu.gpu_lin, dn.gpu_lin);
  const std::string name = "gated_mlp T " + std::to_string(T) + " gate_up" + plan_note(h, T, gu.gpu_lin);
  record("dense_fused", name + " == op chain", max_abs_diff(h.gpu_f(out), h.gpu_f(out2)), kExact);
  const auto [worst, flipped] = token_errors(h, out, T, H, kFp32);
  record("dense_fused", name + " worst token vs cpu", worst, kFlippedTokenErr);
  record("dense_fused", name + " flipped tokens vs cpu", flipped, flipped_tokens_bound(T));
}

void test_dense_fused(Harness& h) {
  // 338: the later agent turn (wgmma, split K); 40: batched decode on the small-T tile; 16, 8, 5:
  // below the wgmma kernel (fp8_small_n.cu from shared codes, its K splits added in the kernel); 4:
  // the few-token kernel (the compositions run); 1024: gate_up without a K split.
  for (int64_t T : {338, 40, 16, 8, 5, 4}) {
    check_linears(h, T);
    check_linear_add_rmsnorm(h, T);
    check_gated_norm_out(h, T);
    check_gated_mlp(h, T);
  }
  check_gated_mlp(h, 1024);
  {
    // At 5..16 tokens the codes go to fp8_small_n.cu (so the checks above compare the shared-codes
    // route with linear's): it must take the 35B shapes, out_proj with a cluster of K splits.
    QWeight w = make_qweight(h, 1, 2048, 4096, 1, WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 4.0f);
    QWeight qkv = make_qweight(h, 1, 1024, 2048, 1, WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 4.0f);
    for (int64_t T : {5, 16}) {
      record("dense_fused", "out_proj T " + std::to_string(T) + " on the small-N kernel with K splits in a cluster",
             fp8_small_n_plan_splits(*h.gpu, T, w.gpu_lin) > 1 ? 0.0 : 1.0, kExact);
      record("dense_fused", "qkv T " + std::to_string(T) + " on the small-N kernel",
             fp8_small_n_plan_splits(*h.gpu, T, qkv.gpu_lin) > 0 ? 0.0 : 1.0, kExact);
    }
  }
  if (fp8_wgmma_expected(*h.gpu)) {
    // The fused consumers must have run where they are meant to: K split at the later-turn shapes.
    QWeight w = make_qweight(h, 1, 2048, 4096, 1, WeightFormat::kFp8Channel, ActivationQuant::kFp8TokenDynamic, 4.0f);
    record("dense_fused", "out_proj T 338 splits K (fused reduction exercised)",
           fp8_wgmma_plan_splits(*h.gpu, 338, w.gpu_lin) > 1 ? 0.0 : 1.0, kExact);
  }
}

RegisterOpChecks reg("dense_fused", test_dense_fused);

}  // namespace
}  // namespace sparkserve
