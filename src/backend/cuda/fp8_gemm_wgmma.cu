// W8A8 FP8 Linear for prefill-sized T on Hopper's warpgroup MMA (sm_90a; tc_gemm.h's
// fp8_wgmma_linear). The FP8 weight codes are read from global memory once per tile and turned into
// f16 inside the kernel: no f16 copy of the weights, no separate scale pass.
//
// Numerics: those of fp8_gemm.cu's exact route. The activation codes and per-token scales are the
// CPU's bit for bit (fp8_quantize_rows_f16); every E4M3 value is exact in f16, so the f16 wgmma
// multiplies the codes of both sides exactly and sums in f32; out = sum · (s_t · ws[n]) in f32, the
// same operations as fp8_scale_outer. Split-K partial sums (few tiles) are added in split order by
// fp8_reduce_splits: deterministic.
//
// Operands: the weights are the MMA's M side (A from registers): a tile's rows arrive by TMA as
// 64-byte rows of codes per 64-k stage; a quad lane's 16-byte load of a row holds its A fragments of
// the stage's four k16 steps, converted by cvt.rn.f16x2.e4m3x2 (the activations are stored in the
// matching k order: tc_gemm.h Fp8CodeOrder::kWgmma64). The activation codes (f16) are the N side (B
// from shared memory, K-major, 128-byte swizzle, by TMA). D = [weight rows, tokens] in f32 registers.
//
// CTA: warpgroup 0 is the producer (one thread issues the TMA copies into a ring of stages with
// full / empty mbarriers), warpgroups 1 and 2 consume: each takes 64 · kMT weight rows of the tile
// (kMT m64 tiles) against all kBN tokens. Per k16 step a warpgroup converts its fragments (two
// buffers), issues kMT wgmmas, and waits for the previous step's (wait_group 1), so one step is
// always in flight; a stage is handed back once its last step has completed. Persistent: a grid
// of at most one CTA per SM walks the work units (tile x K split) in a grouped order (kGroupM weight
// tiles share the tokens' tiles), the producer loading the next unit while the consumers store.
#include <cuda.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/fp8_codes.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/launch_config.cuh"
#include "backend/cuda/tc_gemm.h"
#include "backend/cuda/tensor_map.h"
#include "backend/cuda/wgmma_primitives.cuh"
#include "core/check.h"

