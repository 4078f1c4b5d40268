// y = x W^T on CUDA: one dispatch over the matmul regimes, each a named predicate on (T, weight):
//   one_token_gemv            T = 1, any format          -> gemv_fp8_t1.cu / gemv_dense.cu
//   fp8_small_n_regime        W8A8, T = 2..64            -> fp8_few_tokens.cu (one kernel) up to 4 tokens,
//                                                           fp8_gemm_wgmma.cu's small-T tile on sm_90a from 17
//                                                           tokens, else fp8_small_n.cu (quantize + one
//                                                           mma.sync kernel, K splits added in a cluster);
//                                                           weights read once
//   fp8_tensor_core_regime    W8A8, larger T             -> fp8_gemm_wgmma.cu on sm_90a, else fp8_gemm.cu
//                                                           (cuBLASLt); exact f16 products both
//   bf16_small_n_regime       bf16 weights <= 64 rows    -> bf16_small_n.cu (split-bf16 in registers, mma.sync)
//   bf16_few_tokens_regime    bf16 <= 512 rows, T <= 64  -> bf16_few_tokens.cu (the same, K split over a cluster)
//   bf16_tensor_core_regime   bf16 weights, T >= 2       -> bf16_gemm.cu (split-bf16, cuBLASLt)
//   nvfp4_grouped_regime      NVFP4 W4A4, T >= 2         -> moe_grouped.h (grouped NVFP4 GEMM, one group)
//   decode GEMVs              few tokens, any format     -> gemv_dense.cu (8 tokens per weight pass)
//   quantized fallback        what the above do not take -> quant_linear.cu
//   SIMT fallback             f32 weights, odd shapes    -> simt_matmul.cu
// A path that does not take a case (alignment, K, cuBLASLt missing or refusing the problem on this
// device: all checked at run time) returns false and the next one runs, so every target keeps a
// working kernel: mma.sync runs on sm_80 and later, the GEMVs and SIMT kernels anywhere.
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemv_dense.h"
#include "backend/cuda/linear_probe.h"
#include "backend/cuda/moe_grouped.h"
#include "backend/cuda/simt_matmul.h"
#include "backend/cuda/tc_gemm.h"

