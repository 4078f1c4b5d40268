// Grouped NVFP4 W4A4 GEMM, streamed small-N regime (nvfp4_group_gemm.h, GroupTile::kStreamN): up to 16
// activation rows per work pair (batched decode: a few tokens per routed expert). Memory-bound: every
// touched expert's weights must come from HBM once per call, so a producer warp streams them into a
// ring of shared-memory stages with the copy engine (cp.async.bulk, completing on an mbarrier) while 8
// consumer warps decode them into exact fp16 mma operands (nvfp4_group_common.cuh) and run mma.sync
// m16n8k16 with the tokens as N. Two CTAs per SM (96 registers), so 16 consumer warps hide each
// other's latencies: measured on the H200 with one CTA (8 warps), the consumers issued an instruction
// every ~5.6 cycles each and bounded the kernel at ~2.1 TB/s while its loads alone ran at 3.3-4.4.
//
// Work: an item is one work pair x one weight row group over the whole K, and one ring stage holds one
// item: gate_up 16 gate rows and the matching 16 up rows (one 16-block of the down input for the
// epilogue; 2 m16 tiles x 4 K parts of the 8 warps), plain 64 consecutive rows (4 tiles x 2 K parts).
// Rows of an expert are contiguous in memory, so a stage is 2 (plain) or 4 (gate_up: gate rows, up
// rows, their block scales) bulk copies: a cp.async.bulk costs the copy engine ~80 cycles whatever its
// size (measured: copies of one row piece each capped the kernel at ~0.5-0.9 TB/s). Items are dealt
// to the persistent CTAs in contiguous ranges, row group fastest, so a pair's activation rows stay in
// L1. A warp owns one m16 tile of the item and one K part (the 128-k chunks p, p + parts, ...); at the
// item's end the parts' sums meet over the consumed stage and are added in part order (deterministic)
// by the warps that run the epilogues.
// Shared memory of a stage: [rows][K/2] payload, then [rows][K/16] block scales (as in global memory).
#include <cuda.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/nvfp4_group_common.cuh"
#include "backend/cuda/nvfp4_group_gemm.h"

namespace sparkserve {
namespace {

constexpr int kChunk = 128;          // k per chunk: 64 payload bytes and 8 block scales per row
constexpr int kMaxStages = 4;
constexpr int kMaxWarpChunks = 8;    // chunks per warp per item at most (gate_up K <= 4096, plain K <= 2048)
constexpr int kPairRows = 16;        // activation rows per work pair: 2 n8 column tiles
constexpr int kColTiles = kPairRows / 8;
// K parts per item: the warps split an item's K into 4 (gate_up) / 2 (plain) parts, and each part's
// warps hold kWarps / parts m16 tiles: gate_up half gate tiles, half the matching up tiles (8 warps:
// 16 gate rows, one 16-block of the down input), plain consecutive rows (8 warps: 64 rows).
constexpr int kGateUpParts = 4, kPlainParts = 2;
constexpr int kRingOffset = 128;     // the mbarriers first
// The K parts' sums, written over the consumed stage: [warp][column tile][register][lane].
constexpr int partial_bytes(int warps) { return warps * kColTiles * 4 * 32 * 4; }
// Consumer warps per CTA and CTAs per SM: 8 warps in 2 CTAs (96 registers), or 16 in one (120 registers,
// one pair's activations shared by all 16 warps in L1).
constexpr int min_blocks(int warps) { return warps == 8 ? 2 : 1; }

struct StreamShape {
  int warps;            // consumer warps per CTA (8 or 16)
  int blocks_per_sm;
  int rows;             // weight rows per item (= per stage)
  int rb, sb;           // payload / block-scale bytes per row: K/2, K/16
  int stage_bytes;
  int num_stages;       // ring depth
  int items_per_pair;   // weight row groups of a matrix
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
  } while (!done);
}
// bytes (a multiple of 16, both addresses 16-byte aligned) global -> shared by the copy engine, counted
// on bar; the weights are read once per call, so they are the first out of L2.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          smem_addr(dst)),
      "l"(src), "r"(bytes), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}
// Programmatic dependent launch (PTX griddepcontrol, sm_90+; no-ops for launches that did not ask for
// it): launch_dependents lets the stream's next kernel be scheduled onto SMs this grid frees (the down
// GEMM's weight stream starts under the gate_up GEMM's tail); wait blocks until the previous kernel has
// completed and its writes are visible. Only the consumers wait: the producer reads the work pairs
// (written before the previous kernel started) and the weights.
__device__ __forceinline__ void pdl_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// The consumer warps only (named barrier 1; the producer does not take part).
template <int kWarps>
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kWarps * 32) : "memory"); }

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// The next item of a CTA's range: row group mg of work pair `pair` (items run row-group-fastest, so a
// pair's list entries are read once per pair).
struct ItemCursor {
  int pair, mg;
  __device__ __forceinline__ bool advance(int items_per_pair) {  // true when the pair changes
    if (++mg < items_per_pair) return false;
    mg = 0;
    ++pair;
    return true;
  }
};

