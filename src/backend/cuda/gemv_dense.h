// The dense decode GEMVs (few tokens per step): gemv_dense.cu (up to 8 tokens per weight pass, any of
// bf16 / FP8 / NVFP4) and gemv_fp8_t1.cu (FP8 at one token). decode_linear returns false when the
// weight layout is not one it takes (unaligned rows, f32 weights, an unusual partition split), and
// the caller then runs its general kernels. Nothing here synchronises with the host: every launch
// goes to the backend's stream, so the ops can be captured in a CUDA graph.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {
namespace gemv {
struct View;
}

// out = x W^T for any T (token chunks of up to 8 share one pass over W), W bf16 / FP8 / NVFP4 with
// the Linear's activation quantization computed in each block's prologue.
// x: [T, K] f32 (device) -> out: [T, N] f32 (device)
bool decode_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w);

// The one-token FP8 GEMV (gemv_fp8_t1.cu) for a weight make_view took as FP8 whose activation
// quantization is the same for every partition. x: [1, K] f32 (device) -> out: [1, N] f32 (device)
void fp8_t1_linear(CudaBackend& b, float* out, const float* x, const Linear& w, const gemv::View& v);

}  // namespace sparkserve
