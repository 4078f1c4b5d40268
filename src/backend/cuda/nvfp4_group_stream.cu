// Grouped NVFP4 W4A4 GEMM, streamed small-N regime (nvfp4_group_gemm.h, GroupTile::kStreamN): up to 32
// activation rows per work pair (batched decode: a few tokens per routed expert). Memory-bound: every
// touched expert's weights must come from HBM once per call, so a producer warp streams them into a
// ring of shared-memory stages with the copy engine (cp.async.bulk, completing on an mbarrier) while 8
// consumer warps decode them into exact fp16 mma operands (nvfp4_group_common.cuh) and run mma.sync
// m16n8k16 with the tokens as N. The bytes in flight (2-3 stages of 36-72 KB per SM) cost no registers.
//
// Work: an item is one work pair (expert, up to 32 activation rows) x one weight row group over the
// whole K, and one ring stage holds one item: gate_up 16 gate rows and the matching 16 up rows (one
// 16-block of the down input for the epilogue; 2 m16 tiles x 4 K parts of the 8 warps), plain 128
// consecutive rows (8 m16 tiles, each warp the whole K). Rows of an expert are contiguous in memory, so
// a stage is 2 (plain) or 4 (gate_up: gate rows, up rows, their block scales) bulk copies: measured on
// the H200, a cp.async.bulk costs the copy engine ~80 cycles whatever its size, so copies of one row
// piece each (a first version: 64-128 copies of 32-512 bytes per stage) capped the kernel at ~0.5-0.9
// TB/s. Items are dealt to the persistent CTAs (one per SM) in contiguous ranges, row group fastest,
// so a pair's activation rows stay in L1. A warp owns one m16 tile of the item and one K part (the
// 128-k chunks p, p + parts, ...); gate_up's K parts meet in shared memory and are added in part order
// (deterministic) by the warps that run the epilogues.
// Shared memory of a stage: [rows][K/2] payload, then [rows][K/16] block scales (as in global memory).
#include <algorithm>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/nvfp4_group_common.cuh"
#include "backend/cuda/nvfp4_group_gemm.h"

