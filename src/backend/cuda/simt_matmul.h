// The SIMT (CUDA-core, fp32) matmuls for f32 / bf16 weights: simt_matmul.cu. The last-resort path of
// linear (any shape, any architecture) and the general path of the float routed experts (moe.cu):
// fp32 arithmetic with bf16 widened on load, like the CPU reference, so they need no tolerance
// beyond the summation order (1e-5).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace sparkserve {

// Rows of one tile of the grouped GEMM: each tile table entry (one expert's run of slots) has at most
// this many rows.
inline constexpr int kSimtTileRows = 64;

// out[t, n] = sum_k x[t, k] W[n, k], W = rows of a payload starting at element w_offset (row stride
// K): a GEMV that reads each weight row once per 8 tokens for small T, else a 64x64-tiled GEMM.
// x: [T, K] f32 -> out: [T, N] f32
void launch_matmul(cudaStream_t s, float* out, const float* x, int64_t T, int64_t K, int64_t N,
                   const void* w, bool bf16, int64_t w_offset);

// One GEMV per (token, slot) pair: out[slot, n] = x[slot / x_div] . W_e[n], e = ids[slot] (< E;
// traps otherwise), W_e = payload + e * N * K. slots <= 65535.
// x: [*, K] f32, ids: [slots] i32 (device) -> out: [slots, N] f32
void launch_slot_gemv(cudaStream_t s, float* out, const float* x, int64_t x_div, const int32_t* ids, int64_t slots,
                      const void* w, bool bf16, int64_t K, int64_t N, int64_t E);

// The slots grouped by expert (moe.cu's group_slots_kernel): sorted[] lists slot indices in expert
// order; tile i covers sorted[tile_start[i] ..+ tile_rows[i]] (<= kSimtTileRows) of expert tile_e[i];
// *num_tiles of max_tiles are used. For each tile, out[slot, n] = x[slot / x_div] . W_e[n] with the
// tiled GEMM, so a tile reads its expert's weights once. All pointers device.
// x: [*, K] f32 -> out: [slots, N] f32
struct SlotTiles {
  const int32_t* sorted;
  const int32_t* tile_e;
  const int32_t* tile_start;
  const int32_t* tile_rows;
  const int32_t* num_tiles;
  int64_t max_tiles;
};
void launch_grouped_matmul(cudaStream_t s, float* out, const float* x, int64_t x_div, const SlotTiles& tiles,
                           const void* w, bool bf16, int64_t K, int64_t N);

}  // namespace sparkserve