namespace sparkserve {
namespace {

constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kSmemLimit = 227 * 1024;

template <int kMT, int kBN>
struct Tile {
  static constexpr int BM = 128 * kMT;  // weight rows per unit
  static constexpr int kXBytes = kBN * 128;      // activation codes of a stage: kBN rows of 64 f16 (swizzled)
  static constexpr int kWBytes = BM * 64;        // weight codes of a stage: BM rows of 64 bytes
  static constexpr int kStageBytes = kXBytes + kWBytes;
  static constexpr int kStages = std::min(8, (kSmemLimit - 2048) / kStageBytes);
  static constexpr int kBarOffset = kStages * kStageBytes;
  static constexpr int kSmem = kBarOffset + 2 * kStages * 8 + 1024;  // + the base's alignment to 1 KB
  static_assert(kXBytes % 1024 == 0 && kWBytes % 1024 == 0, "stages keep the swizzle's 1 KB alignment");
};

struct WgmmaArgs {
  const float* __restrict__ ts;  // [T] activation scales
  const float* __restrict__ ws;  // [rows] weight scales
  float* __restrict__ out;       // [T, ldo] (splits == 1)
  float* __restrict__ part;      // [splits, T, rows] unscaled partial sums (splits > 1)
  int64_t ldo;
  int T, rows, k_stages, splits, stages_per_split, m_tiles, n_tiles, units;
  int x_box_bytes;  // the activation box a stage loads: min(kBN, T rounded up to 8) rows of 128 bytes
};

#ifdef SPARKSERVE_HAS_WGMMA
constexpr int kGroupM = 8;  // weight tiles per raster group
// Work unit u -> weight tile, token tile, K split. Splits of a tile are adjacent; tiles run in
// groups of kGroupM weight tiles, token tiles outer within a group.
__device__ __forceinline__ void unit_coords(const WgmmaArgs& a, int u, int& mt, int& nt, int& split) {
  split = u % a.splits;
  const int tile = u / a.splits, per_group = kGroupM * a.n_tiles;
  const int group = tile / per_group, in = tile % per_group;
  const int m0 = group * kGroupM, gm = min(kGroupM, a.m_tiles - m0);
  mt = m0 + in % gm;
  nt = in / gm;
}

__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// Box (x = c0 innermost, y = c1) of a 2-D tensor map into shared memory; completes on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

template <int kBN>
__device__ __forceinline__ void wgmma_rs(float (&d)[kBN / 8][4], const uint32_t (&a)[4], uint64_t desc) {
  if constexpr (kBN == 256)
    wgmma_m64n256k16_rs_f16(d, a, desc);
  else if constexpr (kBN == 128)
    wgmma_m64n128k16_rs_f16(d, a, desc);
  else
    wgmma_m64n64k16_rs_f16(d, a, desc);
}

// Programmatic dependent launch: wait until the kernel before this one in the stream (the
// activation quantization) has completed and its writes are visible.
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// The weights do not depend on the kernel before this one (launched with programmatic stream
// serialization, this kernel may start while the activation quantization still runs): the first
// ring of stages gets its weight loads at once and its activation loads after pdl_wait.
template <int kMT, int kBN>
__device__ __forceinline__ void produce(const WgmmaArgs& a, const CUtensorMap* xmap, const CUtensorMap* wmap,
                                        uint32_t smem, uint32_t full, uint32_t empty) {
  using Tl = Tile<kMT, kBN>;
  int stage = 0;
  uint32_t phase = 0;
  int held = 0;  // stages 0..held-1 wait for their activation load; -1 once issued
  int held_kb[Tl::kStages], held_nt[Tl::kStages];
  auto release = [&] {
    pdl_wait();
    for (int i = 0; i < held; ++i)
      tma_load_2d(smem + i * Tl::kStageBytes, xmap, held_kb[i] * 64, held_nt[i] * kBN, full + 8 * i);
    held = -1;
  };
  for (int u = blockIdx.x; u < a.units; u += gridDim.x) {
    int mt, nt, split;
    unit_coords(a, u, mt, nt, split);
    const int k0 = split * a.stages_per_split, k1 = min(a.k_stages, k0 + a.stages_per_split);
    for (int kb = k0; kb < k1; ++kb) {
      mbar_wait(empty + 8 * stage, phase ^ 1);  // a fresh barrier counts as released
      const uint32_t st = smem + stage * Tl::kStageBytes, bar = full + 8 * stage;
      mbar_expect_tx(bar, a.x_box_bytes + Tl::kWBytes);
      tma_load_2d(st + Tl::kXBytes, wmap, kb * 64, mt * Tl::BM, bar);
      if (held < 0) {
        tma_load_2d(st, xmap, kb * 64, nt * kBN, bar);
      } else {  // the first pass over the ring: stage == held
        held_kb[held] = kb;
        held_nt[held] = nt;
        if (++held == Tl::kStages) release();
      }
      if (++stage == Tl::kStages) stage = 0, phase ^= 1;
    }
  }
  if (held > 0) release();
}

template <int kMT, int kBN>
__device__ __forceinline__ void consume(const WgmmaArgs& a, const uint8_t* smem, uint32_t full, uint32_t empty) {
  using Tl = Tile<kMT, kBN>;
  const int cw = threadIdx.x / 128 - 1, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  // This warp's rows in a stage's weight block: m64 tile m, rows r0 + 64 m (+ 8).
  const int r0 = cw * 64 * kMT + warp * 16 + g;
  const uint64_t desc0 = sw128_desc(smem);  // stage offsets and k16 steps are added to its address field
  int stage = 0;
  uint32_t phase = 0;
  float acc[kMT][kBN / 8][4];
  uint32_t frag[2][kMT][4];
  pdl_wait();  // the activation scales (epilogue) come from the kernel before this one
  for (int u = blockIdx.x; u < a.units; u += gridDim.x) {
    int mt, nt, split;
    unit_coords(a, u, mt, nt, split);
    const int k0 = split * a.stages_per_split, k1 = min(a.k_stages, k0 + a.stages_per_split);
#pragma unroll
    for (int m = 0; m < kMT; ++m) {
#pragma unroll
      for (int i = 0; i < kBN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][i][e] = 0.0f;
      wgmma_fence_operand(acc[m]);
    }
    int prev = -1;
    for (int kb = k0; kb < k1; ++kb) {
      mbar_wait(full + 8 * stage, phase);
      const uint8_t* sw = smem + stage * Tl::kStageBytes + Tl::kXBytes;
      uint4 codes[kMT][2];
#pragma unroll
      for (int m = 0; m < kMT; ++m)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          codes[m][h] = *reinterpret_cast<const uint4*>(sw + (r0 + 64 * m + 8 * h) * 64 + 16 * t);
      const uint64_t desc = desc0 + static_cast<uint64_t>((stage * Tl::kStageBytes) >> 4);
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        // Buffer s % 2 was read by step s - 2, complete since the last wait.
#pragma unroll
        for (int m = 0; m < kMT; ++m) {
          const uint32_t w0 = code_word(codes[m][0], s), w8 = code_word(codes[m][1], s);
          frag[s % 2][m][0] = e4m3x2_f16x2(w0);
          frag[s % 2][m][1] = e4m3x2_f16x2(w8);
          frag[s % 2][m][2] = e4m3x2_f16x2(w0 >> 16);
          frag[s % 2][m][3] = e4m3x2_f16x2(w8 >> 16);
        }
        wgmma_fence();
#pragma unroll
        for (int m = 0; m < kMT; ++m) wgmma_rs<kBN>(acc[m], frag[s % 2][m], desc + 2 * s);  // + 32 bytes per k16
        wgmma_commit();
        wgmma_wait<1>();
        if (s == 0 && prev >= 0 && lane == 0) mbar_arrive(empty + 8 * prev);  // its last step completed
      }
      prev = stage;
      if (++stage == Tl::kStages) stage = 0, phase ^= 1;
    }
    // D fragment: acc[m][i] = weight rows r and r + 8, tokens 8 i + 2 t and + 1. The scales are
    // loaded in batches of kBatch token octets, each batch's loads issued together (the first while
    // the last steps run): a few memory latencies per unit rather than one per token.
    constexpr int kBatch = 8;
    const int64_t row0 = static_cast<int64_t>(mt) * Tl::BM + r0;
    const int tok0 = nt * kBN + 2 * t;
    float wsv[kMT][2], tsv[kBatch][2];
    auto load_ts = [&](int i0) {
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tok = tok0 + 8 * (i0 + i) + e;
          tsv[i][e] = a.splits == 1 && tok < a.T ? __ldg(a.ts + tok) : 0.0f;
        }
    };
#pragma unroll
    for (int m = 0; m < kMT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t r = row0 + 64 * m + 8 * h;
        wsv[m][h] = r < a.rows ? __ldg(a.ws + r) : 0.0f;
      }
    load_ts(0);
    wgmma_wait<0>();
#pragma unroll
    for (int m = 0; m < kMT; ++m) wgmma_fence_operand(acc[m]);
    if (prev >= 0 && lane == 0) mbar_arrive(empty + 8 * prev);
#pragma unroll
    for (int i0 = 0; i0 < kBN / 8; i0 += kBatch) {
      if (i0 > 0) load_ts(i0);
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tok = tok0 + 8 * (i0 + i) + e;
          if (tok >= a.T) continue;
#pragma unroll
          for (int m = 0; m < kMT; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              const int64_t r = row0 + 64 * m + 8 * h;
              if (r >= a.rows) continue;
              const float v = acc[m][i0 + i][2 * h + e];
              if (a.splits == 1)
                a.out[tok * a.ldo + r] = v * (tsv[i][e] * wsv[m][h]);
              else
                a.part[(static_cast<int64_t>(split) * a.T + tok) * a.rows + r] = v;
            }
        }
    }
  }
}
#endif  // SPARKSERVE_HAS_WGMMA