// The producer warp (one lane issues): for each item, waits until the consumers released the ring slot,
// then copies the item's rows: gate_up its 16 gate rows, the 16 up rows and the two rows' block scales;
// plain its rows and their block scales (each a contiguous run in global memory).
__device__ __forceinline__ void produce(const GroupGemmArgs& a, const StreamShape& sh, uint8_t* ring, uint64_t* full,
                                        uint64_t* empty, int first, int last) {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  ItemCursor cur{first / sh.items_per_pair, first % sh.items_per_pair};
  int64_t e = first < last ? work_pair(a, cur.pair, kPairRows).e : 0;
  uint32_t seq = 0, slot = 0, phase = 0;
  for (int item = first; item < last; ++item, ++seq) {
    if (seq >= static_cast<uint32_t>(sh.num_stages)) mbar_wait(&empty[slot], phase ^ 1u);
    uint8_t* st = ring + slot * sh.stage_bytes;
    uint64_t* bar = &full[slot];
    if (a.gate_up) {
      mbar_arrive_expect_tx(bar, static_cast<uint32_t>(sh.rows * (sh.rb + sh.sb)));
      const int half = sh.rows / 2;
      const int64_t gate = e * a.M + static_cast<int64_t>(cur.mg) * half, up = gate + a.M / 2;
      bulk_copy(st, a.w + gate * sh.rb, half * sh.rb, bar, policy);
      bulk_copy(st + half * sh.rb, a.w + up * sh.rb, half * sh.rb, bar, policy);
      bulk_copy(st + sh.rows * sh.rb, a.ws + gate * sh.sb, half * sh.sb, bar, policy);
      bulk_copy(st + sh.rows * sh.rb + half * sh.sb, a.ws + up * sh.sb, half * sh.sb, bar, policy);
    } else {
      mbar_arrive_expect_tx(bar, static_cast<uint32_t>(sh.rows * (sh.rb + sh.sb)));
      const int64_t row = e * a.M + static_cast<int64_t>(cur.mg) * sh.rows;
      bulk_copy(st, a.w + row * sh.rb, sh.rows * sh.rb, bar, policy);
      bulk_copy(st + sh.rows * sh.rb, a.ws + row * sh.sb, sh.rows * sh.sb, bar, policy);
    }
    if (++slot == static_cast<uint32_t>(sh.num_stages)) {
      slot = 0;
      phase ^= 1u;
    }
    if (cur.advance(sh.items_per_pair) && item + 1 < last) e = work_pair(a, cur.pair, kPairRows).e;
  }
}

// This lane's operands of one 128-k chunk of its m16 tile: 16 payload bytes of rows g (q0) and g + 8
// (q1) and their two block scales (s0, s1).
struct ChunkOps {
  uint4 q0, q1;
  uint32_t s0, s1;
};
__device__ __forceinline__ ChunkOps load_chunk(const uint8_t* w, int w8, const uint8_t* sc, int s8) {
  return {*reinterpret_cast<const uint4*>(w), *reinterpret_cast<const uint4*>(w + w8),
          *reinterpret_cast<const unsigned short*>(sc), *reinterpret_cast<const unsigned short*>(sc + s8)};
}

// One chunk against the n8 column tiles 0 .. kN - 1: x[j] + koff is this lane's 32 activation values of
// the chunk for column 8j + g (prepared layout). With one tile, words 0, 2 accumulate into acc[0] and
// words 1, 3 into acc[1] (two dependency chains); with two, acc[j] is tile j's.
template <int kN>
__device__ __forceinline__ void chunk_mma(float (&acc)[2][4], const ChunkOps& op, const __half* const (&x)[kColTiles],
                                          int koff) {
  const __half2 h0 = e4m3x2_to_half2(op.s0 & 0xffu, op.s0 >> 8), h1 = e4m3x2_to_half2(op.s1 & 0xffu, op.s1 >> 8);
  const __half2 sc0[2] = {__low2half2(h0), __high2half2(h0)}, sc1[2] = {__low2half2(h1), __high2half2(h1)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint4 b[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j) b[j] = __ldg(reinterpret_cast<const uint4*>(x[j] + koff) + i);
    uint32_t fa[4];
    decode_a<0>(word(op.q0, i), word(op.q1, i), sc0[i / 2], sc1[i / 2], fa);
#pragma unroll
    for (int j = 0; j < kN; ++j) mma16816(acc[kN == 1 ? i % 2 : j], fa, b[j].x, b[j].y);
    decode_a<1>(word(op.q0, i), word(op.q1, i), sc0[i / 2], sc1[i / 2], fa);
#pragma unroll
    for (int j = 0; j < kN; ++j) mma16816(acc[kN == 1 ? i % 2 : j], fa, b[j].z, b[j].w);
  }
}

