// Grouped NVFP4 W4A4 GEMM, large-N regime (nvfp4_group_gemm.h): mma.sync m16n8k16 (f16 operands, f32
// accumulators; sm_90 / sm_100 / sm_120 alike), weights as the M operand decoded in registers
// (nvfp4_group_common.cuh), activations (quantized fp16) as the N operand, a cp.async pipeline of
// kStages shared-memory stages of 64 k. Thread t of a quad holds the 16 k of block t of each stage
// (2 weight words) and loads the matching 16 activation bytes of each 8-group.
//
// Work: persistent CTAs walk (pair, M tile) items, M tile fastest, so the CTAs running at one time
// share an expert's activations and its weight tiles in L2.
#include "backend/cuda/nvfp4_group_gemm.h"

#include <algorithm>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/nvfp4_group_common.cuh"

namespace sparkserve {
namespace {

constexpr int kBK = 64;          // k per stage: 32 payload bytes and 4 block scales per weight row
constexpr int kBRowBytes = 144;  // one activation row of a stage: 128 bytes + 16 so that the 16-byte
                                 // loads of a quarter warp (two rows) hit distinct banks

template <int kWarpsM, int kWarpsN, int kMT, int kNT, int kStages, bool kGateUp>
struct Cfg {
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int BM = kWarpsM * kMT * 16;
  static constexpr int BN = kWarpsN * kNT * 8;
  static constexpr int kParts = kGateUp ? 2 : 1;  // activation operands per stage (gate's, up's)
  static constexpr int kABytes = BM * 32;
  static constexpr int kSBytes = BM * 4;
  static constexpr int kBBytes = kParts * BN * kBRowBytes;
  static constexpr int kStageBytes = kABytes + kSBytes + kBBytes;
  static constexpr int kSmem = kStages * kStageBytes;
  static_assert(kStageBytes % 16 == 0, "stages must stay 16-byte aligned");
  static_assert(!kGateUp || kMT % 2 == 0, "gate_up warps hold gate tiles and their up tiles");
};

// Weight row of shared-memory row r of a tile whose first row is m0: gate_up tiles hold BM/2 gate
// rows then the same rows of the up half (M/2 further); plain tiles BM consecutive rows.
template <bool kGateUp, int BM>
__device__ __forceinline__ int64_t tile_row(int64_t m0, int64_t M, int r) {
  if (!kGateUp) return m0 + r;
  return r < BM / 2 ? m0 + r : M / 2 + m0 + (r - BM / 2);
}

// One pipeline stage's MMAs for a warp: its kMT m16 tiles (shared-memory rows warp_row) against the
// first kCols of its kNT n8 tiles of activation rows (from n_warp0). kCols is a compile-time count
// (the caller rounds the pair's valid rows up to 2, 4 or 8 tiles): no per-tile test, so no branch
// around the mmas; columns past the pair's rows compute padding the epilogue drops.
template <int kMT, int kNT, int BM, int BN, bool kGateUp, int kCols>
__device__ __forceinline__ void mma_stage(float (&acc)[kMT][kNT][4], const uint8_t* sa, int n_warp0, bool two_b, int wm,
                                          int g, int t) {
  constexpr int kABytes = BM * 32, kSBytes = BM * 4;
  auto warp_row = [&](int mt) {  // shared-memory row of tile mt's first row
    if (!kGateUp) return (wm * kMT + mt) * 16;
    constexpr int kHalf = kMT / 2;
    return mt < kHalf ? (wm * kHalf + mt) * 16 : BM / 2 + (wm * kHalf + mt - kHalf) * 16;
  };
  const uint8_t* ss = sa + kABytes;
  const uint8_t* sbuf = ss + kSBytes;
  __half2 scale[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt) {
    const int r = warp_row(mt) + g;
    const __half2 h = e4m3x2_to_half2(ss[r * 4 + t], ss[(r + 8) * 4 + t]);
    scale[mt][0] = __low2half2(h);
    scale[mt][1] = __high2half2(h);
  }
  // k32 step ks (word ks of each row's 8 bytes), in two halves: nibble pairs (0,4),(1,5) feed
  // one mma with activation values 0,4,1,5 of the 8-group, pairs (2,6),(3,7) the next.
#pragma unroll
  for (int ks = 0; ks < 2; ++ks)
#pragma unroll
    for (int hp = 0; hp < 2; ++hp) {
      uint32_t af[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt) {
        const uint8_t* wrow = sa + (warp_row(mt) + g) * 32 + 8 * t + 4 * ks;
        const uint32_t w0 = *reinterpret_cast<const uint32_t*>(wrow);
        const uint32_t w1 = *reinterpret_cast<const uint32_t*>(wrow + 8 * 32);
        if (hp == 0)
          decode_a<0>(w0, w1, scale[mt][0], scale[mt][1], af[mt]);
        else
          decode_a<1>(w0, w1, scale[mt][0], scale[mt][1], af[mt]);
      }
#pragma unroll
      for (int nt = 0; nt < kCols; ++nt) {
        const uint8_t* brow = sbuf + (n_warp0 + nt * 8 + g) * kBRowBytes + 32 * t + 16 * ks + 8 * hp;
        const uint2 b0 = *reinterpret_cast<const uint2*>(brow);
        const uint2 b1 = two_b ? *reinterpret_cast<const uint2*>(brow + BN * kBRowBytes) : b0;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          const uint2 b = (kGateUp && mt >= kMT / 2) ? b1 : b0;
          mma16816(acc[mt][nt], af[mt], b.x, b.y);
        }
      }
    }
}

template <int kWarpsM, int kWarpsN, int kMT, int kNT, int kStages, bool kGateUp>
__global__ void __launch_bounds__(kWarpsM* kWarpsN * 32) group_gemm_kernel(const GroupGemmArgs a) {
  using C = Cfg<kWarpsM, kWarpsN, kMT, kNT, kStages, kGateUp>;
  constexpr int BM = C::BM, BN = C::BN;
  extern __shared__ __align__(16) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int wm = warp % kWarpsM, wn = warp / kWarpsM;
  const int64_t K = a.K, M = a.M, KT = K / kBK, rb = K / 2, sb = K / 16;
  const int64_t m_tiles = kGateUp ? (M / 2) / (BM / 2) : M / BM;
  const int64_t num_pairs = num_work_pairs(a, BN);
  const int64_t Mp = M / a.P;
  const int n_warp0 = wn * kNT * 8;

  for (int64_t work = blockIdx.x; work < num_pairs * m_tiles; work += gridDim.x) {
    const int64_t pair = work / m_tiles, mtile = work % m_tiles;
    const WorkPair wp = work_pair(a, pair, BN);
    const int64_t e = wp.e, start = wp.start;
    const int rows = wp.rows;
    // gate_up: gate rows [m0, m0 + BM/2) with partition 0's activations, the up rows I + [m0, ...)
    // with partition P-1's (the same operand when P == 1). Plain: the tile lies in one partition.
    const int64_t m0 = kGateUp ? mtile * (BM / 2) : mtile * BM;
    const int part0 = kGateUp ? 0 : static_cast<int>(m0 / Mp);
    const int part1 = kGateUp ? a.P - 1 : part0;
    const int read0 = read_partition(a.in_scale, e, a.P, part0), read1 = read_partition(a.in_scale, e, a.P, part1);
    const bool two_b = read1 != read0;
    // This thread's copy sources at k-step 0 (a step advances them by 32 payload bytes, 4 scale
    // bytes, 64 activation values). Weight rows: a_r + kARow * m (gate_up: loads past the gate half
    // read the up rows, M/2 - BM/2 further); scale rows tid + kThreads * m; activation rows
    // b_j + 16 m of partition part0 (and part1), chunk b_c.
    constexpr int kARow = C::kThreads / 2, kALoads = BM * 2 / C::kThreads, kSLoads = BM / C::kThreads;
    static_assert(kALoads >= 1 && kSLoads >= 1 && (BM / 2) % kARow == 0, "loader shape");
    const int a_r = tid / 2, a_c = tid % 2, b_j = tid / 8, b_c = tid % 8;
    const int64_t up_skip = kGateUp ? M / 2 - BM / 2 : 0;
    const uint8_t* a_src = a.w + (e * M + tile_row<kGateUp, BM>(m0, M, a_r)) * rb + a_c * 16;
    const uint8_t* s_src = a.ws + (e * M + tile_row<kGateUp, BM>(m0, M, tid)) * sb;
    const __half* b_src = a.xq + (start + b_j) * a.P * K + b_c * 8;
    const int64_t b_off0 = read0 * K, b_off1 = read1 * K, b_rows16 = 16 * a.P * K;
    auto load_stage = [&](int stage, int64_t kt) {
      uint8_t* sa = smem + stage * C::kStageBytes;
      uint8_t* ss = sa + C::kABytes;
      uint8_t* sbuf = ss + C::kSBytes;
#pragma unroll
      for (int m = 0; m < kALoads; ++m) {
        const int r = a_r + kARow * m;
        const int64_t rows_on = kARow * m + (kGateUp && kARow * m >= BM / 2 ? up_skip : 0);
        cp_async16(sa + r * 32 + a_c * 16, a_src + rows_on * rb + kt * 32);
      }
#pragma unroll
      for (int m = 0; m < kSLoads; ++m) {
        const int64_t rows_on = C::kThreads * m + (kGateUp && C::kThreads * m >= BM / 2 ? up_skip : 0);
        cp_async4(ss + (tid + C::kThreads * m) * 4, s_src + rows_on * sb + kt * 4);
      }
#pragma unroll
      for (int m = 0; m < BN / 16; ++m) {
        const int j = b_j + 16 * m;
        if (j >= rows) break;
        const __half* src = b_src + m * b_rows16 + kt * kBK;
        cp_async16(sbuf + j * kBRowBytes + b_c * 16, src + b_off0);
        if (two_b) cp_async16(sbuf + (BN + j) * kBRowBytes + b_c * 16, src + b_off1);
      }
    };

    float acc[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int q = 0; q < 4; ++q) acc[mt][nt][q] = 0.0f;

#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < KT) load_stage(s, s);
      cp_async_commit();
    }
    const bool warp_active = n_warp0 < rows;
    for (int64_t kt = 0; kt < KT; ++kt) {
      cp_async_wait<kStages - 2>();
      __syncthreads();
      const int64_t nk = kt + kStages - 1;
      if (nk < KT) load_stage(static_cast<int>(nk % kStages), nk);
      cp_async_commit();
      if (!warp_active) continue;
      const uint8_t* sa = smem + (kt % kStages) * C::kStageBytes;
      static_assert(kNT == 8, "the column-count dispatch below assumes 8 n8 tiles per warp");
      const int cols = rows - n_warp0;  // > 0: warp_active
      if (cols > 32)
        mma_stage<kMT, kNT, BM, BN, kGateUp, 8>(acc, sa, n_warp0, two_b, wm, g, t);
      else if (cols > 16)
        mma_stage<kMT, kNT, BM, BN, kGateUp, 4>(acc, sa, n_warp0, two_b, wm, g, t);
      else
        mma_stage<kMT, kNT, BM, BN, kGateUp, 2>(acc, sa, n_warp0, two_b, wm, g, t);
    }

    if (warp_active) {
      if constexpr (kGateUp) {
        const float d_in = a.act_in_scale[e];
        const float fg = global_factor(a.w_global[e * a.P + part0], a.in_scale[e * a.P + part0], a.modelopt);
        const float fu = global_factor(a.w_global[e * a.P + part1], a.in_scale[e * a.P + part1], a.modelopt);
        constexpr int kHalf = kMT / 2;
#pragma unroll
        for (int j = 0; j < kHalf; ++j)
          store_gate_up<kNT>(acc[j], acc[j + kHalf], fg, fu, a.act_modelopt ? 1.0f / d_in : d_in, a.act, M / 2, start,
                             m0 + (wm * kHalf + j) * 16, n_warp0, rows, g, t);
      } else {
        const float f = global_factor(a.w_global[e * a.P + part0], a.in_scale[e * a.P + part0], a.modelopt);
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
          store_plain<kNT>(acc[mt], f, a.out, a.ldo, a.out_row, start, m0 + (wm * kMT + mt) * 16, n_warp0, rows, g, t);
      }
    }
    __syncthreads();  // every warp is done with the stages before the next item's loads
  }
}