namespace sparkserve {
namespace {

// Measured on the H200 at the 122B shapes (gpu_ops --bench-kernels --bench-filter gemm; docs/performance.md):
// the one-token kernels stream weights at ~3 TB/s; from 2 tokens on, the small-N kernels read them
// once where the GEMVs re-read them per 8 tokens (sm_90a: the wgmma kernel's TMA-fed small-T tiles;
// elsewhere the mma.sync kernel, which declines K % 64 != 0); above kFp8SmallNMaxTokens the
// tensor-core GEMM wins (sm_90a: fp8_gemm_wgmma.cu, 1.0-3.2x faster than the cuBLASLt route at
// T = 128..8192; elsewhere cuBLASLt).
bool one_token_gemv(int64_t T) { return T == 1; }
bool fp8_small_n_regime(int64_t T, const Linear& w) { return T >= 2 && T <= kFp8SmallNMaxTokens && fp8_gemm_takes(w); }
// Within it, the sm_90a wgmma kernel from 17 tokens on, the mma.sync kernel below. Measured on the
// H200 (docs/performance.md "Small N on sm_90a"): alone, the wgmma kernel ties or wins from 16
// tokens (2-4x at 48-64); in whole decode steps, where projections run in concurrent branches, the
// 35B batch-16 step is 0.25 ms (2.7%) faster with the mma.sync kernel at 16 tokens; at 2-8 tokens
// the two tie alone (each ahead on some shapes by < 3 us) and the 122B batch-4 step is faster with
// the mma.sync kernel (8.73 against 8.98 ms). fp8_small_n.cu's two-launch kernel (docs/performance.md
// "Batched decode in two launches") took the 122B batch-16 step from 16.98 to 16.72 ms; run up to 64
// tokens instead of the wgmma tile, batch 64 went from 32.0 to 35.7 ms.
// Up to kFp8FewTokensMax tokens the one-kernel path first (fp8_few_tokens.cu): measured on the H200
// (docs/performance.md "Few tokens"), 0.1-2.9 us faster than the previous fp8_small_n.cu's three launches at all
// 28 points (14 shapes of the 122B and 35B, T = 2 and 4; the wgmma tile is faster alone on the 122B's
// q at 2 and 4 and qkv at 4), the 122B batch-4 step 8.77 -> 8.65 ms and its verify steps (batch 1,
// k = 1 / 2 / 3) 7.27 -> 7.03, 8.13 -> 7.98, 8.93 -> 8.84 ms; from 8 tokens on it loses.
bool fp8_few_tokens_regime(int64_t T) { return T >= 2 && T <= kFp8FewTokensMax; }
bool fp8_tensor_core_regime(int64_t T, const Linear& w) { return T > kFp8SmallNMaxTokens && fp8_gemm_takes(w); }
// Split-bf16 reads the weights once for any T; the bf16 GEMV does once per 8 tokens (lm_head at 16
// tokens: 2.6 ms against 0.39 ms).
bool bf16_tensor_core_regime(int64_t T, const Linear& w) { return T >= 2 && bf16_gemm_takes(w); }
// Few weight rows (GDN in_proj_a / in_proj_b): a problem of a few µs, where the split path's three
// launches (split, GEMM, add) cost more than the work.
bool bf16_small_n_regime(int64_t T, const Linear& w) { return bf16_small_n_takes(w, T); }
// A few hundred rows (the MoE router) at 2..64 tokens: one clustered kernel where the split path runs
// three or four. Measured on the H200 (docs/performance.md "The MoE's glue at small T"), 122B router
// after an rmsnorm, us: T = 3 / 16 / 32 / 64 6.5 / 7.4 / 8.2 / 13.5 against 11.5 / 12.0 / 12.3 / 12.6;
// 35B at 64 7.9 against 10.4; the 122B batch-64 step the same either way (30.67 / 30.69 ms). T = 1 keeps
// the GEMV (6.95 against 6.33 us; the step at batch 1 the same within noise).
bool bf16_few_tokens_regime(int64_t T, const Linear& w) { return T >= 2 && bf16_few_tokens_takes(w, T); }

// NVFP4 W4A4 dense layers from 2 tokens: the grouped NVFP4 GEMM of the routed experts with one group
// (moe_grouped.h; in_proj_qkv at T = 2 / 8: 13 / 14 us where the GEMVs took ~133 us at T = 8).
bool nvfp4_grouped_regime(int64_t T, const Linear& w) {
  return T >= 2 && is_nvfp4(w.format) && w.activation == ActivationQuant::kNvfp4;
}

// One named path (linear_probe); kDispatch is linear's own choice.
bool run_path(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w, LinearPath path) {
  const int64_t K = w.in_features, N = w.out_features;
  switch (path) {
    case LinearPath::kDispatch:
      if (one_token_gemv(T) && decode_linear(b, out, x, T, w)) return true;
      if (fp8_small_n_regime(T, w)) {
        if (fp8_few_tokens_regime(T) && fp8_few_tokens_linear(b, out, x, T, w)) return true;
        if (T >= kFp8WgmmaSmallMinTokens
                ? fp8_wgmma_linear(b, out, x, T, w) || fp8_small_n_linear(b, out, x, T, w)
                : fp8_small_n_linear(b, out, x, T, w) || fp8_wgmma_linear(b, out, x, T, w))
          return true;
      }
      if (fp8_tensor_core_regime(T, w) && (fp8_wgmma_linear(b, out, x, T, w) || fp8_gemm_linear(b, out, x, T, w)))
        return true;
      if (bf16_small_n_regime(T, w) && bf16_small_n_linears(b, {out}, x, T, {&w})) return true;
      if (bf16_few_tokens_regime(T, w) && bf16_few_tokens_linear(b, out, x, T, w)) return true;
      if (bf16_tensor_core_regime(T, w) && bf16_split_linear(b, out, x, T, w)) return true;
      if (nvfp4_grouped_regime(T, w) && grouped_nvfp4_linear(b, out, x, T, w)) return true;
      // Tensor cores unavailable for this case: a W8A8 prefill still reads the weights once per 64
      // tokens through the small-N kernel rather than once per 8 through the GEMV.
      if (fp8_w8a8_takes(w, 64) && fp8_small_n_linear(b, out, x, T, w)) return true;
      if (decode_linear(b, out, x, T, w)) return true;
      if (is_quantized(w.format)) {
        b.quant_matmul(out, x, T, 1, nullptr, w);
        return true;
      }
      launch_matmul(b.stream(), out, x, T, K, N, w.weight.data, weight_is_bf16(w), 0);
      return true;
    case LinearPath::kGemv: return decode_linear(b, out, x, T, w);
    case LinearPath::kFp8SmallN: return fp8_small_n_linear(b, out, x, T, w);
    case LinearPath::kFp8FewTokens: return fp8_few_tokens_linear(b, out, x, T, w);
    case LinearPath::kFp8Gemm: return fp8_gemm_linear(b, out, x, T, w);
    case LinearPath::kFp8Wgmma: return fp8_wgmma_linear(b, out, x, T, w);
    case LinearPath::kBf16Split: return bf16_split_linear(b, out, x, T, w);
    case LinearPath::kBf16SmallN: return bf16_small_n_linears(b, {out}, x, T, {&w});
    case LinearPath::kBf16FewTokens: return bf16_few_tokens_linear(b, out, x, T, w);
    case LinearPath::kSimt:
      if (w.format != WeightFormat::kBf16 && w.format != WeightFormat::kF32) return false;
      launch_matmul(b.stream(), out, x, T, K, N, w.weight.data, weight_is_bf16(w), 0);
      return true;
    case LinearPath::kQuantGemv:
      if (!is_quantized(w.format)) return false;
      b.quant_matmul(out, x, T, 1, nullptr, w);
      return true;
  }
  return false;
}

}  // namespace

void CudaBackend::linear(const Tensor& out, const Tensor& x, const Linear& w) {
  const int64_t K = w.in_features, N = w.out_features, T = K == 0 ? 0 : x.numel() / K;
  CHECK(x.numel() == T * K && out.numel() == T * N);
  if (T == 0 || N == 0) return;
  run_path(*this, out.ptr<float>(), x.ptr<const float>(), T, w, LinearPath::kDispatch);
}

bool linear_probe(Backend& b, const Tensor& out, const Tensor& x, const Linear& w, LinearPath path) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) return false;
  const int64_t K = w.in_features, N = w.out_features, T = K == 0 ? 0 : x.numel() / K;
  CHECK(x.numel() == T * K && out.numel() == T * N);
  return run_path(*c, out.ptr<float>(), x.ptr<const float>(), T, w, path);
}

