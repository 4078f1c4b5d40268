// Routed experts with NVFP4 weights and NVFP4 activations (W4A4) on exact integer block dot
// products (dp4a over doubled E2M1 codes): moe_w4a4.cu. Returns false when the layout is not one it
// takes (other formats or activations, K not a multiple of 32, more than 8 experts per token, shared
// memory), and the caller runs decode_moe / the general kernels instead. No host synchronisation:
// graph-capturable like moe_decode.h.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {

// moe_experts, or with router_logits non-null moe_route_topk + moe_experts in the same launches
// (ids and weights are then written, as route_topk writes them).
// x: [T, H] f32, ids: [T, k] i32, weights: [T, k] f32, router_logits: [T, E] f32 or null (device)
// -> out: [T, H] f32
bool moe_w4a4(CudaBackend& b, float* out, const float* x, int32_t* ids, float* weights, const float* router_logits,
              int64_t T, int64_t k, const Linear& gate_up, const Linear& down);

}  // namespace sparkserve
