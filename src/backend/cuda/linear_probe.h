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
  kFp8FewTokens,        // fp8_few_tokens.cu (T <= 4)
  kFp8Gemm,             // fp8_gemm.cu (cuBLASLt, exact f16 products)
  kFp8Wgmma,            // fp8_gemm_wgmma.cu (sm_90a, its own tile choice)
  kBf16Split,           // bf16_gemm.cu
  kBf16SmallN,          // bf16_small_n.cu (any T; at most 64 weight rows)
  kBf16FewTokens,       // bf16_few_tokens.cu (T <= 64; at most 512 weight rows)
  kSimt,                // simt_matmul.cu (f32 / bf16 weights)
  kQuantGemv,           // quant_linear.cu (quantized weights, any T)
};

// False when `b` is not the CUDA backend or the path does not take this case (nothing ran then).
// x: [T, K] f32 -> out: [T, N] f32
bool linear_probe(Backend& b, const Tensor& out, const Tensor& x, const Linear& w, LinearPath path);

// linear through fp8_gemm_wgmma.cu with a forced tile shape (index into its tile list) and K split.
// False when `b` is not the CUDA backend or the kernel does not take the case (a tile index past
// its list included).
// x: [T, K] f32 -> out: [T, N] f32
bool fp8_wgmma_probe(Backend& b, const Tensor& out, const Tensor& x, const Linear& w, int tile, int splits);

// The K split fp8_gemm_wgmma.cu plans for (T, w) (its partial sums: what linear_add_rmsnorm and
// gated_mlp add in their consumers); 0 when `b` is not the CUDA backend or the kernel would not run.
int fp8_wgmma_plan_splits(Backend& b, int64_t T, const Linear& w);

// linear through fp8_small_n.cu with a forced K split (the thread-block cluster's size, 1..16). False
// when `b` is not the CUDA backend, the kernel does not take the case, or the split does not fit
// (an empty split, shared memory).
// x: [T, K] f32 -> out: [T, N] f32
bool fp8_small_n_probe(Backend& b, const Tensor& out, const Tensor& x, const Linear& w, int splits);

// The K split (thread-block cluster size) fp8_small_n.cu plans for (T, w): 1 writes the outputs
// directly, > 1 adds the partial sums in the cluster; 0 when `b` is not the CUDA backend or the
// kernel does not take the case.
int fp8_small_n_plan_splits(Backend& b, int64_t T, const Linear& w);

// Whether fp8_gemm_wgmma.cu is expected to run: the CUDA backend on a compute 9.0 device (builds
// for the H200 carry sm_90a code).
bool fp8_wgmma_expected(Backend& b);

// The W8A8 activation quantization of the tensor-core paths alone (fp8_quantize_rows_f16), dynamic
// per-token scales, in x's k order or (wgmma_order) fp8_gemm_wgmma.cu's: rows padded to a multiple
// of 64 with +0, within each 64-wide chunk x's k = 16 t + 4 s + j stored at 16 s + 2 t + j % 2 + 8 (j / 2).
// False when `b` is not the CUDA backend.
// x: [T, K] f32 (K % 4 == 0; wgmma_order: K % 16 == 0) -> values: [T, K] f16 (wgmma_order: [T, K
// rounded up to 64]) (the E4M3 codes' values), scales: [T] f32
bool fp8_quantize_probe(Backend& b, const Tensor& values, const Tensor& scales, const Tensor& x,
                        bool wgmma_order = false);

}  // namespace sparkserve
