// Grouped NVFP4 W4A4 experts (moe_grouped.h). Launches, in stream order:
//   [route_topk]   one warp per token (moe_route.cuh), unless fused into the plan's single block
//   plan rank      per chunk of 1024 (token, slot) pairs: each slot's rank among the chunk's slots of
//                  its expert (warp match_any + a per-warp count table: slot order, deterministic)
//                  and the chunk's count per expert; a single chunk (T <= 128 at top-8) also does
//                  the next step, and for T <= 64 runs the routing first
//   plan offsets   experts' first rows, and the work pairs (expert, first row, rows <= the tile's N:
//                  an expert's rows split evenly)
//   prepare        per token: x quantized for each slot and gate_up partition with that expert's
//                  input scale (CPU-exact codes, quant_math.cuh) into the GEMM's activation rows in
//                  expert order (nvfp4_group_gemm.h's prepared layout)
//   gate_up GEMM   + silu(gate)·up and its quantization with the down expert's input scale
//   down GEMM      y per slot, f32
//   combine        out[t] = Σ weight·y over the token's slots in ascending expert id (the CPU's order)
// Numerics vs the CPU (backend/cpu/moe.cpp + quant_linear.cpp): the same activation codes and block
// scales, exact products, f32 sums in another order (tensor-core accumulation), global factors
// applied once per output; so a down-input element within ~1e-6 of an E2M1 rounding threshold can
// take the neighbouring code (tests/gpu/moe_grouped_checks.cpp counts such tokens).
#include "backend/cuda/moe_grouped.h"

#include <algorithm>
#include <vector>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/moe_probe.h"
#include "backend/cuda/moe_route.cuh"
#include "backend/cuda/nvfp4_group_common.cuh"
#include "backend/cuda/nvfp4_group_gemm.h"
#include "backend/cuda/quant_math.cuh"

namespace sparkserve {
namespace {

constexpr int kPlanThreads = 1024;
// Routing inside the single plan block up to 16 tokens (one per warp; the block's SM routes them all):
// measured on the H200 (docs/performance.md "The MoE's glue at small T"), the plan with the routing
// fused took 24 µs after the router at 64 tokens, 10 at 16; the routing kernel (a block per token) and
// the plan, 10 at 64. (The 122B batch-64 step did not move either way: 30.65 / 30.67 ms.)
constexpr int64_t kFusedRouteMaxT = 16;
constexpr int64_t kMaxExperts = 512;     // the plan's count table: 32 x E ints of shared memory
constexpr int kMaxPerToken = 32;         // experts per token (the combine's order table)
constexpr int kMaxPreparedK = 8192;      // activation row length of the grouped paths
// Dense Linear: one token stays on decode_gemv.cu's GEMV.
constexpr int64_t kGroupedLinearMinRows = 2;

// Exclusive prefix sums of v.x and v.y over the block's threads in thread order (every thread calls
// it); the block's totals in `total`. wsum: 64 ints of shared memory.
__device__ int2 block_exclusive_scan2(int2 v, int* wsum, int2& total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
  int2 inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int nx = __shfl_up_sync(0xffffffffu, inc.x, o), ny = __shfl_up_sync(0xffffffffu, inc.y, o);
    if (lane >= o) inc.x += nx, inc.y += ny;
  }
  if (lane == 31) wsum[warp] = inc.x, wsum[32 + warp] = inc.y;
  __syncthreads();
  if (warp == 0) {
    int wx = lane < nw ? wsum[lane] : 0, wy = lane < nw ? wsum[32 + lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int nx = __shfl_up_sync(0xffffffffu, wx, o), ny = __shfl_up_sync(0xffffffffu, wy, o);
      if (lane >= o) wx += nx, wy += ny;
    }
    wsum[lane] = wx, wsum[32 + lane] = wy;  // inclusive over warps
  }
  __syncthreads();
  total = make_int2(wsum[nw - 1], wsum[32 + nw - 1]);
  const int2 excl = make_int2(inc.x - v.x + (warp > 0 ? wsum[warp - 1] : 0), inc.y - v.y + (warp > 0 ? wsum[32 + warp - 1] : 0));
  __syncthreads();
  return excl;
}

struct PlanArgs {
  const float* logits;  // [T, E] when the routing is fused (one chunk), else null
  int32_t* ids;         // [T, k]
  float* weights;       // [T, k]
  int64_t T, k, E;
  int tile_n;           // rows per work pair at most
  int32_t* rank;        // [slots] a slot's rank among its chunk's slots of the same expert
  int32_t* chunk_base;  // [chunks, E] counts per chunk, then (plan_offsets) the slots of earlier chunks
  int32_t* offsets;     // [E] first row of each expert
  int32_t *pair_e, *pair_start, *pair_rows, *num_pairs;
};

// The experts' offsets and the work pairs from the experts' counts (one block of kPlanThreads, thread
// e: expert e's count, 0 past E): an expert's rows are split evenly over ceil(count / tile_n) pairs.
// wsum: 64 ints of shared memory.
__device__ void plan_pairs(const PlanArgs& a, int cnt, int* wsum) {
  const int tid = threadIdx.x;
  const int np = (cnt + a.tile_n - 1) / a.tile_n;
  int2 total;
  const int2 first = block_exclusive_scan2(make_int2(cnt, np), wsum, total);
  if (tid < a.E) a.offsets[tid] = first.x;
  for (int i = 0; i < np; ++i) {
    const int lo = first.x + static_cast<int>(static_cast<int64_t>(i) * cnt / np);
    const int hi = first.x + static_cast<int>(static_cast<int64_t>(i + 1) * cnt / np);
    a.pair_e[first.y + i] = tid;
    a.pair_start[first.y + i] = lo;
    a.pair_rows[first.y + i] = hi - lo;
  }
  if (tid == 0) *a.num_pairs = total.y;
}

// plan_pairs from the per-chunk counts of several chunks; chunk_base becomes an exclusive prefix over
// chunks. wsum: 64 ints of shared memory.
__device__ void plan_offsets(const PlanArgs& a, int64_t chunks, int* wsum) {
  const int tid = threadIdx.x;
  int cnt = 0;
  if (tid < a.E) {
    constexpr int kBatch = 16;  // independent loads in flight per step of the running sum
    for (int64_t c0 = 0; c0 < chunks; c0 += kBatch) {
      int v[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i) v[i] = c0 + i < chunks ? a.chunk_base[(c0 + i) * a.E + tid] : 0;
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (c0 + i < chunks) a.chunk_base[(c0 + i) * a.E + tid] = cnt;
        cnt += v[i];
      }
    }
  }
  plan_pairs(a, cnt, wsum);
}