// The chunks part, part + kParts, ... of an item's stage for a warp whose item has kN column tiles;
// the sums of column tile j land in acc[j].
template <int kParts, int kN>
__device__ __forceinline__ void item_chunks(float (&acc)[2][4], const uint8_t* w, int w8, const uint8_t* sc, int s8,
                                            const __half* const (&x)[kColTiles], int chunks, int part) {
#pragma unroll
  for (int i = 0; i < kMaxWarpChunks; ++i) {
    if (part + i * kParts >= chunks) break;
    chunk_mma<kN>(acc, load_chunk(w + i * (kParts * 64), w8, sc + i * (kParts * 8), s8), x, i * (kParts * kChunk));
  }
  if constexpr (kN == 1) {
#pragma unroll
    for (int r = 0; r < 4; ++r) acc[0][r] += acc[1][r];
  }
}

// The consumer warps. Warp w owns m16 tile w % kNT of each item (gate_up: tile 0 the gate rows, tile 1
// the matching up rows) and the chunks w / kNT, w / kNT + kParts, ... of its K. At the item's end the
// warps' sums meet over the consumed stage and are added in part order (deterministic) by the warps
// that run the epilogues, then the stage is released.
template <bool kGateUp, int kWarps>
__device__ __forceinline__ void consume(const GroupGemmArgs& a, const StreamShape& sh, uint8_t* ring, uint64_t* full,
                                        uint64_t* empty, int first, int last, int warp, int lane) {
  constexpr int kParts = kGateUp ? kGateUpParts : kPlainParts, kNT = kWarps / kParts, kHalf = kNT / 2;
  const int g = lane / 4, t = lane % 4, mt = warp % kNT, part = warp / kNT;
  const int64_t K = a.K, M = a.M;
  const int Mp = static_cast<int>(M / a.P), chunks = static_cast<int>(K / kChunk);
  // This lane's payload / block-scale bytes within a stage (row 16 mt + g, first chunk `part`).
  const int w_off = (16 * mt + g) * sh.rb + 16 * t + 64 * part, w8 = 8 * sh.rb;
  const int s_off = sh.rows * sh.rb + (16 * mt + g) * sh.sb + 2 * t + 8 * part, s8 = 8 * sh.sb;
  ItemCursor cur{first / sh.items_per_pair, first % sh.items_per_pair};
  WorkPair wp = first < last ? work_pair(a, cur.pair, kPairRows) : WorkPair{};
  pdl_wait();  // the activations (and the down GEMM's output rows) come from the previous kernels
  uint32_t slot = 0, phase = 0;
  for (int item = first; item < last; ++item) {
    const int mg = cur.mg, rows = wp.rows, nt = (rows + 7) / 8;
    const int64_t e = wp.e, start = wp.start;
    // This warp's tile: its first weight row and the activation partition its B operand reads.
    const int64_t row0 = kGateUp ? (mt < kHalf ? 0 : M / 2) + static_cast<int64_t>(mg) * (sh.rows / 2) + 16 * (mt % kHalf)
                                 : static_cast<int64_t>(mg) * sh.rows + 16 * mt;
    const int wpart = kGateUp ? (mt < kHalf ? 0 : a.P - 1) : static_cast<int>(row0) / Mp;
    const int rp = read_partition(a.in_scale, e, a.P, wpart);
    // Column 8j + g's activation row (padding columns repeat the last row; their outputs are dropped).
    const __half* x[kColTiles];
#pragma unroll
    for (int j = 0; j < kColTiles; ++j)
      x[j] = a.xq + ((start + min(8 * j + g, rows - 1)) * a.P + rp) * K + 32 * t + kChunk * part;
    WorkPair next = wp;  // the next item's pair, loaded while this item runs
    if (cur.advance(sh.items_per_pair) && item + 1 < last) next = work_pair(a, cur.pair, kPairRows);
    mbar_wait(&full[slot], phase);
    uint8_t* st = ring + slot * sh.stage_bytes;
    float acc[2][4] = {};
    if (nt == 1)
      item_chunks<kParts, 1>(acc, st + w_off, w8, st + s_off, s8, x, chunks, part);
    else
      item_chunks<kParts, 2>(acc, st + w_off, w8, st + s_off, s8, x, chunks, part);
    consumer_sync<kWarps>();  // every warp is done with the stage's weights
    float* partial = reinterpret_cast<float*>(st);
#pragma unroll
    for (int j = 0; j < kColTiles; ++j)
      if (j < nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) partial[((warp * kColTiles + j) * 4 + r) * 32 + lane] = acc[j][r];
    consumer_sync<kWarps>();
    // The epilogue jobs (gate_up: per column tile; plain: per m16 tile and column tile), dealt to the
    // warps in an order that rotates with the item. The K parts of a tile are added in part order.
    auto sum_parts = [&](int tile, int j, float (&out)[1][4]) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        float v = 0.0f;
#pragma unroll
        for (int p = 0; p < kParts; ++p) v += partial[(((tile + kNT * p) * kColTiles + j) * 4 + r) * 32 + lane];
        out[0][r] = v;
      }
    };
    const int jobs = (kGateUp ? kHalf : kNT) * nt;
    const int job = (warp + kWarps - item % kWarps) % kWarps;
    if (job < jobs) {
      if constexpr (kGateUp) {
        const int tile = job % kHalf, j = job / kHalf;
        float gate[1][4], up[1][4];
        sum_parts(tile, j, gate);
        sum_parts(tile + kHalf, j, up);
        const float d_in = a.act_in_scale[e];
        const float fg = global_factor(a.w_global[e * a.P], a.in_scale[e * a.P], a.modelopt);
        const float fu = global_factor(a.w_global[e * a.P + a.P - 1], a.in_scale[e * a.P + a.P - 1], a.modelopt);
        store_gate_up<1>(gate, up, fg, fu, a.act_modelopt ? 1.0f / d_in : d_in, a.act, M / 2, start,
                         static_cast<int64_t>(mg) * (sh.rows / 2) + 16 * tile, 8 * j, rows, g, t);
      } else {
        const int tile = job % kNT, j = job / kNT;
        float v[1][4];
        sum_parts(tile, j, v);
        const int64_t r0 = static_cast<int64_t>(mg) * sh.rows + 16 * tile;
        const int p = static_cast<int>(r0) / Mp;
        const float f = global_factor(a.w_global[e * a.P + p], a.in_scale[e * a.P + p], a.modelopt);
        store_plain<1>(v, f, a.out, a.ldo, a.out_row, start, r0, 8 * j, rows, g, t);
      }
    }
    // The copy engine refills the stage next: order this warp's writes of it before that (proxy fence).
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[slot]);
    if (++slot == static_cast<uint32_t>(sh.num_stages)) {
      slot = 0;
      phase ^= 1u;
    }
    wp = next;
  }
}