template <int kMT, int kBN>
__global__ void __launch_bounds__(kThreads, 1)
    fp8_wgmma_kernel(const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap,
                     const WgmmaArgs a) {
#ifdef SPARKSERVE_HAS_WGMMA
  using Tl = Tile<kMT, kBN>;
  extern __shared__ uint8_t smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  uint8_t* smem = smem_raw + ((1024u - (raw & 1023u)) & 1023u);
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t full = base + Tl::kBarOffset, empty = full + 8 * Tl::kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < Tl::kStages; ++s) {
      mbar_init(full + 8 * s, 1);   // the producer's expect_tx arrival (+ the copies' bytes)
      mbar_init(empty + 8 * s, 8);  // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (threadIdx.x == 0) produce<kMT, kBN>(a, &xmap, &wmap, base, full, empty);
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    consume<kMT, kBN>(a, smem, full, empty);
  }
#endif
}

// out[t, n] = ts[t] · ws[n] · Σ_s part[s, t, n], summed in split order.
__global__ void reduce_splits_kernel(float* out, int64_t ldo, const float* part, int splits, int64_t T, int64_t rows,
                                     const float* ts, const float* ws) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * rows) return;
  const int64_t t = i / rows, n = i % rows;
  float s = 0.0f;
  for (int k = 0; k < splits; ++k) s += part[k * T * rows + i];
  out[t * ldo + n] = s * (ts[t] * ws[n]);
}

