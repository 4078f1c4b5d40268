// The float fused MoE decode path of moe_experts on CUDA: moe_decode.cu. Returns false when the
// weight layout is not one it takes (unaligned rows, f32 weights, an unusual partition split, more
// than 8 routed experts per token), and the caller then runs its general kernels. Nothing here
// synchronises with the host: every launch goes to the backend's stream, scratch is stream-ordered,
// so the ops can be captured in a CUDA graph.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {

// moe_experts in two launches: gate_up GEMV + SiLU·mul per (token, slot) pair, then down GEMV over
// the token's k experts + the routing-weighted sum in ascending expert id.
// x: [T, H] f32, ids: [T, k] i32, weights: [T, k] f32 (device) -> out: [T, H] f32
bool decode_moe(CudaBackend& b, float* out, const float* x, const int32_t* ids, const float* weights, int64_t T,
                int64_t k, const Linear& gate_up, const Linear& down);

// For the kernel benchmark only (tests/gpu/bench_kernels.cpp, which declares it itself: it is built
// without nvcc): decode_moe with only some launches (stages: bit 0 gate_up, bit 1 down; the down
// launch alone reads whatever the activation scratch holds) and the gate_up grid sized for
// gu_blocks_per_sm blocks per SM (0: decode_moe's choice). False when `b` is not the CUDA backend or
// decode_moe does not take the layout.
// x: [T, H] f32, ids: [T, k] i32, weights: [T, k] f32 -> out: [T, H] f32
bool decode_moe_probe(Backend& b, const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                      const Linear& gate_up, const Linear& down, int stages, int gu_blocks_per_sm);

}  // namespace sparkserve