// Block c ranks slots [1024c, 1024c + 1024) within their experts (warp match_any, then a per-warp
// count table prefixed over the warps in warp order: the slot order, deterministic) and writes the
// chunk's count per expert. A single block ([the routing first, fused], the whole batch in one chunk)
// goes on to plan_pairs itself with the counts from shared memory. Launched with programmatic stream
// serialization: the table is cleared before griddepcontrol.wait. Shared memory (ints): the table
// [32][E], the scans' 64, the fused routing's ids and weights [2][1024], the counts [E].
static_assert(kMaxExperts <= 32 * kRouteMaxPerLane && kMaxPerToken <= 32, "routing with probabilities in registers");
int64_t plan_smem_bytes(int64_t E) { return (32 * E + 64 + 2 * kPlanThreads + E) * 4; }
__global__ void __launch_bounds__(kPlanThreads) moe_plan_rank_kernel(PlanArgs a) {
  extern __shared__ int32_t sm[];
  const int64_t E = a.E, slots = a.T * a.k;
  int32_t* tbl = sm;
  int32_t* wsum = tbl + 32 * E;
  int32_t* s_ids = wsum + 64;
  float* s_w = reinterpret_cast<float*>(s_ids + kPlanThreads);
  int32_t* s_cnt = s_ids + 2 * kPlanThreads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t s = static_cast<int64_t>(blockIdx.x) * kPlanThreads + tid;
  // The warps holding slots of this chunk: only their table rows are used.
  const int64_t left = slots - static_cast<int64_t>(blockIdx.x) * kPlanThreads;
  const int nw = static_cast<int>(left >= kPlanThreads ? 32 : (left + 31) / 32);
  for (int64_t i = tid; i < nw * E; i += kPlanThreads) tbl[i] = 0;
  pdl_wait();
  int e = -1;
  if (a.logits) {  // one chunk: the routing's ids and weights through shared memory, then out
    for (int64_t t = warp; t < a.T; t += kPlanThreads / 32)
      route_topk_warp(nullptr, a.logits + t * E, E, a.k, s_ids + t * a.k, s_w + t * a.k);
    __syncthreads();
    if (s < slots) {
      e = s_ids[s];
      a.ids[s] = e;
      a.weights[s] = s_w[s];
    }
  } else if (s < slots) {
    e = a.ids[s];
  }
  if (s < slots && (e < 0 || e >= E)) __trap();  // the CPU reference CHECKs this too
  const unsigned same = __match_any_sync(0xffffffffu, e);
  const int in_warp = __popc(same & ((1u << lane) - 1u));
  if (s < slots && in_warp == 0) tbl[warp * E + e] = __popc(same);
  __syncthreads();
  for (int64_t ee = tid; ee < E; ee += kPlanThreads) {  // warp w's first rank within the expert
    int acc = 0;
    for (int w = 0; w < nw; ++w) {
      const int c = tbl[w * E + ee];
      tbl[w * E + ee] = acc;
      acc += c;
    }
    if (gridDim.x == 1)
      s_cnt[ee] = acc;
    else
      a.chunk_base[blockIdx.x * E + ee] = acc;
  }
  __syncthreads();
  if (s < slots) a.rank[s] = tbl[warp * E + e] + in_warp;
  if (gridDim.x == 1) {
    if (tid < E) a.chunk_base[tid] = 0;  // the one chunk: an expert's rows start at its offset
    plan_pairs(a, tid < E ? s_cnt[tid] : 0, wsum);
  }
}

