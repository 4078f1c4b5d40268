// Routed bf16 experts grouped by expert on the tensor cores (moe_bf16_grouped.cu): the float MoE
// path of moe.cu above the per-slot GEMV regime (the MTP layer's experts at speculative batches).
// Each tile of one expert's slots (simt_matmul.h's SlotTiles) reads that expert's weights once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/simt_matmul.h"

namespace sparkserve {

// Whether grouped_bf16_mma takes a [E, N, K] bf16 payload: K a multiple of 32, N of 16, 16-byte
// aligned weights and x rows.
bool grouped_bf16_mma_takes(const void* w, const float* x, int64_t K, int64_t N);

// For each tile, out[slot, n] = x[slot / x_div] . W_e[n] for the tile's slots and expert e
// (W_e = w + e * N * K). x is split exactly into three bf16 operands (hi + mid + lo), so every
// product is the f32 product of the CPU reference; sums are f32 on the tensor cores.
// x: [*, K] f32 -> out: [slots, N] f32 (device)
void launch_grouped_bf16_mma(cudaStream_t s, float* out, const float* x, int64_t x_div, const SlotTiles& tiles,
                             const void* w, int64_t K, int64_t N);

}  // namespace sparkserve
