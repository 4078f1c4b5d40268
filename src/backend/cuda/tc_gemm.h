// The tensor-core GEMMs of linear: fp8_gemm_wgmma.cu (W8A8 FP8 weights with dynamic per-token or
// static activation scales, prefill T and batched decode from 17 tokens, sm_90a), fp8_gemm.cu (the same on the other targets through
// cuBLASLt: cublaslt.h), fp8_small_n.cu (the same for T = 5..64 from activation codes, own
// mma.sync kernel, K splits added in a thread-block cluster), fp8_few_tokens.cu (T <= 4, one
// kernel) and bf16_gemm.cu (bf16 weights, f32 activations as split-bf16 hi + lo operands, cuBLASLt). Each returns false when it does not take the case (format, shape,
// alignment, the library missing or refusing the problem); the caller then runs another kernel.
// Graph-capturable: launches on the backend's stream, stream-ordered scratch.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {

// W8A8 FP8 weights (kFp8Channel / kFp8Tensor with kFp8TokenDynamic or kFp8TensorStatic
// activations), K a multiple of k_multiple, partitions dividing the rows, 16-byte aligned codes.
bool fp8_w8a8_takes(const Linear& w, int64_t k_multiple);

// fp8_w8a8_takes(w, 16): 16-byte rows of codes for cuBLASLt.
bool fp8_gemm_takes(const Linear& w);
// out = x W^T for prefill-sized T through cuBLASLt (targets without fp8_wgmma_linear): x quantized
// to the CPU's E4M3 codes and per-token scales, the codes of both sides as their exact f16 values on
// the f16 tensor cores (weights converted per call), Σ_k q_x q_w with f32 accumulation, then
// s_t · ws[n] (fp8_scale_outer).
// x: [T, K] f32 (device) -> out: [T, N] f32 (device)
bool fp8_gemm_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w);
// out = x W^T on sm_90a (fp8_gemm_wgmma.cu), prefill-sized T and, with its small-T tile, batched
// decode from 17 tokens (linear.cu): the FP8 weight codes go from global memory into the kernel and
// are turned into f16 there, the activation codes (fp8_quantize_rows_f16, Fp8CodeOrder::kWgmma64) are
// the f16 wgmma's other operand, exact products, f32 sums, s_t · ws[n] in the epilogue. False where the kernel cannot run (not sm_90a code on a compute 9.0 device) or does
// not take the case. force_tile / force_splits (>= 0 / > 0): a tile shape and K split instead of
// the kernel's own choice (tests and benchmarks; a tile index past the last is declined);
// x: [T, K] f32 (device) -> out: [T, N] f32 (device)
bool fp8_wgmma_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w, int force_tile = -1,
                      int force_splits = 0);
bool fp8_wgmma_available();
// The same GEMM from activation codes quantized beforehand, so several linears of one input (or a
// producer that quantizes its own output) quantize it once: w with dynamic per-token activation
// scales (the codes do not depend on the weight then) where the kernel runs.
bool fp8_wgmma_takes_codes(const Linear& w);
// The K split fp8_wgmma_codes_linear makes for (T, w): 1, or the partial sums' count.
int fp8_wgmma_splits(CudaBackend& b, int64_t T, const Linear& w);
// xq: the codes of fp8_quantize_rows_f16(..., Fp8CodeOrder::kWgmma64) of x, ts their scales. splits ==
// fp8_wgmma_splits(b, T, w); 1: out = x W^T (as fp8_wgmma_linear); > 1: out is not written, part gets
// the unscaled partial sums, for fp8_reduce_splits (part, splits, T, N, ts, ws) or a consumer that adds
// them the same way.
// xq: [T, fp8_wgmma_row(K)] f16, ts: [T] f32 (device) -> out: [T, N] f32 | part: [splits, T, N] f32 (device)
void fp8_wgmma_codes_linear(CudaBackend& b, float* out, float* part, int splits, const __half* xq, const float* ts,
                            int64_t T, const Linear& w);