// The tile shapes (weight rows per unit = 128 kMT, tokens kBN) and the planner's relative MMA
// efficiency of each, fitted with its fixed costs below to gpu_ops' "gemm fp8 tiles" sweep on the
// H200 (122B and 35B shapes, T = 128..8192: its choice within 2.8% of the best tile and split of the
// sweep everywhere). Measured and not kept: 128 x 256 and 256 x 64 cooperative tiles (best in a few
// cases by <= 3%), and ping-pong warpgroups (each its own 128 x 128 or 64 x 256 unit, one storing
// while the other multiplies): 4-28% slower than these at 8K tokens.
// kSmallTile is the small-T one (T <= kFp8SmallNMaxTokens: batched decode, speculative verify),
// planned by plan_small: one tile of 64 tokens holds every token; a stage loads only the token rows
// there are (WgmmaArgs::x_box_bytes), so the MMAs of the rows past T cost tensor-core time only,
// which the weight stream hides (128 rows x 64 tokens x 64 k per 8 KB stage of weights: ~256 cycles
// of MMA against ~650 of HBM at an SM's share of 3.3 TB/s). Measured and not kept: 256 weight rows x
// 64 tokens (best of the sweep nowhere once the box was trimmed; before, its few wins were at T = 4).
struct TileShape {
  int mt, bn;
  double efficiency;
};
constexpr TileShape kTiles[] = {{2, 128, 1.0}, {1, 128, 0.85}, {1, 64, 0}};
constexpr int kNumTiles = sizeof(kTiles) / sizeof(kTiles[0]);
constexpr int kSmallTile = 2;
int tile_rows(int tile) { return 128 * kTiles[tile].mt; }

