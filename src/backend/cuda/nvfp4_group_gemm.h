// Grouped NVFP4 W4A4 GEMM on tensor cores (nvfp4_group_gemm.cu): for each work pair (expert e, a
// run of rows of a prepared activation matrix), out = x̂ · W_e^T, weights as the MMA's M operand.
// Used by the grouped MoE (moe_grouped.cu: gate_up with SiLU·mul and the down input's quantization
// in the epilogue, then down) and by dense NVFP4 Linear (one "expert", static tiling).
//
// Exactness: e2m1 × an E4M3 block scale has at most 6 significant bits, so both operands are exact
// in fp16 (weights as e2m1·sf·2^-14, activations as e2m1·sf); the tensor core's products are exact
// and only the fp32 accumulation order and the global scales (applied once per output in the
// epilogue) round. No host synchronisation: graph-capturable.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {

// Activation rows prepared for the GEMM: per row and partition, K fp16 values e2m1·sf (the
// quantized activation without its global factor), and within each group of 8 consecutive k the
// order 0,4,1,5,2,6,3,7 (the pairs one weight word's nibbles decode into); a partition p > 0 whose
// input scale equals partition 0's is not written (the GEMM reads partition 0's values instead).
// prepare_rows_kernel (moe_grouped.cu) writes them.
// Tile regimes: kSmallN (at most 8 rows per pair: dense layers at a few tokens, and the MoE where
// kSliceN does not take the shapes; weights streamed into registers, nvfp4_group_gemv.cu), kSliceN (at
// most 16 rows per pair: the MoE from a few dozen tokens to ~16 tokens per expert; weights and the
// pair's activations streamed through shared memory by the copy engine in 256-k slices,
// nvfp4_group_slice.cu), kLargeN (64 rows per
// pair: prefill; shared-memory pipeline and mma.sync, nvfp4_group_gemm.cu, every target), kLargeNWgmma
// (128 rows per pair: prefill on sm_90a's warpgroup MMA, nvfp4_group_wgmma.cu) and kMediumNWgmma, the
// same kernel with 64 rows per pair and 2 CTAs per SM (a few dozen tokens per expert).
// kSliceNHalf: kSliceN with items of 128 weight rows instead of 256 (one m16 tile per warp): twice the
// items, for an even share per CTA when the routed experts are few.
enum class GroupTile { kSmallN, kLargeN, kLargeNWgmma, kMediumNWgmma, kSliceN, kSliceNHalf };
// Weight rows one work item covers (gate_up: half gate rows, half the matching up rows), and
// activation rows per pair at most.
int64_t group_tile_m(GroupTile t);
int64_t group_tile_n(GroupTile t);
// Whether the regime runs on this device: the large-N stages do not fit sm_120's 99 KB of shared
// memory (the small-N kernel serves there), the wgmma kernel needs an sm_90a build on compute 9.0.
bool group_tile_fits(GroupTile t);

struct GroupGemmArgs {
  // Weights: E matrices of [M, K] NVFP4 (payload [E, M, K/2], E4M3 block scales [E, M, K/16]) with
  // P partitions of M/P rows each; global / input scales [E, P].
  const uint8_t* w = nullptr;
  const uint8_t* ws = nullptr;
  const float* w_global = nullptr;
  const float* in_scale = nullptr;
  int P = 1;
  int64_t num_experts = 1;  // E (the weights' first dimension)
  bool modelopt = false;
  int64_t M = 0, K = 0;
  const __half* xq = nullptr;  // [x_rows, P, K] prepared activations
  int64_t x_rows = 0;
  // Work pairs (expert, first row, rows): device lists with a device count (grouped MoE), or, when
  // pair_e is null, the static tiling of rows [0, dense_rows) for expert 0 (dense Linear).
  const int32_t* pair_e = nullptr;
  const int32_t* pair_start = nullptr;
  const int32_t* pair_rows = nullptr;
  const int32_t* num_pairs = nullptr;
  int64_t max_pairs = 0;
  int64_t dense_rows = 0;
  // Epilogue. gate_up (M = 2I, gate rows then up rows): act[row, i] = the down input's quantized
  // value e2m1·sf (fp16, prepared layout) of silu(gate)·up, quantized with act_in_scale[e].
  bool gate_up = false;
  __half* act = nullptr;  // [rows, M/2]
  const float* act_in_scale = nullptr;
  bool act_modelopt = false;
  // Otherwise out[out_row(row), m] f32 with row stride ldo; out_row null: the row itself.
  const int32_t* out_row = nullptr;
  float* out = nullptr;
  int64_t ldo = 0;
};

// Whether a Linear's layout is one the regime takes: NVFP4 weights with NVFP4 activations (W4A4), K a
// multiple of the regime's k step, aligned payload and scales, partitions of whole tiles (gate_up:
// gate rows then up rows, 1 or 2 partitions, I a multiple of half a tile).
bool group_gemm_takes(const Linear& w, GroupTile t, bool gate_up);

// Launches the GEMM on b's stream (persistent CTAs over the work pairs × M tiles).
void launch_group_gemm(CudaBackend& b, const GroupGemmArgs& a, GroupTile tile);
// The regimes' launchers (nvfp4_group_gemv.cu, nvfp4_group_wgmma.cu) behind launch_group_gemm.
void launch_group_gemv(CudaBackend& b, const GroupGemmArgs& a);
// bn: the wgmma tile's activation rows per pair (64 or 128).
void launch_group_wgmma(CudaBackend& b, const GroupGemmArgs& a, int bn);
bool group_wgmma_available();
void launch_group_slice(CudaBackend& b, const GroupGemmArgs& a, bool half_items);
bool group_slice_takes(const Linear& w, bool gate_up, bool half_items);

}  // namespace sparkserve