// out[t, n] = ts[t] · ws[n] · Σ_s part[s, t, n] for n < rows, the split-K partial sums added in split
// order (out rows ldo apart).
// part: [splits, T, rows] f32, ts: [T], ws: [rows] (device) -> out: [T, ldo] f32 (device)
void fp8_reduce_splits(cudaStream_t s, float* out, int64_t ldo, const float* part, int splits, int64_t T, int64_t rows,
                       const float* ts, const float* ws);
// out = x W^T for T = 5..64 tokens (batched decode, speculative verify; linear.cu takes
// fp8_few_tokens_linear below up to 4 tokens and, on sm_90a, the wgmma kernel above from
// kFp8WgmmaSmallMinTokens): fp8_small_n.cu, x quantized (fp8_quantize_rows_f16, kWgmma64), then one
// kernel: weights on the MMA's M side streamed once, exact f16 products, f32 sums, the K splits' partial
// sums added inside a thread-block cluster; fp8_w8a8_takes(w, 64). Larger T run in pieces of 64
// tokens (each reads the weights again: the fallback where cuBLASLt is missing). False (nothing
// launched) where it does not take the case.
// x: [T, K] f32 (device) -> out: [T, N] f32 (device)
bool fp8_small_n_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w);
// The same product from codes made beforehand (the linears of one input share them; a producer may
// make them): w with dynamic per-token activation scales, T <= kFp8SmallNMaxTokens, where the kernel
// takes the shape. The result is fp8_small_n_linear's bit for bit (the same codes, kernel and plan).
bool fp8_small_n_takes_codes(const Linear& w, int64_t T);
// The K split (the cluster's size) fp8_small_n.cu plans for w at T tokens (its first piece past 64);
// 0 where it does not take the case.
int fp8_small_n_splits(const Linear& w, int64_t T);
// fp8_small_n_linear with a forced K split (1..16; tests and benchmarks); false where the kernel does
// not take the case or the split count gives an empty split or does not fit.
bool fp8_small_n_linear_forced(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w, int splits);
// xq: [T, K] f16 (fp8_quantize_rows_f16's kWgmma64 codes), ts: [T] f32 (device) -> out: [T, N] f32 (device)
void fp8_small_n_codes_linear(CudaBackend& b, float* out, const __half* xq, const float* ts, int64_t T,
                              const Linear& w);
inline constexpr int64_t kFp8SmallNMaxTokens = 64;
// out = x W^T for 1..kFp8FewTokensMax tokens (decode at batch 2-4, a speculative verify step at
// batch 1) in ONE kernel (fp8_few_tokens.cu): the activation quantization in its prologue, the
// split-K partial sums added through a thread-block cluster's shared memory; the same numerics as
// fp8_small_n_linear. fp8_w8a8_takes(w, 64); false (nothing launched) where it does not take the case.
// x: [T, K] f32 (device) -> out: [T, N] f32 (device)
bool fp8_few_tokens_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w);
inline constexpr int64_t kFp8FewTokensMax = 4;
// linear's dispatch (linear.cu) runs the wgmma kernel from this many tokens on where it runs.
inline constexpr int64_t kFp8WgmmaSmallMinTokens = 17;

// The k order of the activation codes fp8_quantize_rows_f16 writes. kNatural: x's, rows K apart.
// kWgmma64: fp8_gemm_wgmma.cu's operand order, rows fp8_wgmma_row(K) apart (K padded with +0 codes to
// a multiple of 64): within each 64-wide chunk, x's k = 16 t + 4 s + j (j < 4) is stored at
// 16 s + 2 t + (j % 2) + 8 (j / 2), the position of the k16 step s where the wgmma A fragment of
// quad lane t takes byte j of its 4-byte slice of the weight row (so one 16-byte load of a weight
// row is a lane's fragments for four k16 steps). A dot product does not depend on the k order.
enum class Fp8CodeOrder { kNatural, kWgmma64 };
__host__ __device__ inline int64_t fp8_wgmma_row(int64_t K) { return (K + 63) / 64 * 64; }
// Where kWgmma64 stores x's k (k % 4 == 0; k + 1 follows it, k + 2 and k + 3 are 8 further on).
__host__ __device__ inline int64_t fp8_code_pos(int64_t k) {
  return (k & ~int64_t{63}) + 16 * ((k >> 2) & 3) + 2 * ((k >> 4) & 3);
}