template <bool kGateUp, int kWarps>
__global__ void __launch_bounds__((kWarps + 1) * 32, min_blocks(kWarps))
    group_stream_kernel(const GroupGemmArgs a, const StreamShape sh) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kMaxStages;
  uint8_t* ring = smem + kRingOffset;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  pdl_launch_dependents();
  if (threadIdx.x == 0) {
    for (int s = 0; s < sh.num_stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int64_t items = num_work_pairs(a, kPairRows) * sh.items_per_pair;  // < 2^31: launch() checks
  const int first = static_cast<int>(blockIdx.x * items / gridDim.x);
  const int last = static_cast<int>((blockIdx.x + 1) * items / gridDim.x);
  if (warp == kWarps) {
    if (lane == 0) produce(a, sh, ring, full, empty, first, last);
  } else {
    consume<kGateUp, kWarps>(a, sh, ring, full, empty, first, last, warp, lane);
  }
}

// ---- K-sliced variant (DIAGNOSTIC round A): an item is a work pair x 128 gate rows + their 128 up rows
// (plain: 256 rows), a stage one 256-k slice of the item's rows (2-D TMA boxes), each warp owns two m16
// tiles (gate + matching up, or two consecutive) over the whole K: accumulators live across the item's
// stages, no cross-warp reduction, no consumer barrier; the two tiles share their activation loads.
constexpr int kSliceK = 256, kSliceBytes = kSliceK / 2, kSliceScales = kSliceK / 16;
constexpr int kSliceWarps = 8, kSliceRows = kSliceWarps * 32;  // 256 weight rows per item and stage
constexpr int kSliceStageBytes = kSliceRows * (kSliceBytes + kSliceScales);  // 36,864

__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int c0, int c1, uint64_t* bar,
                                            uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%2, "
      "%3}], [%4], %5;" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(smem_addr(bar)), "l"(policy)
      : "memory");
}

