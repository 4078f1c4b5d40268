// The tensor-core GEMMs of linear (cuBLASLt, cublaslt.h): fp8_gemm.cu (W8A8 FP8 weights with
// dynamic per-token or static activation scales) and bf16_gemm.cu (bf16 weights, f32 activations as
// split-bf16 hi + lo operands). Each returns false when it does not take the case (format, shape,
// alignment, the library missing or refusing the problem); the caller then runs another kernel.
// Graph-capturable: launches on the backend's stream, stream-ordered scratch.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {

// How the FP8 GEMM applies the scales s_t · ws[n]: inside cuBLASLt's epilogue (outer-vector scale
// mode: Hopper), or by a separate kernel over the unscaled sums (where the outer-vector mode is
// refused: cuBLAS 13.1 on sm_100 / sm_120). kAuto: the first where this device takes it.
enum class Fp8Scaling { kAuto, kOuterVec, kEpilogue };
struct Fp8GemmOptions {
  Fp8Scaling scaling = Fp8Scaling::kAuto;
  bool fast_accum = false;  // benchmarks only: Hopper's FP8 accumulation without fp32 promotion
};

// W8A8 FP8 weights (kFp8Channel / kFp8Tensor with kFp8TokenDynamic or kFp8TensorStatic
// activations) whose K and rows suit the tensor cores (K % 16 == 0: 16-byte rows of codes).
bool fp8_gemm_takes(const Linear& w);
// out = x W^T: x quantized to the CPU's E4M3 codes and per-token scales (fp8_quantize_rows), then
// s_t · ws[n] · Σ_k q_x q_w on the tensor cores with f32 accumulation.
// x: [T, K] f32 (device) -> out: [T, N] f32 (device)
bool fp8_gemm_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w,
                     const Fp8GemmOptions& o = {});
// The activation quantization of the W8A8 paths, as core/fp8_quant.cpp: scales[t] = the token's
// dynamic scale (static_scale null) or *static_scale; codes = fp8_e4m3(x / s) saturating.
// x: [T, K] f32 (K % 4 == 0, 16-byte aligned) -> codes: [T, K] E4M3, scales: [T] f32 (device)
void fp8_quantize_rows(cudaStream_t s, uint8_t* codes, float* scales, const float* x, int64_t T, int64_t K,
                       const float* static_scale);

// bf16 weights (K % 8 == 0: 16-byte rows).
bool bf16_gemm_takes(const Linear& w);
// out = x W^T with x = hi + lo, hi = bf16(x), lo = bf16(x - hi) (x to ~2^-16 relative), both
// products on the tensor cores with f32 accumulation, summed in f32.
// x: [T, K] f32 (device) -> out: [T, N] f32 (device)
bool bf16_split_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w);

}  // namespace sparkserve
