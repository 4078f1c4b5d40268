// cuBLASLt matmuls for the tensor-core GEMMs (fp8_gemm.cu, bf16_gemm.cu), with the library loaded
// at run time: dlopen("libcublasLt.so.13") on first use. Why not a link dependency: the library is
// 540 MB and not present on every machine the binary runs on (a driver-only install, CI without a
// GPU); where it is missing, or refuses a problem, the callers fall back to this project's own
// kernels, so every target keeps a working path and the binary still starts.
//
// One problem shape, "TN" in cuBLAS terms, is all the backend needs: out = x W^T with W row-major
// [m, k] (the weights, cuBLAS's A used transposed), x row-major [n, k] (the tokens, B), out
// row-major [n, ldd >= m] f32 (D, column-major m x n), f32 accumulation (CUBLAS_COMPUTE_32F), no
// scales; optionally a bias per output feature (the bias epilogue) and D accumulated in place. Host-side only; no device code here.
#pragma once

#include <cuda_runtime_api.h>
#include <library_types.h>

#include <cstddef>
#include <cstdint>

namespace sparkserve {

struct LtMatmul {
  cudaDataType_t ab_type = CUDA_R_16BF;  // CUDA_R_16BF or CUDA_R_16F
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;   // [m, k], row stride lda (elements)
  int64_t lda = 0;
  const void* b = nullptr;   // [n, k], row stride ldb
  int64_t ldb = 0;
  float* d = nullptr;        // [n, ldd] f32
  int64_t ldd = 0;
  // D = x W^T + bias + beta D: bias [m] f32 added in the epilogue (null: none); beta 0 or 1
  // (1: the product is added to D in place, cuBLASLt's C = D).
  const float* bias = nullptr;
  float beta = 0.0f;
};

// False when the library is not loadable, or cuBLASLt has no algorithm for the problem (types,
// alignment, scale mode on this architecture) or refuses it; nothing was launched then, and the
// caller runs another kernel. Launches on `s` only (graph-capturable); `workspace` of
// `workspace_bytes` must be used by no other stream while the matmul runs.
bool lt_matmul(const LtMatmul& p, cudaStream_t s, void* workspace, size_t workspace_bytes);
// Whether cuBLASLt offers an algorithm for p's problem (shape, types, alignments of p's pointers),
// without running it: callers that split a problem ask for every piece before launching any.
bool lt_plan(const LtMatmul& p, size_t workspace_bytes);

// Whether libcublasLt could be loaded (and which version), for the benchmarks' and tests' logs.
bool lt_available();
int64_t lt_version();

}  // namespace sparkserve