// The activation quantization of the W8A8 paths, as core/fp8_quant.cpp: scales[t] = the token's
// dynamic scale (static_scale null) or *static_scale; codes = fp8_e4m3(x / s) saturating, stored as
// their exact f16 values in `order` (kWgmma64: K % 16 == 0).
// x: [T, K] f32 (K % 4 == 0, 16-byte aligned) -> values: [T, K] f16 (kWgmma64: [T, fp8_wgmma_row(K)]),
// scales: [T] f32 (device)
void fp8_quantize_rows_f16(cudaStream_t s, __half* values, float* scales, const float* x, int64_t T, int64_t K,
                           const float* static_scale, Fp8CodeOrder order = Fp8CodeOrder::kNatural);
// CudaBackend::add_rmsnorm with the delta as fp8_wgmma_codes_linear's partial sums: residual += the
// values fp8_reduce_splits would store, then out = the zero-centred norm of the residual (norm.cu).
// part: [splits, R, D] f32, ts: [R], ws: [D], norm_w: [D] (device) -> residual, out: [R, D] f32 (device)
void fp8_splits_add_rmsnorm(cudaStream_t s, float* residual, float* out, const float* part, int splits,
                            const float* ts, const float* ws, const float* norm_w, int64_t R, int64_t D, float eps);
// gated_rmsnorm over a token's Hv rows of dv (the GDN heads: out = x rsqrt(mean(x^2) + eps) w silu(z)
// per row), then fp8_quantize_rows_f16 of the token's [Hv dv] result (dynamic scales, kWgmma64), in
// one kernel: the codes and scales are bitwise those of the separate ops. dv <= kFp8GatedNormMaxDv,
// Hv dv <= kFp8GatedNormMaxK (a token's values in shared memory), Hv dv % 16 == 0.
// x, z: [T, Hv, dv] f32, w: [dv] (device) -> values: [T, fp8_wgmma_row(Hv dv)] f16, scales: [T] f32 (device)
void fp8_gated_rmsnorm_codes(cudaStream_t s, __half* values, float* scales, const float* x, const float* z,
                             const float* w, int64_t T, int64_t Hv, int64_t dv, float eps);
inline constexpr int64_t kFp8GatedNormMaxDv = 128, kFp8GatedNormMaxK = 12288;
// silu_mul of a gate_up product, then fp8_quantize_rows_f16 of the result (dynamic scales, kWgmma64),
// in one kernel; the product as values (splits == 1) or as fp8_wgmma_codes_linear's partial sums with
// their scales. The codes and scales are bitwise those of the separate ops. I % 16 == 0, I <=
// kFp8SiluQuantMaxI (a row of activations in shared memory).
// gu: [T, 2I] f32 | [splits, T, 2I] f32, ts: [T], ws: [2I] (device) -> values: [T, fp8_wgmma_row(I)] f16,
// scales: [T] f32 (device)
void fp8_silu_mul_quantize(cudaStream_t s, __half* values, float* scales, const float* gu, int splits, int64_t T,
                           int64_t I, const float* ts, const float* ws);
inline constexpr int64_t kFp8SiluQuantMaxI = 12288;
// out[t, i] *= ts[t] · ws[i] for i < cols (out rows ldo apart).
void fp8_scale_outer(cudaStream_t s, float* out, int64_t ldo, int64_t T, int64_t cols, const float* ts,
                     const float* ws);