__global__ void __launch_bounds__(kPlanThreads) moe_plan_offsets_kernel(PlanArgs a, int64_t chunks) {
  __shared__ int wsum[64];
  plan_offsets(a, chunks, wsum);
}

struct PrepareArgs {
  const float* x;          // [T, K]
  int64_t K, k, spb;       // k: slots (destination rows) per token, spb: slots per block
  int P;
  const float* in_scale;   // [E, P]
  bool modelopt;
  bool chunk_major;        // the chunk-major layout (nvfp4_group_common.cuh: GroupTile::kSliceN reads it)
  // MoE (null for dense: token t -> row t, expert 0): slot s = t * k + j goes to row
  // offsets[e] + chunk_base[s / 1024, e] + rank[s] of its expert e = ids[s]; slot_of[row] = s.
  const int32_t* ids;
  const int32_t *rank, *chunk_base, *offsets;
  int32_t* slot_of;
  int64_t E;
  __half* xq;              // [rows, P, K] (nvfp4_group_gemm.h's prepared layout)
};

// Block (t, y): slots [y·spb, y·spb + spb) of token t (spb = k for many tokens: x read once per token;
// 1 for few: one block per slot, enough blocks to fill the GPU). Each thread holds one 16-value block of
// x per pass and quantizes it for each slot and partition with that expert's input scale (CPU-exact:
// quant_math.cuh's block scales, e2m1_round's codes), storing the values e2m1·sf as fp16 in two 16-byte
// 8-groups in the order 0,4,1,5,2,6,3,7. One block scale per thread and block, no shuffles. (Measured,
// H200, ncu, 338 tokens x 8 slots of the 35B with distinct gate / up scales: 12.6 us; 8 values per lane
// sharing block scales over lane pairs, 21 us; 4 values per lane, 33 us. Two slots per block: 12.8.)
constexpr int kPrepMaxThreads = 256;
int prep_threads(int64_t K) { return static_cast<int>(std::min<int64_t>(kPrepMaxThreads, (K / 16 + 31) / 32 * 32)); }
__global__ void __launch_bounds__(kPrepMaxThreads) prepare_rows_kernel(PrepareArgs a) {
  const int64_t t = blockIdx.x, K = a.K;
  const int64_t j0 = static_cast<int64_t>(blockIdx.y) * a.spb, j1 = min(a.k, j0 + a.spb);
  for (int64_t i = 16 * static_cast<int64_t>(threadIdx.x); i < K; i += 16 * static_cast<int64_t>(blockDim.x)) {
    float x[16];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4 v = *reinterpret_cast<const float4*>(a.x + t * K + i + 4 * q);
      x[4 * q] = v.x;
      x[4 * q + 1] = v.y;
      x[4 * q + 2] = v.z;
      x[4 * q + 3] = v.w;
    }
    float amax = 0.0f;
#pragma unroll
    for (int m = 0; m < 16; ++m) amax = fmaxf(amax, fabsf(x[m]));
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t s = t * a.k + j;
      int64_t e = 0, row = s;
      if (a.ids) {
        e = a.ids[s];
        row = a.offsets[e] + a.chunk_base[(s / kPlanThreads) * a.E + e] + a.rank[s];
        if (threadIdx.x == 0 && i == 0) a.slot_of[row] = static_cast<int32_t>(s);
      }
      for (int p = 0; p < a.P; ++p) {
        const float in_s = a.in_scale[e * a.P + p];
        if (p > 0 && in_s == a.in_scale[e * a.P]) continue;  // partition 0's values: the GEMM reads those
        const float gs = a.modelopt ? 1.0f / in_s : in_s;
        float sf, out_scale;
        nvfp4_block_scales(amax, gs, sf, out_scale);
        __half* o = a.xq + (row * a.P + p) * K;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          uint4 out;
          uint32_t* w = &out.x;
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            const float y0 = e2m1_round(fminf(fmaxf(__fmul_rn(x[8 * h + m], out_scale), -6.0f), 6.0f)) * sf;
            const float y1 = e2m1_round(fminf(fmaxf(__fmul_rn(x[8 * h + m + 4], out_scale), -6.0f), 6.0f)) * sf;
            const __half2 hv = __floats2half2_rn(y0, y1);
            w[m] = *reinterpret_cast<const uint32_t*>(&hv);
          }
          const int64_t group = i / 8 + h;
          *reinterpret_cast<uint4*>(o + 8 * (a.chunk_major ? chunk_major_group(group, row) : group)) = out;
        }
      }
    }
  }
}