// Launched with programmatic stream serialization: the kernel may start before the kernel before
// it (the activation quantization) completes and streams its first weights meanwhile (produce,
// pdl_wait). Measured on the H200 (gpu_ops "gemm small-N", T = 2..96, both models' shapes): 1.0-1.6
// us faster per call than an ordinary launch everywhere but the 122B out_proj, where it ties.
template <int kMT, int kBN>
void launch(CudaBackend& b, const CUtensorMap& xmap, const CUtensorMap& wmap, const WgmmaArgs& a) {
  using Tl = Tile<kMT, kBN>;
  auto kern = fp8_wgmma_kernel<kMT, kBN>;
  static int64_t allowed = 0;
  allow_smem(kern, Tl::kSmem, allowed);
  const PdlLaunch l(dim3(static_cast<unsigned>(std::min(a.units, b.sm_count()))), dim3(kThreads), Tl::kSmem, b.stream());
  CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, kern, xmap, wmap, a));
}

void launch_tile(CudaBackend& b, int tile, const CUtensorMap& xmap, const CUtensorMap& wmap, const WgmmaArgs& a) {
  switch (tile) {
    case 0: launch<2, 128>(b, xmap, wmap, a); break;
    case 1: launch<1, 128>(b, xmap, wmap, a); break;
    default: launch<1, 64>(b, xmap, wmap, a); break;
  }
}

constexpr int kMostSmem = std::max({Tile<2, 128>::kSmem, Tile<1, 128>::kSmem, Tile<1, 64>::kSmem});

// Tile and K split (1, 2 or 4 ways) for a problem: the fewest estimated cycles, counting the work
// units per SM (each SM runs its units one after the other): a unit's MMA cycles at the tensor
// cores' f16 rate (4096 flop per SM per clock) over the tile's efficiency plus 1000 cycles (pipeline
// fill, epilogue), and for splits the partial sums' round trip (written and read once at 10 bytes
// per cycle per SM, plus 4000 cycles for the reduction's launch).
struct Plan {
  int tile, splits;
};
Plan plan_for(int64_t T, int64_t rows, int64_t K, int sms) {
  const int64_t k_stages = (K + 63) / 64;
  Plan best{0, 1};
  double best_cost = 1e300;
  for (int ti = 0; ti < kSmallTile; ++ti) {
    const int64_t bm = tile_rows(ti), bn = kTiles[ti].bn;
    const int64_t tiles = ((rows + bm - 1) / bm) * ((T + bn - 1) / bn);
    for (int64_t s : {1, 2, 4}) {
      const int64_t per = (k_stages + s - 1) / s;
      if ((s - 1) * per >= k_stages) continue;  // an empty split
      const int64_t units = tiles * s, waves = (units + sms - 1) / sms;
      const double unit = static_cast<double>(bm * bn * 64 * per * 2) / 4096.0 / kTiles[ti].efficiency + 1000.0;
      const double reduce = s > 1 ? static_cast<double>(T * rows * 4 * (s + 1)) / (10.0 * sms) + 4000.0 : 0.0;
      const double cost = static_cast<double>(waves) * unit + reduce;
      if (cost < best_cost) best_cost = cost, best = {ti, static_cast<int>(s)};
    }
  }
  return best;
}

// Small T (<= kFp8SmallNMaxTokens): the weights' stream is the cost, MMAs hide under it. The K
// split (1..16 ways) of kSmallTile with the fewest estimated seconds: each SM runs ceil(units / SMs)
// units (weight tile x split) one after the other, streaming a unit's weight bytes at its share of
// HBM (kHbm over the SMs at work, at most kSmMost for one SM); splits add fp8_reduce_splits (its
// launch and the partial sums written and read). Fitted to gpu_ops' "gemm small-T tiles" sweep on
// the H200 (122B and 35B shapes, T = 4, 16, 64): its choice 1% slower than the sweep's best on
// average, 10% at worst (122B out_proj at T = 4, a size the mma.sync kernel serves).
Plan plan_small(int64_t T, int64_t rows, int64_t K, int sms) {
  constexpr double kHbm = 3.2e12, kSmMost = 30e9, kReduceLaunch = 1e-6, kPartialBytesPerS = 3e12;
  const int64_t k_stages = (K + 63) / 64, bm = tile_rows(kSmallTile), m_tiles = (rows + bm - 1) / bm;
  Plan best{kSmallTile, 1};
  double best_cost = 1e300;
  for (int64_t s : {1, 2, 3, 4, 6, 8, 12, 16}) {
    const int64_t per = (k_stages + s - 1) / s;
    if ((s - 1) * per >= k_stages) continue;  // an empty split
    const int64_t units = m_tiles * s, active = std::min<int64_t>(units, sms), rounds = (units + sms - 1) / sms;
    const double rate = std::min(kHbm / static_cast<double>(active), kSmMost);
    double cost = static_cast<double>(rounds * bm * 64 * per) / rate;
    if (s > 1) cost += kReduceLaunch + static_cast<double>(T * rows * 4 * (s + 1)) / kPartialBytesPerS;
    if (cost < best_cost) best_cost = cost, best = {kSmallTile, static_cast<int>(s)};
  }
  return best;
}

}  // namespace

