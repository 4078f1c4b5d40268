// For gpu_ops only (tests/gpu/moe_router_{checks,bench}.cpp, compiled without nvcc): the MoE's routing
// and the grouped MoE's plan on their own, so the checks can compare them with references and the
// benchmark can time them apart from the experts.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/ops.h"

namespace sparkserve {

// moe_route_topk through the register routing the CUDA kernels run (reference false) or its shared-
// memory reference (moe_route.cuh route_topk_warp_smem); false when `b` is not the CUDA backend.
// logits: [T, E] f32 -> weights: [T, k] f32, ids: [T, k] i32
bool route_topk_probe(Backend& b, const Tensor& weights, const Tensor& ids, const Tensor& logits, bool reference);

// The grouped MoE's plan (moe_grouped.cu), downloaded.
struct MoePlanHost {
  std::vector<int32_t> rank;        // [T k] a slot's rank among its chunk's slots of the same expert
  std::vector<int32_t> chunk_base;  // [chunks, E] slots of the expert in earlier chunks of 1024
  std::vector<int32_t> offsets;     // [E] the expert's first row
  std::vector<int32_t> pairs;       // [3 num_pairs] (expert, first row, rows) of each work pair
};
// The plan alone: for ids [T, k] i32, or with logits [T, E] f32 the routing first (fused as
// moe_grouped runs it: ids and weights [T, k] f32 written), tile_n rows per pair at most, launched
// `times` times; with `out` non-null the results are downloaded (a synchronisation). False when `b`
// is not the CUDA backend or E, k exceed the plan's limits.
bool moe_plan_probe(Backend& b, const Tensor& ids, const Tensor& weights, const Tensor* logits, int64_t E, int tile_n,
                    int times, MoePlanHost* out);

}  // namespace sparkserve
