// For gpu_ops only (tests/gpu/gemm_checks.cpp and gemm_bench.cpp, compiled without nvcc): linear
// through one named matmul path of the CUDA backend, so the checks can test every path on every
// shape (not only the one linear's dispatch picks there) and the benchmarks can compare them.
#pragma once

#include "backend/ops.h"

namespace sparkserve {

enum class LinearPath : int {
  kDispatch = 0,        // what CudaBackend::linear picks
  kGemv,                // gemv_dense.cu / gemv_fp8_t1.cu (decode_linear)
  kFp8SmallN,           // fp8_small_n.cu (any T, in pieces of 64 tokens)
  kFp8Gemm,             // fp8_gemm.cu (cuBLASLt, exact f16 products)
  kBf16Split,           // bf16_gemm.cu
  kSimt,                // simt_matmul.cu (f32 / bf16 weights)
  kQuantGemv,           // quant_linear.cu (quantized weights, any T)
};

// False when `b` is not the CUDA backend or the path does not take this case (nothing ran then).
// x: [T, K] f32 -> out: [T, N] f32
bool linear_probe(Backend& b, const Tensor& out, const Tensor& x, const Linear& w, LinearPath path);

// The W8A8 activation quantization of the tensor-core paths alone (fp8_quantize_rows_f16), dynamic
// per-token scales. False when `b` is not the CUDA backend.
// x: [T, K] f32 (K % 4 == 0) -> values: [T, K] f16 (the E4M3 codes' values), scales: [T] f32
bool fp8_quantize_probe(Backend& b, const Tensor& values, const Tensor& scales, const Tensor& x);

}  // namespace sparkserve
