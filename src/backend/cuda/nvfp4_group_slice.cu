// Grouped NVFP4 W4A4 GEMM, K-sliced streamed regime (nvfp4_group_gemm.h, GroupTile::kSliceN): work pairs
// of up to 16 activation rows for the MoE from a few dozen tokens to ~16 tokens per routed expert (a
// ~300-token prompt of the 35B-A3B: every expert touched, ~10 rows each; batched decode).
//
// Memory-bound on the weights. An item is a pair x 128 gate rows + their 128 up rows (plain: 256
// consecutive rows; kSliceNHalf: half of each), a ring stage one 256-k slice of the item's rows and of the
// pair's 16 activation rows, all copied by the copy engine as 2-D tensor boxes (gate_up: 36 KB of weights
// and scales, 8 KB of activations per distinct activation partition); each consumer warp owns two (one)
// m16 tiles of one half (gate_up: warps 0-3 the gate rows, 4-7 the matching up rows) over the whole K,
// so its tiles share every activation load, its accumulators live across the item's stages (no partial
// sums; a stage is released by each warp's arrival). At a gate_up item's end the up warps hand their
// sums to the gate warps through the item's last stage. The activations (and the down input this
// kernel's gate_up writes) are in the chunk-major prepared layout (nvfp4_group_common.cuh). Shared
// memory of a stage: [rows][128] payload bytes (128-byte swizzled: 16-byte unit u of row r at
// u ^ (r % 8)), [rows][16] block scales, then [box][16][512] activation bytes.
// Measured (H200, 35B, 338 tokens, distinct gate / up scales; docs/performance.md): with the activations
// read by each warp through L1 (ld.global.nc), gate_up 157 us; copied into the stages, 129 us. Slices of
// 128 k in 4 stages per CTA (64-byte rows) were slower: 160 us.
#include <algorithm>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/nvfp4_group_common.cuh"
#include "backend/cuda/nvfp4_group_gemm.h"
#include "backend/cuda/tensor_map.h"