// bf16 weights (K % 8 == 0: 16-byte rows).
bool bf16_gemm_takes(const Linear& w);
// out = x W^T with x = hi + lo, hi = bf16(x), lo = bf16(x - hi) (x to ~2^-16 relative), both
// products on the tensor cores with f32 accumulation, summed in f32.
// x: [T, K] f32 (device) -> out: [T, N] f32 (device)
bool bf16_split_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w);
// out = x W^T + bias, or out += x W^T + bias when accumulate, for compute-bound T
// (kBf16FusedMinTokens on): two cuBLASLt GEMMs of T columns each instead of one of 2T, D = hi W^T
// + bias (+ out) through the bias epilogue (beta = 1 with C = D when accumulate), then D += lo W^T
// in place (beta = 1), so no [2T, N] product, no add of the halves and no bias/residual kernels.
// The weights are read twice: below kBf16FusedMinTokens bf16_split_linear's one stacked GEMM wins.
// x: [T, K] f32, bias: [N] f32 (device) -> out: [T, N] f32 (device)
bool bf16_split_linear_bias(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w, const float* bias,
                            bool accumulate);
inline constexpr int64_t kBf16FusedMinTokens = 1024;

// bf16 weights with at most kBf16SmallNMaxRows rows (the GDN in_proj_a / in_proj_b), K % 32 == 0,
// kBf16SmallNMinTokens <= T <= kBf16SmallNMaxTokens: bf16_small_n.cu, one kernel with x split into hi
// + lo in registers (the numerics of bf16_split_linear) instead of its three launches. Measured on the
// H200 (gpu_ops "gemm bf16", weights from HBM): in_proj_a 32 x 2048 at T = 4..2048 5.4-7.6 µs against
// 6.6-12.3; the router (256 rows) loses to the split path at every T but ties at 338 (K 2048) and is
// not taken (its weight stream needs more loads in flight than this kernel's 8 warps keep).
bool bf16_small_n_takes(const Linear& w, int64_t T);
// outs[i] = x ws[i]^T for up to kBf16SmallNMaxLinears such linears of one x (same K) in one launch;
// false (nothing launched) where a weight is not taken or x is not 16-byte aligned.
// x: [T, K] f32 (device) -> outs[i]: [T, ws[i]->out_features] f32 (device)
bool bf16_small_n_linears(CudaBackend& b, const std::vector<float*>& outs, const float* x, int64_t T,
                          const std::vector<const Linear*>& ws);
inline constexpr int kBf16SmallNMaxLinears = 4;
inline constexpr int64_t kBf16SmallNMaxRows = 64;
inline constexpr int64_t kBf16SmallNMinTokens = 2;
inline constexpr int64_t kBf16SmallNMaxTokens = 2048;

// bf16 weights with at most kBf16FewTokensMaxRows rows (the MoE router, 256 x H), K % 32 == 0, K <=
// 4096, 1 <= T <= kBf16FewTokensMaxTokens: bf16_few_tokens.cu, one kernel (K split over a thread-block
// cluster, x split into hi + lo in registers: the numerics of bf16_split_linear) instead of its three
// or four launches. sm_90+ (clusters, programmatic dependent launch). Measured on the H200, 122B router
// (256 x 3072) at T = 3 / 16 / 64: 3.5 / 4.3 / 10.4 µs against the split path's 8.6 / 9.0 / 9.5
// (docs/performance.md "The MoE's glue at small T").
bool bf16_few_tokens_takes(const Linear& w, int64_t T);
// x: [T, K] f32 (device, 16-byte aligned) -> out: [T, N] f32 (device); false (nothing launched) where
// not taken.
bool bf16_few_tokens_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w);
inline constexpr int64_t kBf16FewTokensMaxTokens = 64;
inline constexpr int64_t kBf16FewTokensMaxRows = 512;

}  // namespace sparkserve