struct SliceShape {
  int num_stages, slices, items_per_pair;
};

// Producer: per item and slice, the payload boxes (gate_up: 128 gate rows, 128 up rows; plain 256 rows)
// of 128 bytes and their scale boxes of 16 bytes.
template <bool kGateUp>
__device__ __forceinline__ void slice_produce(const GroupGemmArgs& a, const SliceShape& sh, const CUtensorMap* wmap,
                                              const CUtensorMap* smap, uint8_t* ring, uint64_t* full, uint64_t* empty,
                                              int first, int last) {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  uint32_t seq = 0, slot = 0, phase = 0;
  for (int item = first; item < last; ++item) {
    const int pair = item / sh.items_per_pair, mg = item % sh.items_per_pair;
    const int64_t e = work_pair(a, pair, kPairRows).e;
    for (int s = 0; s < sh.slices; ++s, ++seq) {
      if (seq >= static_cast<uint32_t>(sh.num_stages)) mbar_wait(&empty[slot], phase ^ 1u);
      uint8_t* st = ring + slot * kSliceStageBytes;
      uint64_t* bar = &full[slot];
      mbar_arrive_expect_tx(bar, kSliceStageBytes);
      if (kGateUp) {
        const int gate = static_cast<int>(e * a.M + static_cast<int64_t>(mg) * (kSliceRows / 2));
        const int up = gate + static_cast<int>(a.M / 2);
        tma_load_2d(st, wmap, s * kSliceBytes, gate, bar, policy);
        tma_load_2d(st + (kSliceRows / 2) * kSliceBytes, wmap, s * kSliceBytes, up, bar, policy);
        tma_load_2d(st + kSliceRows * kSliceBytes, smap, s * kSliceScales, gate, bar, policy);
        tma_load_2d(st + kSliceRows * kSliceBytes + (kSliceRows / 2) * kSliceScales, smap, s * kSliceScales, up, bar,
                    policy);
      } else {
        const int row = static_cast<int>(e * a.M + static_cast<int64_t>(mg) * kSliceRows);
        tma_load_2d(st, wmap, s * kSliceBytes, row, bar, policy);
        tma_load_2d(st + kSliceRows * kSliceBytes, smap, s * kSliceScales, row, bar, policy);
      }
      if (++slot == static_cast<uint32_t>(sh.num_stages)) {
        slot = 0;
        phase ^= 1u;
      }
    }
  }
}

// One 128-k chunk of both of a warp's tiles (A operands from the stage, rows 16 tile + g and + 8) against
// kN n8 column tiles; xa / xb: tile 0's / tile 1's activation pointers (equal when they share them).
template <int kN>
__device__ __forceinline__ void slice_chunk(float (&acc)[2][2][4], const uint8_t* w0, const uint8_t* w1,
                                            const uint8_t* s0p, const uint8_t* s1p, const __half* const (&xa)[kColTiles],
                                            const __half* const (&xb)[kColTiles], bool shared_x, int koff) {
  const ChunkOps o0 = load_chunk(w0, 8 * kSliceBytes, s0p, 8 * kSliceScales);
  const ChunkOps o1 = load_chunk(w1, 8 * kSliceBytes, s1p, 8 * kSliceScales);
  const __half2 h00 = e4m3x2_to_half2(o0.s0 & 0xffu, o0.s0 >> 8), h01 = e4m3x2_to_half2(o0.s1 & 0xffu, o0.s1 >> 8);
  const __half2 h10 = e4m3x2_to_half2(o1.s0 & 0xffu, o1.s0 >> 8), h11 = e4m3x2_to_half2(o1.s1 & 0xffu, o1.s1 >> 8);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint4 ba[kN], bb[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      ba[j] = __ldg(reinterpret_cast<const uint4*>(xa[j] + koff) + i);
      bb[j] = shared_x ? ba[j] : __ldg(reinterpret_cast<const uint4*>(xb[j] + koff) + i);
    }
    const __half2 sa0 = i / 2 ? __high2half2(h00) : __low2half2(h00), sa1 = i / 2 ? __high2half2(h01) : __low2half2(h01);
    const __half2 sb0 = i / 2 ? __high2half2(h10) : __low2half2(h10), sb1 = i / 2 ? __high2half2(h11) : __low2half2(h11);
    uint32_t fa[4], fb[4];
    decode_a<0>(word(o0.q0, i), word(o0.q1, i), sa0, sa1, fa);
    decode_a<0>(word(o1.q0, i), word(o1.q1, i), sb0, sb1, fb);
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      mma16816(acc[0][j], fa, ba[j].x, ba[j].y);
      mma16816(acc[1][j], fb, bb[j].x, bb[j].y);
    }
    decode_a<1>(word(o0.q0, i), word(o0.q1, i), sa0, sa1, fa);
    decode_a<1>(word(o1.q0, i), word(o1.q1, i), sb0, sb1, fb);
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      mma16816(acc[0][j], fa, ba[j].z, ba[j].w);
      mma16816(acc[1][j], fb, bb[j].z, bb[j].w);
    }
  }
}