void fp8_reduce_splits(cudaStream_t s, float* out, int64_t ldo, const float* part, int splits, int64_t T, int64_t rows,
                       const float* ts, const float* ws) {
  if (T * rows == 0) return;
  reduce_splits_kernel<<<blocks_for(T * rows, 256), 256, 0, s>>>(out, ldo, part, splits, T, rows, ts, ws);
  CUDA_CHECK_LAUNCH();
}

bool fp8_wgmma_available() {
  static const bool ok = [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return sm90a_kernel_runs(reinterpret_cast<const void*>(fp8_wgmma_kernel<2, 128>)) && kMostSmem <= optin &&
           tensor_maps_available();
  }();
  return ok;
}

namespace {

// The plan of one linear (forced tile / splits where given), with the splits that are not empty.
Plan plan_of(CudaBackend& b, int64_t T, int64_t rows, int64_t K, int force_tile, int force_splits) {
  Plan plan = T <= kFp8SmallNMaxTokens ? plan_small(T, rows, K, b.sm_count()) : plan_for(T, rows, K, b.sm_count());
  if (force_tile >= 0) plan.tile = force_tile;
  if (force_splits > 0) plan.splits = force_splits;
  const int64_t k_stages = fp8_wgmma_row(K) / 64, per = (k_stages + plan.splits - 1) / plan.splits;
  plan.splits = static_cast<int>((k_stages + per - 1) / per);  // no empty split
  return plan;
}

// One partition's GEMM: codes xq [T, fp8_wgmma_row(K)] with scales ts -> out (rows ldo apart; splits
// == 1) or the unscaled partial sums part [splits, T, rows] (splits > 1).
void run_gemm(CudaBackend& b, const Plan& plan, float* out, int64_t ldo, float* part, const __half* xq, const float* ts,
              int64_t T, int64_t rows, int64_t K, const uint8_t* wq, const float* ws) {
  const int64_t ld = fp8_wgmma_row(K), k_stages = ld / 64, per = (k_stages + plan.splits - 1) / plan.splits;
  const int bm = tile_rows(plan.tile), bn = kTiles[plan.tile].bn;
  const int64_t m_tiles = (rows + bm - 1) / bm, n_tiles = (T + bn - 1) / bn;
  // A stage loads the tokens there are (in octets), not the whole kBN: the rows past them keep what
  // the stage held before, which only the discarded output columns of tokens >= T read (each token is
  // its own column of the product). Past T within the box the tensor map reads zeros.
  const int box_rows = static_cast<int>(std::min<int64_t>(bn, (T + 7) / 8 * 8));
  const CUtensorMap xmap = tensor_map_2d(xq, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, T, ld, ld, box_rows,
                                      64, CU_TENSOR_MAP_SWIZZLE_128B);
  const CUtensorMap wmap = tensor_map_2d(wq, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, rows, K, K, bm, 64,
                                      CU_TENSOR_MAP_SWIZZLE_NONE);
  WgmmaArgs a{};
  a.ts = ts;
  a.ws = ws;
  a.out = out;
  a.part = part;
  a.ldo = ldo;
  a.T = static_cast<int>(T);
  a.rows = static_cast<int>(rows);
  a.k_stages = static_cast<int>(k_stages);
  a.splits = plan.splits;
  a.stages_per_split = static_cast<int>(per);
  a.m_tiles = static_cast<int>(m_tiles);
  a.n_tiles = static_cast<int>(n_tiles);
  a.units = a.m_tiles * a.n_tiles * plan.splits;
  a.x_box_bytes = box_rows * 128;
  launch_tile(b, plan.tile, xmap, wmap, a);
}

}  // namespace

