// Routed NVFP4 W4A4 experts for two or more tokens, grouped by expert (moe_grouped.cu): each distinct
// routed expert's weights are read once per call (per 16 or 64 of its tokens), on tensor cores
// (nvfp4_group_gemm.h). The same kernels serve dense NVFP4 W4A4 Linear layers with many tokens.
// No host synchronisation and no limit on the number of (token, expert) pairs: graph-capturable.
#pragma once

#include <cstdint>

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {

// Whether moe_grouped takes these experts: NVFP4 weights with NVFP4 activations in both
// projections, gate_up of 1 or 2 partitions (gate rows, then up rows) and down of 1, H and I
// multiples of 128 and 16, H at most 8192, at most 512 experts and 32 per token.
bool moe_grouped_takes(const Linear& gate_up, const Linear& down, int64_t k);

// moe_experts, or with router_logits non-null moe_route_topk + moe_experts (ids and weights are then
// written as route_topk writes them). The caller checked moe_grouped_takes.
// x: [T, H] f32, ids: [T, k] i32, weights: [T, k] f32, router_logits: [T, E] f32 or null (device)
// -> out: [T, H] f32
void moe_grouped(CudaBackend& b, float* out, const float* x, int32_t* ids, float* weights, const float* router_logits,
                 int64_t T, int64_t k, const Linear& gate_up, const Linear& down);

// Dense NVFP4 W4A4 y = x W^T for two or more tokens through the grouped GEMM (one "expert");
// false (nothing launched) when T is smaller or the layout is not one it takes.
// x: [T, K] f32 -> out: [T, N] f32 (device)
bool grouped_nvfp4_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w);

}  // namespace sparkserve