template <bool kGateUp, int kN>
__device__ __forceinline__ void slice_item(float (&acc)[2][2][4], const SliceShape& sh, uint8_t* ring, uint64_t* full,
                                           uint64_t* empty, uint32_t& slot, uint32_t& phase,
                                           const __half* const (&xa)[kColTiles], const __half* const (&xb)[kColTiles],
                                           bool shared_x, int warp, int lane) {
  const int g = lane / 4, t = lane % 4;
  // Stage rows of this warp's tiles: gate_up 16 warp + g (gate) and 128 + 16 warp + g (up); plain 32 warp + g, + 16.
  const int r0 = 16 * (kGateUp ? warp : 2 * warp) + g, r1 = kGateUp ? kSliceRows / 2 + 16 * warp + g : r0 + 16;
  for (int s = 0; s < sh.slices; ++s) {
    mbar_wait(&full[slot], phase);
    const uint8_t* st = ring + slot * kSliceStageBytes;
    const uint8_t* sc = st + kSliceRows * kSliceBytes;
#pragma unroll
    for (int c = 0; c < kSliceK / kChunk; ++c)
      slice_chunk<kN>(acc, st + r0 * kSliceBytes + 64 * c + 16 * t, st + r1 * kSliceBytes + 64 * c + 16 * t,
                      sc + r0 * kSliceScales + 8 * c + 2 * t, sc + r1 * kSliceScales + 8 * c + 2 * t, xa, xb, shared_x,
                      s * kSliceK + c * kChunk);
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[slot]);
    if (++slot == static_cast<uint32_t>(sh.num_stages)) {
      slot = 0;
      phase ^= 1u;
    }
  }
}

template <bool kGateUp>
__device__ __forceinline__ void slice_consume(const GroupGemmArgs& a, const SliceShape& sh, uint8_t* ring,
                                              uint64_t* full, uint64_t* empty, int first, int last, int warp, int lane) {
  const int g = lane / 4, t = lane % 4;
  const int64_t K = a.K, M = a.M;
  const int Mp = static_cast<int>(M / a.P);
  pdl_wait();
  uint32_t slot = 0, phase = 0;
  for (int item = first; item < last; ++item) {
    const int pair = item / sh.items_per_pair, mg = item % sh.items_per_pair;
    const WorkPair wp = work_pair(a, pair, kPairRows);
    const int64_t e = wp.e, start = wp.start;
    const int rows = wp.rows, nt = (rows + 7) / 8;
    // Weight rows of the warp's tiles (tile 0: gate / first; tile 1: up / second) and their activation partitions.
    const int64_t row0 = kGateUp ? static_cast<int64_t>(mg) * (kSliceRows / 2) + 16 * warp
                                 : static_cast<int64_t>(mg) * kSliceRows + 32 * warp;
    const int rpa = read_partition(a.in_scale, e, a.P, kGateUp ? 0 : static_cast<int>(row0 / Mp));
    const int rpb = read_partition(a.in_scale, e, a.P, kGateUp ? a.P - 1 : static_cast<int>((row0 + 16) / Mp));
    const __half *xa[kColTiles], *xb[kColTiles];
#pragma unroll
    for (int j = 0; j < kColTiles; ++j) {
      const int64_t r = start + min(8 * j + g, rows - 1);
      xa[j] = a.xq + (r * a.P + rpa) * K + 32 * t;
      xb[j] = a.xq + (r * a.P + rpb) * K + 32 * t;
    }
    float acc[2][2][4] = {};
    if (nt == 1)
      slice_item<kGateUp, 1>(acc, sh, ring, full, empty, slot, phase, xa, xb, rpa == rpb, warp, lane);
    else
      slice_item<kGateUp, 2>(acc, sh, ring, full, empty, slot, phase, xa, xb, rpa == rpb, warp, lane);
    if constexpr (kGateUp) {
      const float d_in = a.act_in_scale[e];
      const float fg = global_factor(a.w_global[e * a.P], a.in_scale[e * a.P], a.modelopt);
      const float fu = global_factor(a.w_global[e * a.P + a.P - 1], a.in_scale[e * a.P + a.P - 1], a.modelopt);
      store_gate_up<2>(acc[0], acc[1], fg, fu, a.act_modelopt ? 1.0f / d_in : d_in, a.act, M / 2, start, row0, 0, rows,
                       g, t);
    } else {
#pragma unroll
      for (int tile = 0; tile < 2; ++tile) {
        const int64_t r = row0 + 16 * tile;
        const int p = static_cast<int>(r / Mp);
        const float f = global_factor(a.w_global[e * a.P + p], a.in_scale[e * a.P + p], a.modelopt);
        store_plain<2>(acc[tile], f, a.out, a.ldo, a.out_row, start, r, 0, rows, g, t);
      }
    }
  }
}