bool fp8_wgmma_takes_codes(const Linear& w) {
  return fp8_gemm_takes(w) && w.activation == ActivationQuant::kFp8TokenDynamic && fp8_wgmma_available();
}

int fp8_wgmma_splits(CudaBackend& b, int64_t T, const Linear& w) {
  return plan_of(b, T, w.out_features, w.in_features, -1, 0).splits;
}

void fp8_wgmma_codes_linear(CudaBackend& b, float* out, float* part, int splits, const __half* xq, const float* ts,
                            int64_t T, const Linear& w) {
  CHECK(fp8_wgmma_takes_codes(w) && T <= INT32_MAX / 2 && w.out_features <= INT32_MAX / 2);
  if (T == 0 || w.out_features == 0) return;
  Plan plan = plan_of(b, T, w.out_features, w.in_features, -1, 0);
  CHECK(plan.splits == splits && (splits == 1 || part != nullptr));
  run_gemm(b, plan, out, w.out_features, part, xq, ts, T, w.out_features, w.in_features,
           static_cast<const uint8_t*>(w.weight.data), static_cast<const float*>(w.weight_scale.data));
}

bool fp8_wgmma_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w, int force_tile,
                      int force_splits) {
  if (!fp8_gemm_takes(w) || (reinterpret_cast<uintptr_t>(x) & 15u) != 0 || !fp8_wgmma_available()) return false;
  if (force_tile >= kNumTiles) return false;
  const int64_t K = w.in_features, N = w.out_features;
  if (T == 0 || N == 0) return true;
  CHECK(T <= INT32_MAX / 2 && N <= INT32_MAX / 2 && K <= INT32_MAX / 2);
  // A static activation scale may differ per partition: each partition's rows get x quantized
  // with its own scale. Dynamic scales are per token, the same for every partition.
  const bool per_partition = w.activation == ActivationQuant::kFp8TensorStatic && w.partitions > 1;
  const int64_t parts = per_partition ? w.partitions : 1, rows = N / parts, ld = fp8_wgmma_row(K);
  const Plan plan = plan_of(b, T, rows, K, force_tile, force_splits);
  CudaBackend::Scratch xq(&b, static_cast<size_t>(T * ld) * 2), scales(&b, static_cast<size_t>(T) * 4),
      part(&b, plan.splits > 1 ? static_cast<size_t>(plan.splits * T * rows) * 4 : 0);
  const auto* wq = static_cast<const uint8_t*>(w.weight.data);
  const auto* ws = static_cast<const float*>(w.weight_scale.data);
  const auto* is = static_cast<const float*>(w.input_scale.data);
  for (int64_t p = 0; p < parts; ++p) {
    fp8_quantize_rows_f16(b.stream(), xq.as<__half>(), scales.as<float>(), x, T, K,
                          w.activation == ActivationQuant::kFp8TensorStatic ? is + p : nullptr,
                          Fp8CodeOrder::kWgmma64);
    run_gemm(b, plan, out + p * rows, N, part.as<float>(), xq.as<__half>(), scales.as<float>(), T, rows, K,
             wq + p * rows * K, ws + p * rows);
    if (plan.splits > 1)
      fp8_reduce_splits(b.stream(), out + p * rows, N, part.as<float>(), plan.splits, T, rows, scales.as<float>(),
                        ws + p * rows);
  }
  return true;
}

}  // namespace sparkserve