bool fp8_wgmma_probe(Backend& b, const Tensor& out, const Tensor& x, const Linear& w, int tile, int splits) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) return false;
  const int64_t K = w.in_features, N = w.out_features, T = K == 0 ? 0 : x.numel() / K;
  CHECK(x.numel() == T * K && out.numel() == T * N && tile >= 0 && splits > 0);
  return fp8_wgmma_linear(*c, out.ptr<float>(), x.ptr<const float>(), T, w, tile, splits);
}

int fp8_wgmma_plan_splits(Backend& b, int64_t T, const Linear& w) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c || !fp8_wgmma_takes_codes(w)) return 0;
  return fp8_wgmma_splits(*c, T, w);
}

bool fp8_small_n_probe(Backend& b, const Tensor& out, const Tensor& x, const Linear& w, int splits) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) return false;
  const int64_t K = w.in_features, N = w.out_features, T = K == 0 ? 0 : x.numel() / K;
  CHECK(x.numel() == T * K && out.numel() == T * N && splits > 0);
  return fp8_small_n_linear_forced(*c, out.ptr<float>(), x.ptr<const float>(), T, w, splits);
}

int fp8_small_n_plan_splits(Backend& b, int64_t T, const Linear& w) {
  if (!dynamic_cast<CudaBackend*>(&b)) return 0;
  return fp8_small_n_splits(w, T);
}

bool fp8_wgmma_expected(Backend& b) {
  if (!dynamic_cast<CudaBackend*>(&b)) return false;
  int dev = 0, major = 0, minor = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  return major == 9 && minor == 0;
}

bool fp8_quantize_probe(Backend& b, const Tensor& values, const Tensor& scales, const Tensor& x, bool wgmma_order) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) return false;
  const int64_t T = x.dim(0), K = x.dim(1), ld = wgmma_order ? fp8_wgmma_row(K) : K;
  CHECK(values.numel() == T * ld && values.dtype == DType::kF16 && scales.numel() == T && K % 4 == 0);
  fp8_quantize_rows_f16(c->stream(), static_cast<__half*>(values.data), scales.ptr<float>(), x.ptr<const float>(), T, K,
                        nullptr, wgmma_order ? Fp8CodeOrder::kWgmma64 : Fp8CodeOrder::kNatural);
  return true;
}

}  // namespace sparkserve