namespace sparkserve {
namespace {

constexpr int kChunk = 128;      // k per chunk: 64 payload bytes and 8 block scales per row
// kTiles: m16 tiles per warp (2: items of 256 rows, the pair's activation loads shared by two tiles; 1:
// items of 128 rows, twice as many items for the CTAs to share out evenly when there are few). Ring
// stages per CTA: 2 of 45-53 KB at 2 tiles, 3 of 27-35 KB at 1 (two CTAs per SM either way; where two do
// not fit, sm_120's 100 KB, one CTA of as many as fit: ring_fit).
template <int kTiles>
constexpr int kStagesOf = kTiles == 2 ? 2 : 3;
constexpr int kPairRows = 16;    // activation rows per work pair (group_tile_n): 2 n8 column tiles
constexpr int kColTiles = kPairRows / 8;
// The mbarriers first, then the ring from the next 1024-byte boundary (the 128-byte swizzle's atom).
constexpr int kRingSlack = 128 + 1024;

constexpr int kSliceK = 256, kSliceBytes = kSliceK / 2, kSliceScales = kSliceK / 16;
constexpr int kSliceWarps = 8;
template <int kTiles>
constexpr int kItemRows = kSliceWarps * 16 * kTiles;  // weight rows per item and stage: 256 or 128
template <int kTiles>
constexpr int kWeightBytes = kItemRows<kTiles> * (kSliceBytes + kSliceScales);  // 36,864 or 18,432
constexpr int kActBoxBytes = kPairRows * kSliceK * 2;                        // 8,192
// Activation boxes per stage: gate_up with two partitions whose input scales differ reads two (the gate
// warps partition 0, the up warps partition 1), else one.
template <int kTiles>
__host__ __device__ constexpr int slice_stage_bytes(int act_boxes) {
  return kWeightBytes<kTiles> + act_boxes * kActBoxBytes;
}

struct SliceShape {
  int slices, items_per_pair, act_boxes, stages;
};

// Row of shared-memory rows 0..7 that lane group g reads as its A rows g (and g + 8): consecutive g,
// which one quarter warp's 16-byte loads pair up, land in different 64-byte halves of the swizzled 128
// bytes (bank-conflict free). The epilogues write row sigma(g) accordingly.
__device__ __forceinline__ int sigma(int g) { return ((g & 1) << 2) | (g >> 1); }

// The activation partitions of an item's boxes: gate_up box 0 = partition 0 (gate warps), box 1 =
// partition 1 (up warps, only where its input scale differs from partition 0's); plain: the one box of
// the item's partition (items never straddle partitions: group_slice_takes).
__device__ __forceinline__ int item_partition(const GroupGemmArgs& a, int64_t e, int mg, bool gate_up, int item_rows) {
  if (gate_up) return 0;
  const int Mp = static_cast<int>(a.M / a.P);
  return read_partition(a.in_scale, e, a.P, mg * item_rows / Mp);
}
__device__ __forceinline__ bool up_box(const GroupGemmArgs& a, int64_t e) {
  return a.P == 2 && read_partition(a.in_scale, e, 2, 1) == 1;
}

// Producer: per item and slice, the payload boxes (gate_up: 128 gate rows, 128 up rows; plain 256 rows)
// of 128 bytes, their scale boxes of 16 bytes, and the pair's 16 activation rows of the slice (gate_up:
// one box per distinct partition). The weights of the first stages go out before the wait for the
// previous kernel (which writes the activations).
template <bool kGateUp, int kTiles>
__device__ __forceinline__ void slice_produce(const GroupGemmArgs& a, const SliceShape& sh, const CUtensorMap* wmap,
                                              const CUtensorMap* smap, const CUtensorMap* xmap0,
                                              const CUtensorMap* xmap1, uint8_t* ring, uint64_t* full, uint64_t* empty,
                                              int first, int last) {
  const uint64_t policy = evict_first_policy(), keep = evict_normal_policy();
  constexpr int kRows = kItemRows<kTiles>;
  const int stage_bytes = slice_stage_bytes<kTiles>(sh.act_boxes);
  struct ActCopy {  // a stage's activation copies
    uint8_t* st;
    uint64_t* bar;
    int s, start, p;
    bool up;
  };
  const auto copy_act = [&](const ActCopy& q) {
    uint8_t* act = q.st + kWeightBytes<kTiles>;
    tma_load_2d(act, q.p ? xmap1 : xmap0, q.s * kSliceK, q.start, q.bar, keep);
    if (q.up) tma_load_2d(act + kActBoxBytes, xmap1, q.s * kSliceK, q.start, q.bar, keep);
  };
  ActCopy pending[kStagesOf<kTiles>];  // the first stages' activation copies, waiting for the previous kernel
  int npending = 0;
  bool waited = false;
  uint32_t seq = 0, slot = 0, phase = 0;
  for (int item = first; item < last; ++item) {
    const int pair = item / sh.items_per_pair, mg = item % sh.items_per_pair;
    const WorkPair wp = work_pair(a, pair, kPairRows);
    const int64_t e = wp.e;
    const int start = static_cast<int>(wp.start);
    const int p = item_partition(a, e, mg, kGateUp, kRows);
    const bool up = kGateUp && up_box(a, e);
    for (int s = 0; s < sh.slices; ++s, ++seq) {
      if (seq >= static_cast<uint32_t>(sh.stages)) mbar_wait(&empty[slot], phase ^ 1u);
      uint8_t* st = ring + slot * stage_bytes;
      uint64_t* bar = &full[slot];
      mbar_arrive_expect_tx(bar, kWeightBytes<kTiles> + (up ? 2 : 1) * kActBoxBytes);
      if (kGateUp) {
        const int gate = static_cast<int>(e * a.M + static_cast<int64_t>(mg) * (kRows / 2));
        const int upr = gate + static_cast<int>(a.M / 2);
        tma_load_2d(st, wmap, s * kSliceBytes, gate, bar, policy);
        tma_load_2d(st + (kRows / 2) * kSliceBytes, wmap, s * kSliceBytes, upr, bar, policy);
        tma_load_2d(st + kRows * kSliceBytes, smap, s * kSliceScales, gate, bar, policy);
        tma_load_2d(st + kRows * kSliceBytes + (kRows / 2) * kSliceScales, smap, s * kSliceScales, upr, bar, policy);
      } else {
        const int row = static_cast<int>(e * a.M + static_cast<int64_t>(mg) * kRows);
        tma_load_2d(st, wmap, s * kSliceBytes, row, bar, policy);
        tma_load_2d(st + kRows * kSliceBytes, smap, s * kSliceScales, row, bar, policy);
      }
      const ActCopy q{st, bar, s, start, p, up};
      if (waited) {
        copy_act(q);
      } else {
        pending[npending++] = q;
        if (npending == sh.stages || (item == last - 1 && s == sh.slices - 1)) {
          pdl_wait();
          waited = true;
          for (int i = 0; i < npending; ++i) copy_act(pending[i]);
        }
      }
      if (++slot == static_cast<uint32_t>(sh.stages)) {
        slot = 0;
        phase ^= 1u;
      }
    }
  }
}

// One 128-k chunk of a warp's two tiles: A operands from the stage's swizzled payload (rows sigma(g) and
// sigma(g) + 8 of each tile at `w`, 16-byte unit offset wo; the second tile 16 rows below), scales at
// sc; B from the activation box x (rows g and 8 + g, byte offsets xo[i] of step i) for kN n8 column tiles.
template <int kTiles, int kN>
__device__ __forceinline__ void slice_chunk(float (&acc)[kTiles][2][4], const uint8_t* w, const uint8_t* sc,
                                            const uint8_t* x, const int (&xo)[4]) {
  ChunkOps o[kTiles];
  __half2 h[kTiles][2];
#pragma unroll
  for (int tile = 0; tile < kTiles; ++tile) {
    o[tile] = load_chunk(w + 16 * tile * kSliceBytes, 8 * kSliceBytes, sc + 16 * tile * kSliceScales, 8 * kSliceScales);
    h[tile][0] = e4m3x2_to_half2(o[tile].s0 & 0xffu, o[tile].s0 >> 8);
    h[tile][1] = e4m3x2_to_half2(o[tile].s1 & 0xffu, o[tile].s1 >> 8);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint4 b[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j) b[j] = *reinterpret_cast<const uint4*>(x + j * 8 * 2 * kSliceK + xo[i]);
    uint32_t f[kTiles][4];
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile)
      decode_a<0>(word(o[tile].q0, i), word(o[tile].q1, i), i / 2 ? __high2half2(h[tile][0]) : __low2half2(h[tile][0]),
                  i / 2 ? __high2half2(h[tile][1]) : __low2half2(h[tile][1]), f[tile]);
#pragma unroll
    for (int j = 0; j < kN; ++j)
#pragma unroll
      for (int tile = 0; tile < kTiles; ++tile) mma16816(acc[tile][j], f[tile], b[j].x, b[j].y);
#pragma unroll
    for (int tile = 0; tile < kTiles; ++tile)
      decode_a<1>(word(o[tile].q0, i), word(o[tile].q1, i), i / 2 ? __high2half2(h[tile][0]) : __low2half2(h[tile][0]),
                  i / 2 ? __high2half2(h[tile][1]) : __low2half2(h[tile][1]), f[tile]);
#pragma unroll
    for (int j = 0; j < kN; ++j)
#pragma unroll
      for (int tile = 0; tile < kTiles; ++tile) mma16816(acc[tile][j], f[tile], b[j].z, b[j].w);
  }
}

// A warp's kTiles tiles over all the item's slices: stage rows 16 kTiles warp onwards (gate_up: warps
// 0-3 the gate rows, 4-7 the matching up rows), activation box `box`; par: the parity of the warp's
// activation row g (odd rows hold each 128 bytes' halves swapped: chunk_major_group). hold_last: the
// last slice's stage is not released (the caller hands sums over through it, then releases it); returns
// that stage's slot.
template <int kTiles, int kN>
__device__ __forceinline__ uint32_t slice_item(float (&acc)[kTiles][2][4], const SliceShape& sh, uint8_t* ring,
                                               uint64_t* full, uint64_t* empty, uint32_t& slot, uint32_t& phase,
                                               int box, int par, bool hold_last, int warp, int lane) {
  constexpr int kRows = kItemRows<kTiles>;
  const int g = lane / 4, t = lane % 4, sg = sigma(g), r = 16 * kTiles * warp + sg;
  const int stage_bytes = slice_stage_bytes<kTiles>(sh.act_boxes);
  // 16-byte unit 4c + t of row r sits at (4c + t) ^ sg (the swizzle; r % 8 == sg).
  int wo[2];
#pragma unroll
  for (int c = 0; c < 2; ++c) wo[c] = 16 * ((4 * c + t) ^ sg);
  uint32_t last_slot = slot;
  for (int s = 0; s < sh.slices; ++s) {
    mbar_wait(&full[slot], phase);
    const uint8_t* st = ring + slot * stage_bytes;
    const uint8_t* sc = st + kRows * kSliceBytes;
    const uint8_t* x = st + kWeightBytes<kTiles> + box * kActBoxBytes + g * 2 * kSliceK;
#pragma unroll
    for (int c = 0; c < kSliceK / kChunk; ++c) {
      int xo[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) xo[i] = 2 * kChunk * c + 64 * (i ^ par) + 16 * t;
      slice_chunk<kTiles, kN>(acc, st + r * kSliceBytes + wo[c], sc + r * kSliceScales + 8 * c + 2 * t, x, xo);
    }
    __syncwarp();
    if (lane == 0 && !(hold_last && s == sh.slices - 1)) mbar_arrive(&empty[slot]);
    last_slot = slot;
    if (++slot == static_cast<uint32_t>(sh.stages)) {
      slot = 0;
      phase ^= 1u;
    }
  }
  return last_slot;
}

// The consumer warps only (named barrier 1; the producer does not take part).
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kSliceWarps * 32) : "memory"); }

