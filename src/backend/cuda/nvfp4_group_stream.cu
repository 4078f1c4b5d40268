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
#include <algorithm>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/nvfp4_group_common.cuh"
#include "backend/cuda/nvfp4_group_gemm.h"

namespace sparkserve {
namespace {

constexpr int kConsumerWarps = 8, kThreads = (kConsumerWarps + 1) * 32;  // + the producer warp
constexpr int kMinBlocks = 2;        // CTAs per SM where two rings of 2 stages fit (96 registers)
constexpr int kChunk = 128;          // k per chunk: 64 payload bytes and 8 block scales per row
constexpr int kMaxStages = 4;
constexpr int kMaxWarpChunks = 8;    // chunks per warp per item at most (gate_up K <= 4096, plain K <= 2048)
constexpr int kPairRows = 16;        // activation rows per work pair: 2 n8 column tiles
constexpr int kColTiles = kPairRows / 8;
// m16 tiles per item: gate_up 2 (16 gate rows and their up rows: one 16-block of the down input),
// plain 4 (64 rows); the 8 warps split K into 4 / 2 parts.
constexpr int kGateUpTiles = 2, kPlainTiles = 4;
// The K parts' sums, written over the consumed stage: [warp][column tile][register][lane].
constexpr int kPartialBytes = kConsumerWarps * kColTiles * 4 * 32 * 4;
constexpr int kRingOffset = 128;     // the mbarriers first

struct StreamShape {
  int blocks_per_sm;
  int rows;             // weight rows per item (= per stage)
  int rb, sb;           // payload / block-scale bytes per row: K/2, K/16
  int stage_bytes;
  int num_stages;       // ring depth
  int items_per_pair;   // weight row groups of a matrix
};

// The consumer warps only (named barrier 1; the producer does not take part).
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, %0;" ::"n"(kConsumerWarps * 32) : "memory"); }

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
  const uint64_t policy = evict_first_policy();
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
template <bool kGateUp, int kNT>
__device__ __forceinline__ void consume(const GroupGemmArgs& a, const StreamShape& sh, uint8_t* ring, uint64_t* full,
                                        uint64_t* empty, int first, int last, int warp, int lane) {
  constexpr int kParts = kConsumerWarps / kNT;
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
    const int64_t row0 = kGateUp ? (mt == 0 ? 0 : M / 2) + static_cast<int64_t>(mg) * 16
                                 : static_cast<int64_t>(mg) * sh.rows + 16 * mt;
    const int wpart = kGateUp ? (mt == 0 ? 0 : a.P - 1) : static_cast<int>(row0) / Mp;
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
    consumer_sync();  // every warp is done with the stage's weights
    float* partial = reinterpret_cast<float*>(st);
#pragma unroll
    for (int j = 0; j < kColTiles; ++j)
      if (j < nt)
#pragma unroll
        for (int r = 0; r < 4; ++r) partial[((warp * kColTiles + j) * 4 + r) * 32 + lane] = acc[j][r];
    consumer_sync();
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
    const int jobs = (kGateUp ? 1 : kNT) * nt;
    const int job = (warp + kConsumerWarps - item % kConsumerWarps) % kConsumerWarps;
    if (job < jobs) {
      if constexpr (kGateUp) {
        float gate[1][4], up[1][4];
        sum_parts(0, job, gate);
        sum_parts(1, job, up);
        const float d_in = a.act_in_scale[e];
        const float fg = global_factor(a.w_global[e * a.P], a.in_scale[e * a.P], a.modelopt);
        const float fu = global_factor(a.w_global[e * a.P + a.P - 1], a.in_scale[e * a.P + a.P - 1], a.modelopt);
        store_gate_up<1>(gate, up, fg, fu, a.act_modelopt ? 1.0f / d_in : d_in, a.act, M / 2, start,
                         static_cast<int64_t>(mg) * 16, 8 * job, rows, g, t);
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

template <bool kGateUp, int kNT>
__global__ void __launch_bounds__(kThreads, kMinBlocks) group_stream_kernel(const GroupGemmArgs a, const StreamShape sh) {
  extern __shared__ __align__(128) uint8_t smem[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + kMaxStages;
  uint8_t* ring = smem + kRingOffset;
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
  } else {
    consume<kGateUp, kNT>(a, sh, ring, full, empty, first, last, warp, lane);
  }
}

// The stage (one item: its rows over the whole K, at least the partial sums' bytes) and the ring: 2 CTAs
// per SM where each gets 2 stages or more (sm_90: stages up to ~56 KB), else 1 CTA with the whole
// shared memory. blocks_per_sm 0: no ring of 2 stages fits (not taken).
StreamShape stream_shape(int64_t M, int64_t K, bool gate_up) {
  StreamShape sh{};
  sh.rows = 16 * (gate_up ? kGateUpTiles : kPlainTiles);
  sh.rb = static_cast<int>(K / 2);
  sh.sb = static_cast<int>(K / 16);
  sh.items_per_pair = static_cast<int>(M / sh.rows);
  sh.stage_bytes = static_cast<int>((std::max<int64_t>(sh.rows * (sh.rb + sh.sb), kPartialBytes) + 127) / 128 * 128);
  const SmemLimits& l = smem_limits();
  for (int blocks = kMinBlocks; blocks >= 1; --blocks) {
    const int64_t ring = std::min(l.optin, l.per_sm / blocks - l.reserved) - kRingOffset;
    sh.num_stages = static_cast<int>(std::min<int64_t>(kMaxStages, ring / sh.stage_bytes));
    sh.blocks_per_sm = blocks;
    if (sh.num_stages >= 2) return sh;
  }
  sh.blocks_per_sm = 0;
  return sh;
}

template <bool kGateUp, int kNT>
void launch(CudaBackend& b, const GroupGemmArgs& a) {
  const StreamShape sh = stream_shape(a.M, a.K, kGateUp);
  CHECK_MSG(sh.blocks_per_sm > 0, "grouped NVFP4 stream kernel: shared memory too small");
  auto kern = group_stream_kernel<kGateUp, kNT>;
  const int64_t smem = kRingOffset + static_cast<int64_t>(sh.num_stages) * sh.stage_bytes;
  static int64_t allowed = 0;
  allow_smem(kern, smem, allowed);
  const int64_t pairs = a.pair_e ? a.max_pairs : (a.dense_rows + kPairRows - 1) / kPairRows;
  CHECK(pairs * sh.items_per_pair < (int64_t{1} << 31));
  const int64_t grid = std::min<int64_t>(pairs * sh.items_per_pair, int64_t{sh.blocks_per_sm} * b.sm_count());
  if (grid <= 0) return;
  launch_with_pdl(kern, static_cast<unsigned>(grid), kThreads, smem, b.stream(), a, sh);
}

}  // namespace

bool group_stream_takes(const Linear& w, bool gate_up) {
  const int64_t K = w.in_features, M = w.out_features, P = w.partitions;
  if (K % kChunk != 0 || P < 1 || M % P != 0 || (M / P) % 16 != 0) return false;
  const int tiles = gate_up ? kGateUpTiles : kPlainTiles;
  if (K / kChunk > (kConsumerWarps / tiles) * kMaxWarpChunks) return false;
  if (gate_up ? !(P <= 2 && (M / 2) % 16 == 0) : M % (16 * tiles) != 0) return false;
  if (stream_shape(M, K, gate_up).blocks_per_sm == 0) return false;
  return (reinterpret_cast<uintptr_t>(w.weight.data) & 15u) == 0 &&
         (reinterpret_cast<uintptr_t>(w.weight_scale.data) & 15u) == 0;
}

void launch_group_stream(CudaBackend& b, const GroupGemmArgs& a) {
  if (a.gate_up)
    launch<true, kGateUpTiles>(b, a);
  else
    launch<false, kPlainTiles>(b, a);
}

}  // namespace sparkserve