template <int kWarpsM, int kWarpsN, int kMT, int kNT, int kStages, bool kGateUp>
void launch(CudaBackend& b, const GroupGemmArgs& a) {
  using C = Cfg<kWarpsM, kWarpsN, kMT, kNT, kStages, kGateUp>;
  auto kern = group_gemm_kernel<kWarpsM, kWarpsN, kMT, kNT, kStages, kGateUp>;
  static int64_t allowed = 0;
  allow_smem(kern, C::kSmem, allowed);
  static const int per_sm = [&] {
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, C::kThreads, C::kSmem));
    return std::max(1, n);
  }();
  const int64_t m_tiles = kGateUp ? (a.M / 2) / (C::BM / 2) : a.M / C::BM;
  const int64_t pairs = a.pair_e ? a.max_pairs : (a.dense_rows + C::BN - 1) / C::BN;
  const int64_t grid = std::min<int64_t>(pairs * m_tiles, static_cast<int64_t>(per_sm) * b.sm_count());
  if (grid <= 0) return;
  kern<<<static_cast<unsigned>(grid), C::kThreads, C::kSmem, b.stream()>>>(a);
  CUDA_CHECK_LAUNCH();
}

// Large-N tiles: 64 activation rows x 256 weight rows, 4 warps of 64 x 64 (4 m16 x 8 n8 each), 4
// stages of 27 KB, 2 CTAs per SM.
using LargeGateUp = Cfg<4, 1, 4, 8, 4, true>;