// out[t] = Σ over the token's slots in ascending expert id of weight · y[slot]; block (t, y) takes
// columns [1024y, 1024y + 1024). y: [T * k, H] f32 -> out: [T, H] f32
constexpr int kCombineCols = 1024;
__global__ void __launch_bounds__(256) combine_kernel(float* out, const float* y, const int32_t* ids, const float* w,
                                                      int64_t k, int64_t H) {
  __shared__ int order[kMaxPerToken];
  const int64_t t = blockIdx.x;
  if (threadIdx.x < k) {  // rank of slot i by expert id (ties keep slot order)
    const int i = threadIdx.x;
    const int32_t* id = ids + t * k;
    int rank = 0;
    for (int j = 0; j < k; ++j) rank += id[j] < id[i] || (id[j] == id[i] && j < i);
    order[rank] = i;
  }
  __syncthreads();
  const int64_t c_end = min(H, static_cast<int64_t>(blockIdx.y + 1) * kCombineCols);
  for (int64_t c = blockIdx.y * kCombineCols + 4 * static_cast<int64_t>(threadIdx.x); c < c_end; c += 4 * blockDim.x) {
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i = 0; i < k; ++i) {
      const int j = order[i];
      const float wj = w[t * k + j];
      const float4 v = *reinterpret_cast<const float4*>(y + (t * k + j) * H + c);
      o.x += wj * v.x;
      o.y += wj * v.y;
      o.z += wj * v.z;
      o.w += wj * v.w;
    }
    *reinterpret_cast<float4*>(out + t * H + c) = o;
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// The tile regime for an average of `per_expert` rows per weight matrix: up to small_max, the small-N
// regime `small` (memory-bound, every distinct expert streamed once); up to medium_max, the medium
// warpgroup-MMA tile (pairs of up to 64 rows, 2 CTAs per SM); more, the large one (128 rows), when the
// shapes take it (`takes`), else the mma.sync large-N kernel, else `small`. The MoE's small regime is
// the K-sliced kernel (kSliceN, pairs of up to 16 rows) where both projections fit it, else kSmallN.
// Measured on the H200 at the 35B / 122B expert shapes (docs/performance.md, "A later agent turn's
// MoE"), op us, sliced vs the medium tile: at 12 rows per expert 288 / 672 vs 409 / 1024, at 16 rows
// (over 40% of the experts then need a second pair) 361 vs 445 (35B): hence kMoeSliceMaxRows = 16.
// Below, the sliced kernel beat the streamed one it replaced at every T from 16 to 512 (35B T = 16
// 94 vs 100 us, T = 338 268 vs 370; 122B T = 16 207 vs 206, T = 64 405 vs 448; the 35B's 338-token
// prefill after 10,240 cached tokens 29.23 vs 30.85 ms), and kSmallN by more.
// Medium wins by 8-17% over kSmallN at 10-32 rows and is within 3.5% of large at 64. Dense layers
// (medium_max 0) keep kSmallN up to 8 rows and take no medium tile: at T = 64 the qkv projection ran
// 56 us on it against 51 on the large tile.
constexpr double kSmallNMaxRows = 8.0, kMoeSliceMaxRows = 16.0, kMoeMediumMaxRows = 48.0;
template <class Takes>
GroupTile pick_tile(double per_expert, double small_max, double medium_max, GroupTile small, const Takes& takes) {
  if (per_expert <= small_max) return small;
  const GroupTile wgmma = per_expert <= medium_max ? GroupTile::kMediumNWgmma : GroupTile::kLargeNWgmma;
  if (takes(wgmma)) return wgmma;
  if (takes(GroupTile::kLargeN)) return GroupTile::kLargeN;
  return small;
}

bool moe_shapes_take(const Linear& gate_up, const Linear& down, GroupTile tile) {
  return group_tile_fits(tile) && group_gemm_takes(gate_up, tile, true) && group_gemm_takes(down, tile, false);
}

// The MoE's small-N regime: the K-sliced kernel where both projections' shapes fit it, else kSmallN.
// Below one row per expert (decode batches under 32 tokens at top-8 of 256) its items of 128 rows
// (kSliceNHalf): the few pairs (~100 experts at 16 tokens) make 256-row items too few to share out
// evenly over the CTAs (measured, H200, 122B decode at batch 16: 17.28 ms per step vs 17.82 with 256-row
// items; batch 64, 2 rows per expert, 32.28 either way; op at 32 tokens 334 vs 308 us). The 128-row items
// also where the 256-row ones do not fit (sm_120's shared memory with two gate_up input scales).
constexpr double kMoeSliceHalfBelowRows = 1.0;
GroupTile moe_small_tile(const Linear& gate_up, const Linear& down, double per_expert) {
  const bool full = moe_shapes_take(gate_up, down, GroupTile::kSliceN);
  const bool half = moe_shapes_take(gate_up, down, GroupTile::kSliceNHalf);
  if (half && (per_expert < kMoeSliceHalfBelowRows || !full)) return GroupTile::kSliceNHalf;
  return full ? GroupTile::kSliceN : GroupTile::kSmallN;
}

// The plan's work pairs for a GEMM.
void set_pairs(GroupGemmArgs& g, const PlanArgs& pa, int64_t max_pairs) {
  g.num_experts = pa.E;
  g.pair_e = pa.pair_e;
  g.pair_start = pa.pair_start;
  g.pair_rows = pa.pair_rows;
  g.num_pairs = pa.num_pairs;
  g.max_pairs = max_pairs;
  g.x_rows = pa.T * pa.k;
}

GroupGemmArgs gemm_args(const Linear& w, const __half* xq) {
  GroupGemmArgs g;
  g.w = static_cast<const uint8_t*>(w.weight.data);
  g.ws = static_cast<const uint8_t*>(w.weight_scale.data);
  g.w_global = static_cast<const float*>(w.global_scale.data);
  g.in_scale = static_cast<const float*>(w.input_scale.data);
  g.P = static_cast<int>(w.partitions);
  g.modelopt = w.format == WeightFormat::kNvfp4ModelOpt;
  g.M = w.out_features;
  g.K = w.in_features;
  g.xq = xq;
  return g;
}

PrepareArgs prepare_args(const Linear& w, const float* x, __half* xq) {
  PrepareArgs p{};
  p.x = x;
  p.K = w.in_features;
  p.k = 1;
  p.spb = 1;
  p.P = static_cast<int>(w.partitions);
  p.in_scale = static_cast<const float*>(w.input_scale.data);
  p.modelopt = w.format == WeightFormat::kNvfp4ModelOpt;
  p.xq = xq;
  return p;
}

// The plan's buffers in one scratch allocation of plan_meta_bytes: rank [slots], slot_of [slots] (the
// down GEMM's output rows, written by the prepare), chunk_base [chunks, E], offsets [E], the pairs
// (3 x max_pairs) and their count.
int64_t plan_chunks(int64_t slots) { return (slots + kPlanThreads - 1) / kPlanThreads; }
size_t plan_meta_bytes(int64_t T, int64_t k, int64_t E, int64_t max_pairs) {
  const int64_t slots = T * k;
  return static_cast<size_t>(2 * slots + plan_chunks(slots) * E + E + 3 * max_pairs + 1) * 4;
}
PlanArgs plan_args(int32_t* meta, int32_t* ids, float* weights, int64_t T, int64_t k, int64_t E, int64_t tile_n,
                   int64_t max_pairs) {
  const int64_t slots = T * k;
  PlanArgs pa{};
  pa.ids = ids;
  pa.weights = weights;
  pa.T = T;
  pa.k = k;
  pa.E = E;
  pa.tile_n = static_cast<int>(tile_n);
  pa.rank = meta;
  pa.chunk_base = pa.rank + 2 * slots;
  pa.offsets = pa.chunk_base + plan_chunks(slots) * E;
  pa.pair_e = pa.offsets + E;
  pa.pair_start = pa.pair_e + max_pairs;
  pa.pair_rows = pa.pair_start + max_pairs;
  pa.num_pairs = pa.pair_rows + max_pairs;
  return pa;
}

// The routing (when logits is not null: fused into the plan's single block up to kFusedRouteMaxT
// tokens, else route_topk's kernel first) and the plan, `times` times (idempotent).
void run_plan(cudaStream_t s, PlanArgs pa, const float* logits, int times) {
  const int64_t chunks = plan_chunks(pa.T * pa.k);
  if (logits && (pa.T > kFusedRouteMaxT || chunks > 1)) {
    launch_route_topk(s, pa.weights, pa.ids, logits, pa.T, pa.E, pa.k);
  } else {
    pa.logits = logits;
  }
  const int64_t plan_smem = plan_smem_bytes(pa.E);
  static int64_t plan_allowed = 0;
  allow_smem(moe_plan_rank_kernel, plan_smem, plan_allowed);
  for (int i = 0; i < times; ++i) {
    launch_with_pdl(moe_plan_rank_kernel, static_cast<unsigned>(chunks), kPlanThreads, plan_smem, s, pa);
    if (chunks > 1) {
      moe_plan_offsets_kernel<<<1, kPlanThreads, 0, s>>>(pa, chunks);
      CUDA_CHECK_LAUNCH();
    }
  }
}

// moe_grouped with each launch repeated 1 + ((repeat >> stage) & 1) times (stages: 0 plan, 1 prepare,
// 2 gate_up, 3 down, 4 combine; every stage is idempotent) and the tile regime forced when
// force_tile >= 0: moe_grouped itself, and the kernel benchmark's per-stage timing by differences.
void moe_grouped_impl(CudaBackend& b, float* out, const float* x, int32_t* ids, float* weights, const float* logits,
                      int64_t T, int64_t k, const Linear& gate_up, const Linear& down, int repeat, int force_tile) {
  if (T == 0) return;
  const int64_t H = gate_up.in_features, I = down.in_features, E = gate_up.weight.dim(0), P = gate_up.partitions;
  const int64_t slots = T * k;
  const auto moe_takes = [&](GroupTile t) { return moe_shapes_take(gate_up, down, t); };
  const GroupTile tile =
      force_tile >= 0 ? static_cast<GroupTile>(force_tile)
                      : pick_tile(static_cast<double>(slots) / static_cast<double>(E), kMoeSliceMaxRows,
                                  kMoeMediumMaxRows,
                                  moe_small_tile(gate_up, down, static_cast<double>(slots) / static_cast<double>(E)),
                                  moe_takes);
  const int64_t tn = group_tile_n(tile);
  const int64_t max_pairs = std::min(slots, (slots + tn - 1) / tn + E);
  const cudaStream_t s = b.stream();
  auto times = [&](int stage) { return 1 + ((repeat >> stage) & 1); };

  const int64_t chunks = plan_chunks(slots);
  CudaBackend::Scratch meta(&b, plan_meta_bytes(T, k, E, max_pairs));
  const PlanArgs pa = plan_args(meta.as<int32_t>(), ids, weights, T, k, E, tn, max_pairs);
  int32_t* slot_of = pa.rank + slots;
  run_plan(s, pa, logits, times(0));

  CudaBackend::Scratch xq(&b, static_cast<size_t>(slots * P * H) * 2);
  PrepareArgs pr = prepare_args(gate_up, x, xq.as<__half>());
  pr.k = k;
  pr.ids = ids;
  pr.rank = pa.rank;
  pr.chunk_base = pa.chunk_base;
  pr.offsets = pa.offsets;
  pr.slot_of = slot_of;
  pr.E = E;
  pr.spb = slots <= 4096 ? 1 : k;
  pr.chunk_major = tile == GroupTile::kSliceN || tile == GroupTile::kSliceNHalf;
  for (int i = 0; i < times(1); ++i) {
    prepare_rows_kernel<<<dim3(static_cast<unsigned>(T), static_cast<unsigned>(k / pr.spb)), prep_threads(H), 0, s>>>(pr);
    CUDA_CHECK_LAUNCH();
  }

  CudaBackend::Scratch act(&b, static_cast<size_t>(slots * I) * 2);
  GroupGemmArgs gu = gemm_args(gate_up, xq.as<__half>());
  set_pairs(gu, pa, max_pairs);
  gu.gate_up = true;
  gu.act = act.as<__half>();
  gu.act_in_scale = static_cast<const float*>(down.input_scale.data);
  gu.act_modelopt = down.format == WeightFormat::kNvfp4ModelOpt;
  for (int i = 0; i < times(2); ++i) launch_group_gemm(b, gu, tile);

  CudaBackend::Scratch y(&b, static_cast<size_t>(slots * H) * 4);
  GroupGemmArgs dn = gemm_args(down, act.as<__half>());
  set_pairs(dn, pa, max_pairs);
  dn.out_row = slot_of;
  dn.out = y.as<float>();
  dn.ldo = H;
  for (int i = 0; i < times(3); ++i) launch_group_gemm(b, dn, tile);

  for (int i = 0; i < times(4); ++i) {
    combine_kernel<<<dim3(static_cast<unsigned>(T), static_cast<unsigned>((H + kCombineCols - 1) / kCombineCols)), 256,
                     0, s>>>(out, y.as<const float>(), ids, weights, k, H);
    CUDA_CHECK_LAUNCH();
  }
}

bool grouped_linear_impl(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w, int64_t min_rows,
                         int force_tile) {
  if (T < std::max<int64_t>(1, min_rows) || !aligned16(x) || w.in_features > kMaxPreparedK) return false;
  // Large-N tiles only with at least one work item per 4 SMs (no split-K: a narrow layer at a few
  // dozen tokens leaves most SMs idle; measured: out_proj 3072 rows at T = 64 has 12 items, 156 us
  // against the small-N kernel's 55; at T = 512, 48 items, 202 against 331; in_proj_qkv at T = 64,
  // 48 items, 59 against 67).
  const auto takes = [&](GroupTile t) {
    const int64_t items = (w.out_features / group_tile_m(t)) * ((T + group_tile_n(t) - 1) / group_tile_n(t));
    return group_tile_fits(t) && group_gemm_takes(w, t, false) && 4 * items >= static_cast<int64_t>(b.sm_count());
  };
  const GroupTile tile = force_tile >= 0 ? static_cast<GroupTile>(force_tile)
                                         : pick_tile(static_cast<double>(T), kSmallNMaxRows, 0.0, GroupTile::kSmallN, takes);
  if (!group_tile_fits(tile) || !group_gemm_takes(w, tile, false)) return false;
  const int64_t P = w.partitions, K = w.in_features;
  CudaBackend::Scratch xq(&b, static_cast<size_t>(T * P * K) * 2);
  PrepareArgs pr = prepare_args(w, x, xq.as<__half>());
  pr.chunk_major = tile == GroupTile::kSliceN || tile == GroupTile::kSliceNHalf;
  prepare_rows_kernel<<<static_cast<unsigned>(T), prep_threads(K), 0, b.stream()>>>(pr);
  CUDA_CHECK_LAUNCH();
  GroupGemmArgs g = gemm_args(w, xq.as<__half>());
  g.dense_rows = T;
  g.out = out;
  g.ldo = w.out_features;
  launch_group_gemm(b, g, tile);
  return true;
}

}  // namespace