template <bool kGateUp, int kTiles>
__device__ __forceinline__ void slice_consume(const GroupGemmArgs& a, const SliceShape& sh, uint8_t* ring,
                                              uint64_t* full, uint64_t* empty, int first, int last, int warp,
                                              int lane) {
  const int g = lane / 4, t = lane % 4, sg = sigma(g);
  const int64_t M = a.M;
  const int Mp = static_cast<int>(M / a.P);
  pdl_wait();
  uint32_t slot = 0, phase = 0;
  for (int item = first; item < last; ++item) {
    const int pair = item / sh.items_per_pair, mg = item % sh.items_per_pair;
    const WorkPair wp = work_pair(a, pair, kPairRows);
    const int64_t e = wp.e, start = wp.start;
    const int rows = wp.rows, nt = (rows + 7) / 8;
    // The warp's first weight row within its half (gate_up: gate or up rows) and its activation box.
    const bool up_warp = kGateUp && warp >= kSliceWarps / 2;
    constexpr int kRows = kItemRows<kTiles>, kWarpRows = 16 * kTiles;
    const int64_t row0 = kGateUp ? static_cast<int64_t>(mg) * (kRows / 2) + kWarpRows * (warp % (kSliceWarps / 2))
                                 : static_cast<int64_t>(mg) * kRows + kWarpRows * warp;
    const int box = up_warp && up_box(a, e) ? 1 : 0;
    const int par = static_cast<int>((start + g) & 1);
    float acc[kTiles][2][4] = {};
    const uint32_t held = nt == 1 ? slice_item<kTiles, 1>(acc, sh, ring, full, empty, slot, phase, box, par, kGateUp,
                                                          warp, lane)
                                  : slice_item<kTiles, 2>(acc, sh, ring, full, empty, slot, phase, box, par, kGateUp,
                                                          warp, lane);
    if constexpr (kGateUp) {
      // The up warps hand their sums to the gate warps of the same rows through the item's last stage,
      // which no warp has released: the first barrier waits for every warp to finish reading it, the
      // second for the sums; each warp then releases it (gate warps once they have read).
      // [warp - 4][tile][column tile][register][lane] floats.
      float up[kTiles][2][4];
      float* slab = reinterpret_cast<float*>(ring + held * slice_stage_bytes<kTiles>(sh.act_boxes)) +
                    (warp % (kSliceWarps / 2)) * (kTiles * kColTiles * 4 * 32) + lane;
      consumer_sync();
      if (up_warp) {
#pragma unroll
        for (int i = 0; i < kTiles * kColTiles * 4; ++i) slab[32 * i] = (&acc[0][0][0])[i];
        // ordered before the copy engine's next writes to the stage
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      }
      consumer_sync();
      if (!up_warp)
#pragma unroll
        for (int i = 0; i < kTiles * kColTiles * 4; ++i) (&up[0][0][0])[i] = slab[32 * i];
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[held]);
      if (!up_warp) {
        const float d_in = a.act_in_scale[e];
        const float fg = global_factor(a.w_global[e * a.P], a.in_scale[e * a.P], a.modelopt);
        const float fu = global_factor(a.w_global[e * a.P + a.P - 1], a.in_scale[e * a.P + a.P - 1], a.modelopt);
#pragma unroll
        for (int tile = 0; tile < kTiles; ++tile)
          store_gate_up<2, true>(acc[tile], up[tile], fg, fu, a.act_modelopt ? 1.0f / d_in : d_in, a.act, M / 2,
                                 start, row0 + 16 * tile, 0, rows, sg, t);
      }
    } else {
#pragma unroll
      for (int tile = 0; tile < kTiles; ++tile) {
        const int64_t r = row0 + 16 * tile;
        const int p = static_cast<int>(r / Mp);
        const float f = global_factor(a.w_global[e * a.P + p], a.in_scale[e * a.P + p], a.modelopt);
        store_plain<2>(acc[tile], f, a.out, a.ldo, a.out_row, start, r, 0, rows, sg, t);
      }
    }
  }
}