namespace sparkserve {
namespace {

constexpr int kConsumerWarps = 8, kThreads = (kConsumerWarps + 1) * 32;  // + the producer warp
constexpr int kChunk = 128;          // k per chunk: 64 payload bytes and 8 block scales per row
constexpr int kMaxStages = 4;
constexpr int kMaxWarpChunks = 8;    // chunks per warp per item at most (gate_up K <= 4096, plain K <= 1024)
constexpr int kPairRows = 32;        // activation rows per work pair: 4 n8 column tiles
constexpr int kColTiles = kPairRows / 8;
// m16 tiles per item: gate_up 2 (16 gate rows and their up rows: one 16-block of the down input, 4 K
// parts), plain 8 (128 rows, each warp the whole K).
constexpr int kGateUpTiles = 2, kPlainTiles = 8;
constexpr int kPartialBytes = kConsumerWarps * kColTiles * 4 * 32 * 4;  // gate_up's K-part sums
constexpr int kBarrierBytes = 2 * kMaxStages * 8;
constexpr int kRingOffset = kPartialBytes + 128;  // the barriers in between, the ring 128-byte aligned
static_assert(kRingOffset - kPartialBytes >= kBarrierBytes);
// Stages over this are not taken (the small-N kernel of nvfp4_group_gemv.cu serves: dense layers of
// large K); a 3-stage ring of them fits the 227 KB of sm_90 / sm_100.
constexpr int64_t kMaxStageBytes = 72 * 1024;

struct StreamShape {
  int variant;          // diagnostics of the benchmark (set_group_stream_variant); 0 otherwise
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
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumerWarps * 32) : "memory"); }

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
    if (sh.variant == 2) {  // diagnostic: no copies (the consumers compute on stale bytes)
      mbar_arrive_expect_tx(bar, 0);
    } else if (sh.variant == 4) {  // diagnostic: every run copied as 4 pieces
      mbar_arrive_expect_tx(bar, static_cast<uint32_t>(sh.rows * (sh.rb + sh.sb)));
      const int half = a.gate_up ? sh.rows / 2 : sh.rows, runs = a.gate_up ? 2 : 1;
      for (int r = 0; r < runs; ++r) {
        const int64_t row = a.gate_up ? e * a.M + static_cast<int64_t>(cur.mg) * half + r * (a.M / 2)
                                      : e * a.M + static_cast<int64_t>(cur.mg) * sh.rows;
        for (int q = 0; q < 4; ++q) {
          bulk_copy(st + (r * half + q * half / 4) * sh.rb, a.w + (row + q * half / 4) * sh.rb, half / 4 * sh.rb, bar, policy);
          bulk_copy(st + sh.rows * sh.rb + (r * half + q * half / 4) * sh.sb, a.ws + (row + q * half / 4) * sh.sb,
                    half / 4 * sh.sb, bar, policy);
        }
      }
    } else if (a.gate_up) {
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
// the chunk for column 8j + g (prepared layout). Words 0, 2 accumulate into acc[0], words 1, 3 into
// acc[1] (two dependency chains).
template <int kN>
__device__ __forceinline__ void chunk_mma(float (&acc)[2][kColTiles][4], const ChunkOps& op,
                                          const __half* const (&x)[kColTiles], int koff) {
  uint4 b[kN][4];
#pragma unroll
  for (int j = 0; j < kN; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) b[j][i] = __ldg(reinterpret_cast<const uint4*>(x[j] + koff) + i);
  const __half2 h0 = e4m3x2_to_half2(op.s0 & 0xffu, op.s0 >> 8), h1 = e4m3x2_to_half2(op.s1 & 0xffu, op.s1 >> 8);
  const __half2 sc0[2] = {__low2half2(h0), __high2half2(h0)}, sc1[2] = {__low2half2(h1), __high2half2(h1)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t fa[4];
    decode_a<0>(word(op.q0, i), word(op.q1, i), sc0[i / 2], sc1[i / 2], fa);
#pragma unroll
    for (int j = 0; j < kN; ++j) mma16816(acc[i % 2][j], fa, b[j][i].x, b[j][i].y);
    decode_a<1>(word(op.q0, i), word(op.q1, i), sc0[i / 2], sc1[i / 2], fa);
#pragma unroll
    for (int j = 0; j < kN; ++j) mma16816(acc[i % 2][j], fa, b[j][i].z, b[j][i].w);
  }
}

// A consumer warp's view of the ring: which slot and phase come next, and where its lane's bytes sit in
// a stage (row 16 mt + g, first chunk `part`; the row g + 8 w8 / s8 bytes further).
struct RingView {
  const uint8_t* ring;
  uint64_t *full, *empty;
  uint32_t slot, phase;
  int w_off, w8, s_off, s8;
};

// One item for a warp whose item has kN column tiles: wait for its stage, run the chunks part,
// part + kParts, ... of the K / 128, release the stage.
template <int kParts, int kN>
__device__ __forceinline__ void run_item(float (&acc)[2][kColTiles][4], RingView& rv, const StreamShape& sh,
                                         const __half* const (&x)[kColTiles], int chunks, int part, int lane) {
  mbar_wait(&rv.full[rv.slot], rv.phase);
  const uint8_t* st = rv.ring + rv.slot * sh.stage_bytes;
#pragma unroll
  for (int i = 0; i < kMaxWarpChunks; ++i) {
    if (part + i * kParts >= chunks || sh.variant == 1) break;  // variant 1 (diagnostic): loads only
    const ChunkOps op = load_chunk(st + rv.w_off + i * (kParts * 64), rv.w8, st + rv.s_off + i * (kParts * 8), rv.s8);
    chunk_mma<kN>(acc, op, x, i * (kParts * kChunk));
  }
  __syncwarp();
  if (lane == 0) mbar_arrive(&rv.empty[rv.slot]);
  if (++rv.slot == static_cast<uint32_t>(sh.num_stages)) {
    rv.slot = 0;
    rv.phase ^= 1u;
  }
}

// The consumer warps. Warp w owns m16 tile w % kNT of each item (gate_up: tiles 0 .. kNT/2 - 1 gate
// rows, the rest the matching up rows) and the stage chunks w / kNT, w / kNT + kParts, ...
template <bool kGateUp, int kNT>
__device__ __forceinline__ void consume(const GroupGemmArgs& a, const StreamShape& sh, const uint8_t* ring,
                                        uint64_t* full, uint64_t* empty, float* partial, int first, int last, int warp,
                                        int lane) {
  constexpr int kParts = kConsumerWarps / kNT, kHalf = kNT / 2;
  static_assert(!kGateUp || kParts > 1, "the gate_up epilogue needs the gate and up tiles' sums together");
  const int g = lane / 4, t = lane % 4, mt = warp % kNT, part = warp / kNT;
  const int64_t K = a.K, M = a.M;
  const int Mp = static_cast<int>(M / a.P);
  const int chunks = static_cast<int>(K / kChunk);
  RingView rv{ring, full, empty, 0, 0,
              (16 * mt + g) * sh.rb + 16 * t + 64 * part, 8 * sh.rb,
              sh.rows * sh.rb + (16 * mt + g) * sh.sb + 2 * t + 8 * part, 8 * sh.sb};
  ItemCursor cur{first / sh.items_per_pair, first % sh.items_per_pair};
  WorkPair wp = first < last ? work_pair(a, cur.pair, kPairRows) : WorkPair{};
  pdl_wait();  // the activations (and the down GEMM's output rows) come from the previous kernels
  for (int item = first; item < last; ++item) {
    const int mg = cur.mg, rows = wp.rows, nt = (rows + 7) / 8;
    const int64_t e = wp.e, start = wp.start;
    // This warp's tile: its first weight row and the activation partition its B operand reads.
    const int64_t row0 = kGateUp ? (mt < kHalf ? 0 : M / 2) + static_cast<int64_t>(mg) * (8 * kNT) + 16 * (mt % kHalf)
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
    float acc[2][kColTiles][4] = {};
    switch (nt) {
      case 1: run_item<kParts, 1>(acc, rv, sh, x, chunks, part, lane); break;
      case 2: run_item<kParts, 2>(acc, rv, sh, x, chunks, part, lane); break;
      case 3: run_item<kParts, 3>(acc, rv, sh, x, chunks, part, lane); break;
      default: run_item<kParts, 4>(acc, rv, sh, x, chunks, part, lane); break;
    }
#pragma unroll
    for (int j = 0; j < kColTiles; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[0][j][r] += acc[1][j][r];
    if constexpr (kParts == 1) {  // this warp holds its tile's whole sums
      const float f = global_factor(a.w_global[e * a.P + wpart], a.in_scale[e * a.P + wpart], a.modelopt);
#pragma unroll
      for (int j = 0; j < kColTiles; ++j)
        if (j < nt)
          store_plain<1>(*reinterpret_cast<float(*)[1][4]>(acc[0][j]), f, a.out, a.ldo, a.out_row, start, row0, 8 * j,
                         rows, g, t);
    } else {
      consumer_sync();  // the previous item's epilogues are done reading `partial`
#pragma unroll
      for (int j = 0; j < kColTiles; ++j)
        if (j < nt)
#pragma unroll
          for (int r = 0; r < 4; ++r) partial[((warp * kColTiles + j) * 4 + r) * 32 + lane] = acc[0][j][r];
      consumer_sync();
      // The epilogue jobs (gate_up: per 16-block of the down input and column tile; plain: per m16 tile
      // and column tile), dealt to the warps in an order that rotates with the item. The K parts of a
      // tile are added in part order.
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
      for (int job = (warp + kConsumerWarps - item % kConsumerWarps) % kConsumerWarps; job < jobs;
           job += kConsumerWarps) {
        if constexpr (kGateUp) {
          const int blk = job % kHalf, j = job / kHalf;
          float gate[1][4], up[1][4];
          sum_parts(blk, j, gate);
          sum_parts(kHalf + blk, j, up);
          const float d_in = a.act_in_scale[e];
          const float fg = global_factor(a.w_global[e * a.P], a.in_scale[e * a.P], a.modelopt);
          const float fu = global_factor(a.w_global[e * a.P + a.P - 1], a.in_scale[e * a.P + a.P - 1], a.modelopt);
          store_gate_up<1>(gate, up, fg, fu, a.act_modelopt ? 1.0f / d_in : d_in, a.act, M / 2, start,
                           static_cast<int64_t>(mg) * (8 * kNT) + 16 * blk, 8 * j, rows, g, t);
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
    }
    wp = next;
  }
}

template <bool kGateUp, int kNT>
__global__ void __launch_bounds__(kThreads, 1) group_stream_kernel(const GroupGemmArgs a, const StreamShape sh) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int kBarriers = kGateUp ? kPartialBytes : 0;  // gate_up's partial sums first
  float* partial = reinterpret_cast<float*>(smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kBarriers);
  uint64_t* empty = full + kMaxStages;
  uint8_t* ring = smem + kBarriers + 128;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  pdl_launch_dependents();
  if (threadIdx.x == 0) {
    for (int s = 0; s < sh.num_stages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int64_t items = num_work_pairs(a, kPairRows) * sh.items_per_pair;  // < 2^31: launch() checks
  const int first = static_cast<int>(blockIdx.x * items / gridDim.x);
  const int last = static_cast<int>((blockIdx.x + 1) * items / gridDim.x);
  if (warp == kConsumerWarps) {
    if (lane == 0) produce(a, sh, ring, full, empty, first, last);
  } else
    consume<kGateUp, kNT>(a, sh, ring, full, empty, partial, first, last, warp, lane);
}

int64_t smem_optin() {
  static const int64_t v = [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return static_cast<int64_t>(optin);
  }();
  return v;
}

int g_variant = 0;

StreamShape stream_shape(int64_t M, int64_t K, bool gate_up) {
  StreamShape sh{};
  sh.variant = g_variant;
  sh.rows = 16 * (gate_up ? kGateUpTiles : kPlainTiles);
  sh.rb = static_cast<int>(K / 2);
  sh.sb = static_cast<int>(K / 16);
  sh.items_per_pair = static_cast<int>(M / sh.rows);
  sh.stage_bytes = (sh.rows * (sh.rb + sh.sb) + 127) / 128 * 128;
  const int64_t ring = smem_optin() - (gate_up ? kRingOffset : 128);
  sh.num_stages = static_cast<int>(std::min<int64_t>(kMaxStages, ring / sh.stage_bytes));
  if (sh.variant == 3) sh.num_stages = 2;  // diagnostic: a 2-stage ring
  return sh;
}

template <bool kGateUp, int kNT>
void launch(CudaBackend& b, const GroupGemmArgs& a) {
  const StreamShape sh = stream_shape(a.M, a.K, kGateUp);
  CHECK_MSG(sh.num_stages >= 2, "grouped NVFP4 stream kernel: shared memory too small");
  auto kern = group_stream_kernel<kGateUp, kNT>;
  const int64_t smem = (kGateUp ? kRingOffset : 128) + static_cast<int64_t>(sh.num_stages) * sh.stage_bytes;
  static int64_t allowed = 0;
  allow_smem(kern, smem, allowed);
  const int64_t pairs = a.pair_e ? a.max_pairs : (a.dense_rows + kPairRows - 1) / kPairRows;
  CHECK(pairs * sh.items_per_pair < (int64_t{1} << 31));
  const int64_t grid = std::min<int64_t>(pairs * sh.items_per_pair, b.sm_count());
  if (grid <= 0) return;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(kThreads);
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

}  // namespace

bool group_stream_takes(const Linear& w, bool gate_up) {
  const int64_t K = w.in_features, M = w.out_features, P = w.partitions;
  if (K % kChunk != 0 || P < 1 || M % P != 0 || (M / P) % 16 != 0) return false;
  const int tiles = gate_up ? kGateUpTiles : kPlainTiles;
  if (K / kChunk > (kConsumerWarps / tiles) * kMaxWarpChunks) return false;
  if (gate_up ? !(P <= 2 && (M / 2) % 16 == 0) : M % (16 * tiles) != 0) return false;
  const StreamShape sh = stream_shape(M, K, gate_up);
  if (sh.stage_bytes > kMaxStageBytes || sh.num_stages < 2) return false;
  return (reinterpret_cast<uintptr_t>(w.weight.data) & 15u) == 0 &&
         (reinterpret_cast<uintptr_t>(w.weight_scale.data) & 15u) == 0;
}

// For the kernel benchmark only (tests/gpu/moe_grouped_bench.cpp declares it): diagnostic variants
// of the stream kernel (1 loads only, 2 math only, 3 two stages, 4 runs copied in 4 pieces; wrong
// results for 1 and 2), 0 the kernel itself.
void set_group_stream_variant(int v) { g_variant = v; }

void launch_group_stream(CudaBackend& b, const GroupGemmArgs& a) {
  if (a.gate_up)
    launch<true, kGateUpTiles>(b, a);
  else
    launch<false, kPlainTiles>(b, a);
}

}  // namespace sparkserve