bool moe_grouped_takes(const Linear& gate_up, const Linear& down, int64_t k) {
  const int64_t E = gate_up.weight.dim(0);
  if (k < 1 || k > kMaxPerToken || E < 1 || E > kMaxExperts || down.weight.dim(0) != E) return false;
  if (gate_up.format != down.format || !(gate_up.partitions == 1 || gate_up.partitions == 2)) return false;
  if (down.partitions != 1 || gate_up.out_features != 2 * down.in_features) return false;
  if (down.out_features != gate_up.in_features || gate_up.in_features > kMaxPreparedK) return false;
  return moe_shapes_take(gate_up, down, GroupTile::kSmallN);
}

void moe_grouped(CudaBackend& b, float* out, const float* x, int32_t* ids, float* weights, const float* router_logits,
                 int64_t T, int64_t k, const Linear& gate_up, const Linear& down) {
  CHECK_MSG(aligned16(x), "moe_grouped: x must be 16-byte aligned");
  moe_grouped_impl(b, out, x, ids, weights, router_logits, T, k, gate_up, down, 0, -1);
}

bool grouped_nvfp4_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w) {
  return grouped_linear_impl(b, out, x, T, w, kGroupedLinearMinRows, -1);
}

// For the kernel benchmark and checks only (tests/gpu/moe_grouped_{bench,checks}.cpp declare them: they
// are built without nvcc). The grouped MoE with stage repeats and a forced tile (see moe_grouped_impl; force_tile -1:
// moe_grouped's choice), and the dense path at any T; false when `b` is not the CUDA backend or the
// layout is not taken.
bool moe_grouped_probe(Backend& b, const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                       const Linear& gate_up, const Linear& down, int repeat, int force_tile) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c || !moe_grouped_takes(gate_up, down, ids.dim(1))) return false;
  if (force_tile >= 0 && !moe_shapes_take(gate_up, down, static_cast<GroupTile>(force_tile))) return false;
  moe_grouped_impl(*c, out.ptr<float>(), x.ptr<const float>(), ids.ptr<int32_t>(), weights.ptr<float>(), nullptr,
                   x.dim(0), ids.dim(1), gate_up, down, repeat, force_tile);
  return true;
}
// The plan alone (for the checks and the benchmark): ids [T, k] i32 (with logits [T, E] f32: written,
// with weights [T, k], by the routing, fused as moe_grouped runs it), tile_n rows per pair at most,
// run `times` times; false when `b` is not the CUDA backend or E, k exceed the plan's limits. With
// `out` (null when timing) the results come back to the host: rank [T k], chunk_base [chunks, E],
// offsets [E], pairs [3 num_pairs] as (expert, first row, rows).
bool moe_plan_probe(Backend& b, const Tensor& ids, const Tensor& weights, const Tensor* logits, int64_t E, int tile_n,
                    int times, MoePlanHost* out) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  const int64_t T = ids.dim(0), k = ids.dim(1), slots = T * k;
  if (!c || k < 1 || k > kMaxPerToken || E < 1 || E > kMaxExperts || tile_n < 1 || slots == 0) return false;
  const int64_t max_pairs = std::min(slots, (slots + tile_n - 1) / tile_n + E);
  CudaBackend::Scratch meta(c, plan_meta_bytes(T, k, E, max_pairs));
  const PlanArgs pa = plan_args(meta.as<int32_t>(), ids.ptr<int32_t>(), weights.ptr<float>(), T, k, E, tile_n, max_pairs);
  run_plan(c->stream(), pa, logits ? logits->ptr<const float>() : nullptr, times);
  if (!out) return true;
  const int64_t chunks = plan_chunks(slots);
  std::vector<int32_t> meta_h(plan_meta_bytes(T, k, E, max_pairs) / 4);
  CUDA_CHECK(cudaMemcpyAsync(meta_h.data(), meta.ptr, meta_h.size() * 4, cudaMemcpyDeviceToHost, c->stream()));
  CUDA_CHECK(cudaStreamSynchronize(c->stream()));
  const auto at = [&](const int32_t* p) { return meta_h.begin() + (p - pa.rank); };
  out->rank.assign(at(pa.rank), at(pa.rank) + slots);
  out->chunk_base.assign(at(pa.chunk_base), at(pa.chunk_base) + chunks * E);
  out->offsets.assign(at(pa.offsets), at(pa.offsets) + E);
  const int32_t np = *at(pa.num_pairs);
  out->pairs.clear();
  for (int32_t i = 0; i < np && i < max_pairs; ++i)
    for (const int32_t* p : {pa.pair_e, pa.pair_start, pa.pair_rows}) out->pairs.push_back(*at(p + i));
  return true;
}
bool grouped_linear_probe(Backend& b, const Tensor& out, const Tensor& x, const Linear& w, int force_tile) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  const int64_t T = w.in_features == 0 ? 0 : x.numel() / w.in_features;
  return c && grouped_linear_impl(*c, out.ptr<float>(), x.ptr<const float>(), T, w, 1, force_tile);
}