template <bool kGateUp>
__global__ void __launch_bounds__((kSliceWarps + 1) * 32, 2)
    group_slice_kernel(const GroupGemmArgs a, const SliceShape sh, const __grid_constant__ CUtensorMap wmap,
                       const __grid_constant__ CUtensorMap smap) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kMaxStages;
  uint8_t* ring = smem + kRingOffset;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  pdl_launch_dependents();
  if (threadIdx.x == 0) {
    for (int s = 0; s < sh.num_stages; ++s) {
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
    if (lane == 0) slice_produce<kGateUp>(a, sh, &wmap, &smap, ring, full, empty, first, last);
  } else {
    slice_consume<kGateUp>(a, sh, ring, full, empty, first, last, warp, lane);
  }
}

struct SmemLimits {
  int64_t optin, per_sm, reserved;  // per block (opt-in), per SM, reserved per block
};
const SmemLimits& smem_limits() {
  static const SmemLimits v = [] {
    int dev = 0, optin = 0, per_sm = 0, reserved = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev));
    return SmemLimits{optin, per_sm, reserved};
  }();
  return v;
}

// The stage (one item: its rows over the whole K, at least the partial sums' bytes) and the ring of
// `warps` consumer warps per CTA: (8 warps) 2 CTAs per SM where each gets 2 stages or more (sm_90: stages
// up to ~56 KB), else 1 CTA with the whole shared memory; (16 warps) 1 CTA. At most max_stages stages.
// blocks_per_sm 0: no ring of 2 stages fits (not taken).
StreamShape stream_shape(int64_t M, int64_t K, bool gate_up, int warps, int max_stages) {
  StreamShape sh{};
  sh.warps = warps;
  sh.rows = 16 * warps / (gate_up ? kGateUpParts : kPlainParts);
  sh.rb = static_cast<int>(K / 2);
  sh.sb = static_cast<int>(K / 16);
  sh.items_per_pair = static_cast<int>(M / sh.rows);
  sh.stage_bytes =
      static_cast<int>((std::max<int64_t>(sh.rows * (sh.rb + sh.sb), partial_bytes(warps)) + 127) / 128 * 128);
  const SmemLimits& l = smem_limits();
  for (int blocks = min_blocks(warps); blocks >= 1; --blocks) {
    const int64_t ring = std::min(l.optin, l.per_sm / blocks - l.reserved) - kRingOffset;
    sh.num_stages = static_cast<int>(std::min<int64_t>(max_stages, ring / sh.stage_bytes));
    sh.blocks_per_sm = blocks;
    if (sh.num_stages >= 2) return sh;
  }
  sh.blocks_per_sm = 0;
  return sh;
}

// DIAGNOSTIC (round A only, to be removed): SPARKSERVE_DIAG_STREAM="warps,stages" (e.g. "16,2").
struct StreamDiag {
  int warps = 8, stages = kMaxStages, sliced = 0;
};
const StreamDiag& stream_diag() {
  static const StreamDiag d = [] {
    StreamDiag v;
    if (const char* e = std::getenv("SPARKSERVE_DIAG_STREAM")) std::sscanf(e, "%d,%d,%d", &v.warps, &v.stages, &v.sliced);
    return v;
  }();
  return d;
}

template <bool kGateUp, int kWarps>
void launch(CudaBackend& b, const GroupGemmArgs& a, const StreamShape& sh) {
  CHECK_MSG(sh.blocks_per_sm > 0, "grouped NVFP4 stream kernel: shared memory too small");
  auto kern = group_stream_kernel<kGateUp, kWarps>;
  const int64_t smem = kRingOffset + static_cast<int64_t>(sh.num_stages) * sh.stage_bytes;
  static int64_t allowed = 0;
  allow_smem(kern, smem, allowed);
  const int64_t pairs = a.pair_e ? a.max_pairs : (a.dense_rows + kPairRows - 1) / kPairRows;
  CHECK(pairs * sh.items_per_pair < (int64_t{1} << 31));
  const int64_t grid = std::min<int64_t>(pairs * sh.items_per_pair, int64_t{sh.blocks_per_sm} * b.sm_count());
  if (grid <= 0) return;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3((kWarps + 1) * 32);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = b.stream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;  // the kernel waits (pdl_wait)
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, a, sh));
  CUDA_CHECK_LAUNCH();
}

// cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}
// Bytes [rows, cols] (row stride cols) in boxes of [box_rows, box_cols].
CUtensorMap byte_map(const void* p, int64_t rows, int64_t cols, int box_rows, int box_cols) {
  CUtensorMap m{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(p), dims, strides, box,
                                    elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  CHECK_MSG(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed");
  return m;
}

bool slice_takes(int64_t M, int64_t K, int64_t P, bool gate_up) {
  if (!encode_tiled() || K % kSliceK != 0) return false;
  if (gate_up ? (M / 2) % (kSliceRows / 2) != 0 : (M % kSliceRows != 0 || (M / P) % 32 != 0)) return false;
  const SmemLimits& l = smem_limits();
  return std::min(l.optin, l.per_sm / 2 - l.reserved) - kRingOffset >= 2 * kSliceStageBytes;
}

template <bool kGateUp>
void launch_slice(CudaBackend& b, const GroupGemmArgs& a, int max_stages, int64_t E) {
  const SmemLimits& l = smem_limits();
  SliceShape sh{};
  sh.num_stages = static_cast<int>(std::min<int64_t>(
      std::min(max_stages, kMaxStages), (std::min(l.optin, l.per_sm / 2 - l.reserved) - kRingOffset) / kSliceStageBytes));
  sh.slices = static_cast<int>(a.K / kSliceK);
  sh.items_per_pair = static_cast<int>(kGateUp ? (a.M / 2) / (kSliceRows / 2) : a.M / kSliceRows);
  const int box_rows = kGateUp ? kSliceRows / 2 : kSliceRows;
  const CUtensorMap wmap = byte_map(a.w, E * a.M, a.K / 2, box_rows, kSliceBytes);
  const CUtensorMap smap = byte_map(a.ws, E * a.M, a.K / 16, box_rows, kSliceScales);
  auto kern = group_slice_kernel<kGateUp>;
  const int64_t smem = kRingOffset + static_cast<int64_t>(sh.num_stages) * kSliceStageBytes;
  static int64_t allowed = 0;
  allow_smem(kern, smem, allowed);
  const int64_t grid = std::min<int64_t>(a.max_pairs * sh.items_per_pair, int64_t{2} * b.sm_count());
  if (grid <= 0) return;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3((kSliceWarps + 1) * 32);
  cfg.dynamicSmemBytes = static_cast<size_t>(smem);
  cfg.stream = b.stream();
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, kern, a, sh, wmap, smap));
  CUDA_CHECK_LAUNCH();
}

bool shape_takes(int64_t M, int64_t K, int64_t P, bool gate_up, int warps) {
  const int parts = gate_up ? kGateUpParts : kPlainParts, rows = 16 * warps / parts;
  if (K % kChunk != 0 || K / kChunk > parts * kMaxWarpChunks) return false;
  if (gate_up ? !(P <= 2 && (M / 2) % (rows / 2) == 0) : M % rows != 0) return false;
  return stream_shape(M, K, gate_up, warps, kMaxStages).blocks_per_sm > 0;
}

}  // namespace

bool group_stream_takes(const Linear& w, bool gate_up) {
  const int64_t K = w.in_features, M = w.out_features, P = w.partitions;
  if (P < 1 || M % P != 0 || (M / P) % 16 != 0 || !shape_takes(M, K, P, gate_up, 8)) return false;
  return (reinterpret_cast<uintptr_t>(w.weight.data) & 15u) == 0 &&
         (reinterpret_cast<uintptr_t>(w.weight_scale.data) & 15u) == 0;
}

void launch_group_stream(CudaBackend& b, const GroupGemmArgs& a) {
  const StreamDiag& d = stream_diag();
  if (d.sliced && a.pair_e && slice_takes(a.M, a.K, a.P, a.gate_up)) {
    a.gate_up ? launch_slice<true>(b, a, d.stages, a.num_experts) : launch_slice<false>(b, a, d.stages, a.num_experts);
    return;
  }
  const bool wide = d.warps == 16 && shape_takes(a.M, a.K, a.P, a.gate_up, 16);
  const StreamShape sh = stream_shape(a.M, a.K, a.gate_up, wide ? 16 : 8, d.stages);
  if (a.gate_up)
    wide ? launch<true, 16>(b, a, sh) : launch<true, 8>(b, a, sh);
  else
    wide ? launch<false, 16>(b, a, sh) : launch<false, 8>(b, a, sh);
}

}  // namespace sparkserve