template <bool kGateUp, int kTiles>
__global__ void __launch_bounds__((kSliceWarps + 1) * 32, 2)
    group_slice_kernel(const GroupGemmArgs a, const SliceShape sh, const __grid_constant__ CUtensorMap wmap,
                       const __grid_constant__ CUtensorMap smap, const __grid_constant__ CUtensorMap xmap0,
                       const __grid_constant__ CUtensorMap xmap1) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kStagesOf<kTiles>;
  uint8_t* ring = smem + (((smem_addr(smem) + 128 + 1023) & ~1023u) - smem_addr(smem));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  pdl_launch_dependents();
  if (threadIdx.x == 0) {
    for (int s = 0; s < sh.stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kSliceWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int64_t items = num_work_pairs(a, kPairRows) * sh.items_per_pair;
  const int first = static_cast<int>(blockIdx.x * items / gridDim.x);
  const int last = static_cast<int>((blockIdx.x + 1) * items / gridDim.x);
  if (warp == kSliceWarps) {
    if (lane == 0) slice_produce<kGateUp, kTiles>(a, sh, &wmap, &smap, &xmap0, &xmap1, ring, full, empty, first, last);
  } else {
    slice_consume<kGateUp, kTiles>(a, sh, ring, full, empty, first, last, warp, lane);
  }
}

// Activation boxes per stage for a call: two only for gate_up with two partitions.
int act_boxes(const GroupGemmArgs& a) { return a.gate_up && a.P == 2 ? 2 : 1; }

// CTAs per SM and ring stages per CTA: two CTAs of kStagesOf stages where they fit (sm_90, sm_100), else
// one CTA of as many stages as fit up to kStagesOf, at least 2 (sm_120's 100 KB), else none.
struct RingFit {
  int blocks, stages;
  int64_t smem;
};
template <int kTiles>
RingFit ring_fit(int act_boxes) {
  const SmemLimits& l = smem_limits();
  const int64_t stage = slice_stage_bytes<kTiles>(act_boxes);
  for (int blocks = 2; blocks >= 1; --blocks) {
    const int64_t room = std::min(l.optin, l.per_sm / blocks - l.reserved) - kRingSlack;
    const int stages = static_cast<int>(std::min<int64_t>(kStagesOf<kTiles>, room / stage));
    if (stages >= (blocks == 2 ? kStagesOf<kTiles> : 2)) return {blocks, stages, kRingSlack + stages * stage};
  }
  return {0, 0, 0};
}

template <bool kGateUp, int kTiles>
void launch(CudaBackend& b, const GroupGemmArgs& a) {
  constexpr int kRows = kItemRows<kTiles>;
  SliceShape sh{};
  sh.slices = static_cast<int>(a.K / kSliceK);
  sh.items_per_pair = static_cast<int>(kGateUp ? (a.M / 2) / (kRows / 2) : a.M / kRows);
  sh.act_boxes = act_boxes(a);
  const RingFit fit = ring_fit<kTiles>(sh.act_boxes);
  sh.stages = fit.stages;
  // Payload [E·M rows, K/2 bytes] in boxes of 128 bytes (128-byte swizzle), block scales [E·M, K/16] in
  // boxes of 16, with no L2 promotion: measured with 256-byte promotion, the gate_up call read 496 MB
  // from DRAM for its 302 MB (the promoted halves, marked evict-first like the rest, were gone before
  // the next slice's copy). Activations [rows, P, K] fp16: one map per partition read (0 and P - 1),
  // boxes of 16 rows x 256 k.
  const int box_rows = kGateUp ? kRows / 2 : kRows;
  const CUtensorMap wmap = tensor_map_2d(a.w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.num_experts * a.M, a.K / 2, a.K / 2,
                                         box_rows, kSliceBytes, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE);
  const CUtensorMap smap =
      tensor_map_2d(a.ws, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, a.num_experts * a.M, a.K / 16, a.K / 16, box_rows,
                    kSliceScales, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE);
  const int64_t xrows = a.pair_e ? a.x_rows : a.dense_rows;
  CHECK(xrows > 0);
  const auto xmap = [&](int p) {
    return tensor_map_2d(a.xq + p * a.K, CU_TENSOR_MAP_DATA_TYPE_UINT16, 2, xrows, a.K,
                         a.P * a.K, kPairRows, kSliceK, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_NONE);
  };
  const CUtensorMap xmap0 = xmap(0), xmap1 = xmap(a.P - 1);
  auto kern = group_slice_kernel<kGateUp, kTiles>;
  static int64_t allowed = 0;
  allow_smem(kern, fit.smem, allowed);
  const int64_t pairs = a.pair_e ? a.max_pairs : (a.dense_rows + kPairRows - 1) / kPairRows;
  CHECK(pairs * sh.items_per_pair < (int64_t{1} << 31));
  const int64_t grid = std::min<int64_t>(pairs * sh.items_per_pair, int64_t{fit.blocks} * b.sm_count());
  if (grid <= 0) return;
  launch_with_pdl(kern, static_cast<unsigned>(grid), (kSliceWarps + 1) * 32, fit.smem, b.stream(), a, sh, wmap, smap,
                  xmap0, xmap1);
}

}  // namespace