namespace {
// Counts the floats x in [-6, 6] (every bit pattern) where e2m1_round(x) differs from the threshold
// table's value or sign of zero.
__global__ void e2m1_round_check_kernel(unsigned long long* mismatches) {
  constexpr uint32_t kLast = 0x40C00000u;  // 6.0f
  unsigned long long bad = 0;
  for (uint64_t b = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; b <= kLast;
       b += static_cast<uint64_t>(gridDim.x) * blockDim.x)
    for (uint32_t sign = 0; sign < 2; ++sign) {
      const float x = __uint_as_float(static_cast<uint32_t>(b) | (sign << 31));
      bad += __float_as_uint(e2m1_round(x)) != __float_as_uint(e2m1_value(f32_to_e2m1(x)));
    }
  if (bad) atomicAdd(mismatches, bad);
}
}  // namespace

int64_t e2m1_round_mismatches_probe(Backend& b) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) return -1;
  CudaBackend::Scratch n(c, 8);
  CUDA_CHECK(cudaMemsetAsync(n.ptr, 0, 8, c->stream()));
  e2m1_round_check_kernel<<<4 * c->sm_count(), 256, 0, c->stream()>>>(n.as<unsigned long long>());
  CUDA_CHECK_LAUNCH();
  unsigned long long v = 0;
  CUDA_CHECK(cudaMemcpyAsync(&v, n.ptr, 8, cudaMemcpyDeviceToHost, c->stream()));
  CUDA_CHECK(cudaStreamSynchronize(c->stream()));
  return static_cast<int64_t>(v);
}

}  // namespace sparkserve