bool is_wgmma_tile(GroupTile t) {
  return t == GroupTile::kLargeNWgmma || t == GroupTile::kMediumNWgmma;
}

}  // namespace

int64_t group_tile_m(GroupTile t) {
  return t == GroupTile::kSmallN ? 32 : (t == GroupTile::kSliceNHalf ? 128 : 256);
}
int64_t group_tile_n(GroupTile t) {
  switch (t) {
    case GroupTile::kSmallN: return 8;
    case GroupTile::kSliceN:
    case GroupTile::kSliceNHalf: return 16;
    case GroupTile::kLargeN:
    case GroupTile::kMediumNWgmma: return 64;
    case GroupTile::kLargeNWgmma: return 128;
  }
  return 8;
}
bool group_tile_fits(GroupTile t) {
  if (is_wgmma_tile(t)) return group_wgmma_available();
  // The gate_up variant's stages (two activation operands) are the larger.
  return t == GroupTile::kSmallN || t == GroupTile::kSliceN || t == GroupTile::kSliceNHalf ||
         LargeGateUp::kSmem <= smem_budget();
}

bool group_gemm_takes(const Linear& w, GroupTile t, bool gate_up) {
  if (!is_nvfp4(w.format) || w.activation != ActivationQuant::kNvfp4) return false;
  if (!w.input_scale.data || !w.global_scale.data || w.partitions < 1) return false;
  if (t == GroupTile::kSliceN || t == GroupTile::kSliceNHalf)
    return group_slice_takes(w, gate_up, t == GroupTile::kSliceNHalf);
  const int64_t k_step = t == GroupTile::kSmallN ? 128 : kBK, tm = group_tile_m(t), N = w.out_features;
  if (w.in_features % k_step != 0 || N % w.partitions != 0) return false;
  if (gate_up ? !(w.partitions <= 2 && (N / 2) % (tm / 2) == 0) : (N / w.partitions) % tm != 0) return false;
  return (reinterpret_cast<uintptr_t>(w.weight.data) & 15u) == 0 && (reinterpret_cast<uintptr_t>(w.weight_scale.data) & 3u) == 0;
}

void launch_group_gemm(CudaBackend& b, const GroupGemmArgs& a, GroupTile tile) {
  if (tile == GroupTile::kSmallN)
    launch_group_gemv(b, a);
  else if (tile == GroupTile::kSliceN || tile == GroupTile::kSliceNHalf)
    launch_group_slice(b, a, tile == GroupTile::kSliceNHalf);
  else if (is_wgmma_tile(tile))
    launch_group_wgmma(b, a, static_cast<int>(group_tile_n(tile)));
  else if (a.gate_up)
    launch<4, 1, 4, 8, 4, true>(b, a);
  else
    launch<4, 1, 4, 8, 4, false>(b, a);
}

}  // namespace sparkserve