bool group_slice_takes(const Linear& w, bool gate_up, bool half_items) {
  const int64_t K = w.in_features, M = w.out_features, P = w.partitions;
  if (!tensor_maps_available() || P < 1 || P > 2 || K % kSliceK != 0 || M % P != 0) return false;
  const int boxes = gate_up && P == 2 ? 2 : 1;
  if ((half_items ? ring_fit<1>(boxes).blocks : ring_fit<2>(boxes).blocks) == 0) return false;
  // 16-byte aligned payload and scales (the tensor maps' rule; their rows, K/2 and K/16 bytes, are too).
  if ((reinterpret_cast<uintptr_t>(w.weight.data) & 15u) != 0 || (reinterpret_cast<uintptr_t>(w.weight_scale.data) & 15u) != 0)
    return false;
  // Items of whole tiles (gate_up: gate rows then up rows, 1 or 2 partitions; plain: each item's rows in
  // one partition, so that it reads one activation box).
  if (gate_up) return (M / 2) % (kItemRows<2> / 2) == 0;
  return (M / P) % kItemRows<2> == 0;
}

void launch_group_slice(CudaBackend& b, const GroupGemmArgs& a, bool half_items) {
  if (half_items) {
    if (a.gate_up)
      launch<true, 1>(b, a);
    else
      launch<false, 1>(b, a);
  } else {
    if (a.gate_up)
      launch<true, 2>(b, a);
    else
      launch<false, 2>(b, a);
  }
}

}  // namespace sparkserve
