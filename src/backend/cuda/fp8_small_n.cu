// W8A8 FP8 Linear for T = kFp8FewTokensMax + 1 .. 64 tokens (batched decode, speculative verify at
// batch) from activation codes made beforehand: tc_gemm.h's fp8_small_n_linear (quantize, then this
// kernel) and fp8_small_n_codes_linear (codes shared by the linears of one input, or made by the op
// that produced the input: linear_fused.cu). linear.cu takes it from 5 tokens up to the wgmma small-T
// tile's range on sm_90a, and up to 64 elsewhere. Two launches per linear where the previous kernel
// here ran three (quantize, GEMM, split-K reduction): the K splits of a row block form a thread-block
// cluster and add their partial sums through distributed shared memory (fp8_few_tokens.cu's epilogue).
//
// The weights are the MMA's M operand (16 rows per tile), the tokens its N operand (NT tiles of 8),
// so each weight byte is read from HBM once whatever T is.
//
// A block owns 128 weight rows and one K slice; the S blocks of a row block (its K splits) form a
// cluster:
// - prologue: the block's first weight chunks are loaded into registers; then (the kernel before,
//   which wrote the codes, finished: programmatic dependent launch) the codes of the slice of every
//   token row are copied into shared memory (cp.async, all in flight together) with the T scales.
// - main loop: mma.sync m16n8k16 over the slice, the activation fragments from shared memory.
// - epilogue: S == 1 scales and stores; else each block's partial sums go into its shared memory
//   (over the codes, read for the last time), and block r of the cluster adds the S partial sums of
//   its share of the outputs in split order (0 + p0 + p1 + ...), then scales: deterministic.
//
// Numerics as fp8_gemm.cu's exact route: the codes and scales are the CPU's (fp8_quantize_rows_f16),
// E4M3 values of both operands are exact in f16, the MMA multiplies them exactly and accumulates in
// f32; s_t · ws[n] is applied to the f32 sum.
//
// Per warp: 32 weight rows (two m16 tiles) over the block's 64-wide K chunks. A lane loads 16 bytes
// of codes per row and chunk (4 lanes cover a row's 64 bytes) and converts them in registers (one cvt
// per 2 codes). Lane q's bytes 4s..4s+3 (x's k = 16 q + 4 s + j) serve MMA step s as its A pairs
// (2q, 2q+1) and (2q + 8, 2q + 9); the activation codes are in tc_gemm.h's kWgmma64 order, where
// those k of a token sit at 16 s + 2 q + {0, 1} and 16 s + 2 q + {8, 9} of the chunk: the B
// fragment's two registers, two 4-byte shared loads.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/fp8_codes.cuh"
#include "backend/cuda/fp8_split_reduce.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/launch_config.cuh"
#include "backend/cuda/mma_primitives.cuh"
#include "backend/cuda/tc_gemm.h"
#include "core/check.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "fp8_small_n.cu needs sm_90 or newer (thread-block clusters, programmatic dependent launch)"
#endif

namespace sparkserve {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMTiles = 2;  // m16 tiles per warp
constexpr int kRowsPerWarp = 16 * kMTiles;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kChunk = 64;      // K per step (16 bytes of codes per lane and row)
constexpr int kStages = 4;      // chunks of weights in registers: one computed, three in flight
constexpr int kMaxSplits = 16;  // the largest cluster (non-portable; 8 is portable)
constexpr int kMaxT = static_cast<int>(kFp8SmallNMaxTokens);
// Activation code rows are L + 8 f16 apart (L a multiple of 64): a row stride of 16 bytes mod 128, so
// the 4-byte B loads of a warp (8 rows g x 4 lanes q, 4 bytes apart) hit 32 distinct banks.
constexpr int kXPad = 8;
constexpr int kPartLd = kRowsPerBlock + 4;  // f32 partial-sum rows: the 4 q lanes' tokens in distinct banks

struct CodesArgs {
  const uint8_t* w;   // [rows, K] E4M3, row stride K
  const __half* xq;   // [T, K] the activation codes' values, kWgmma64 order (K % 64 == 0: rows K apart)
  const float* ts;    // [T] activation scales
  const float* ws;    // [rows] weight scales
  float* out;         // [T, ldo]
  int64_t K, rows, ldo;
  int T, chunks_per_split;
};

// Shared memory: the codes of the slice [T][L + kXPad] f16, reused after the main loop for the
// partial sums [T][kPartLd] f32; then the scales [kMaxT] f32.
__host__ __device__ inline int64_t region_bytes(int chunks_per_split, int T) {
  const int64_t codes = (int64_t{T} * (chunks_per_split * kChunk + kXPad) * 2 + 15) / 16 * 16;
  const int64_t part = int64_t{T} * kPartLd * 4;
  return codes > part ? codes : part;
}
inline int64_t smem_bytes(int chunks_per_split, int T) { return region_bytes(chunks_per_split, T) + kMaxT * 4; }

// grid: (S, ceil(rows / 128)), clusters of (S, 1, 1): block (r, b) = K split r of row block b. NT
// token tiles of 8 (T <= 8 NT).
template <int NT>
__global__ void __launch_bounds__(kThreads) fp8_small_n_kernel(CodesArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const cg::cluster_group cluster = cg::this_cluster();
  const int S = static_cast<int>(cluster.num_blocks()), split = static_cast<int>(cluster.block_rank());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4, tid = threadIdx.x;
  const int T = a.T;
  const int L = a.chunks_per_split * kChunk, ldx = L + kXPad;
  __half* xs = reinterpret_cast<__half*>(smem);
  float* part = reinterpret_cast<float*>(smem);  // after the main loop
  float* scale_s = reinterpret_cast<float*>(smem + region_bytes(a.chunks_per_split, T));

  const int64_t row_base = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock;
  const int64_t row0 = row_base + warp * kRowsPerWarp;
  const int64_t c0 = static_cast<int64_t>(split) * a.chunks_per_split;
  const int64_t c1 = min(c0 + a.chunks_per_split, a.K / kChunk);
  // The lane's rows: tile i, half h -> row0 + 16 i + 8 h + g (clamped for the loads; not stored).
  const uint8_t* wp[2 * kMTiles];
#pragma unroll
  for (int r = 0; r < 2 * kMTiles; ++r) wp[r] = a.w + min(row0 + 8 * r + g, a.rows - 1) * a.K + 16 * q;
  uint4 buf[kStages][2 * kMTiles];
  auto load = [&](uint4 (&dst)[2 * kMTiles], int64_t c) {
#pragma unroll
    for (int r = 0; r < 2 * kMTiles; ++r) dst[r] = ld_stream16(wp[r] + c * kChunk);
  };
  // The weights do not depend on the kernel before this one: their first chunks are in flight
  // while it finishes.
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st)
    if (c0 + st < c1) load(buf[st], c0 + st);
  asm volatile("griddepcontrol.wait;" ::: "memory");

  // Prologue: the slice's codes into shared memory, every copy in flight at once.
  const int n16 = (c1 > c0 ? static_cast<int>(c1 - c0) : 0) * (kChunk / 8);  // 16-byte granules per token row
  for (int i = tid; i < T * n16; i += kThreads) {
    const int t = i / n16, c = i % n16;
    cp_async16(xs + t * ldx + 8 * c, a.xq + t * a.K + c0 * kChunk + 8 * c);
  }
  cp_async_commit();
  if (tid < T) scale_s[tid] = a.ts[tid];
  cp_async_wait_all();
  __syncthreads();

  // Token columns past T read row T - 1 (not stored).
  const __half* xp[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) xp[j] = xs + min(8 * j + g, T - 1) * ldx + 2 * q;
  float acc[kMTiles][NT][4];
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
  auto compute = [&](const uint4 (&wq)[2 * kMTiles], int64_t c) {
    const int off = static_cast<int>(c - c0) * kChunk;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      uint32_t b0[NT], b1[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        b0[j] = *reinterpret_cast<const uint32_t*>(xp[j] + off + 16 * s);
        b1[j] = *reinterpret_cast<const uint32_t*>(xp[j] + off + 16 * s + 8);
      }
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        const uint32_t lo = code_word(wq[2 * i], s), hi = code_word(wq[2 * i + 1], s);
        const uint32_t af[4] = {e4m3x2_f16x2(lo), e4m3x2_f16x2(hi), e4m3x2_f16x2(lo >> 16), e4m3x2_f16x2(hi >> 16)};
#pragma unroll
        for (int j = 0; j < NT; ++j) mma_f16_16816(acc[i][j], af, b0[j], b1[j]);
      }
    }
  };
  for (int64_t c = c0; c < c1; c += kStages) {
#pragma unroll
    for (int st = 0; st < kStages; ++st) {
      const int64_t cc = c + st;
      if (cc < c1) {
        if (cc + kStages - 1 < c1) load(buf[(st + kStages - 1) % kStages], cc + kStages - 1);
        compute(buf[st], cc);
      }
    }
  }
  // C fragment: acc[i][j] = rows (tile i) g and g + 8, tokens 8 j + 2 q and + 1.
  if (S == 1) {
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t n = row0 + 16 * i + 8 * h + g;
        if (n >= a.rows) continue;
        const float wsn = a.ws[n];
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int t = 8 * j + 2 * q + e;
            if (t < T) a.out[t * a.ldo + n] = acc[i][j][2 * h + e] * (scale_s[t] * wsn);
          }
      }
    return;
  }
  __syncthreads();  // every warp has read the codes: the partial sums go over them
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int t = 8 * j + 2 * q + e;
          if (t < T) part[t * kPartLd + warp * kRowsPerWarp + 16 * i + 8 * h + g] = acc[i][j][2 * h + e];
        }
  cluster_split_sum_store<kThreads, kRowsPerBlock, kPartLd, kMaxSplits>(cluster, part, S, split, T, tid, row_base,
                                                                         a.rows, a.out, a.ldo, scale_s, a.ws);
}

// The kernel per token-tile count: index 0..3 for NT = 1, 2, 4, 8.
using KernelFn = void (*)(CodesArgs);
const KernelFn kKernels[] = {fp8_small_n_kernel<1>, fp8_small_n_kernel<2>, fp8_small_n_kernel<4>,
                                 fp8_small_n_kernel<8>};
int kernel_index(int64_t T) { return T <= 8 ? 0 : T <= 16 ? 1 : T <= 32 ? 2 : 3; }

// The largest cluster this device runs the kernels in (16 where non-portable sizes are allowed, else 8).
int most_splits() {
  static const int most = [] {
    int n = kMaxSplits;
    for (KernelFn k : kKernels) {
      if (cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return 8;
      }
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(kMaxSplits);
      cfg.blockDim = dim3(kThreads);
      int c = 0;
      if (cudaOccupancyMaxPotentialClusterSize(&c, k, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        return 8;
      }
      n = std::min(n, c >= kMaxSplits ? kMaxSplits : 8);
    }
    return n;
  }();
  return most;
}

// Launch configuration: clusters of the S splits of a row block, programmatic stream serialization
// (the weight loads overlap the tail of the kernel before: the quantization).
PdlLaunch launch_config(int ki, int splits, int64_t row_blocks, int64_t smem, cudaStream_t stream) {
  static int64_t allowed[4] = {0, 0, 0, 0};
  allow_smem(kKernels[ki], smem, allowed[ki]);
  return PdlLaunch(dim3(static_cast<unsigned>(splits), static_cast<unsigned>(row_blocks)), dim3(kThreads), smem,
                   stream, static_cast<unsigned>(splits));
}

// Clusters of `splits` blocks with `smem` bytes each that the device holds at once (cached: the query
// is a driver call).
int resident_clusters(int ki, int splits, int64_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, int, int64_t>, int> cache;
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(ki, splits, smem);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  PdlLaunch l = launch_config(ki, splits, 1, smem, nullptr);
  cudaLaunchConfig_t& cfg = l.cfg;
  cfg.numAttrs = 1;  // the cluster shape only
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kKernels[ki], &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  cache[key] = n;
  return n;
}

// K splits: the most (up to a cluster; each split at least two chunks) whose row blocks all run in one
// wave of resident clusters: every block then streams from the start, and a block's fixed costs
// (prologue, cluster barriers) are paid once per SM slot. Where no split count gives one wave, the
// fewest that fit shared memory. 0: none fits.
int plan_splits(int64_t T, int64_t rows, int64_t K) {
  const int ki = kernel_index(T);
  const int64_t chunks = K / kChunk, row_blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const int most = static_cast<int>(std::min<int64_t>(most_splits(), std::max<int64_t>(1, chunks / 2)));
  int fallback = 0;
  for (int s = most; s >= 1; --s) {
    const int64_t per = (chunks + s - 1) / s;
    if ((chunks + per - 1) / per != s) continue;  // an empty split: the same as fewer splits
    const int64_t smem = smem_bytes(static_cast<int>(per), static_cast<int>(T));
    if (smem > smem_budget()) continue;
    const int resident = resident_clusters(ki, s, smem);
    if (resident == 0) continue;
    fallback = s;
    if (row_blocks <= resident) return s;
  }
  return fallback;
}

// One partition's product: codes xq [T, K] (T <= 64) with scales ts -> out (rows ldo apart).
void run(CudaBackend& b, int splits, float* out, int64_t ldo, const __half* xq, const float* ts, int64_t T,
         int64_t rows, int64_t K, const uint8_t* wq, const float* ws) {
  CodesArgs a{};
  a.w = wq;
  a.xq = xq;
  a.ts = ts;
  a.ws = ws;
  a.out = out;
  a.K = K;
  a.rows = rows;
  a.ldo = ldo;
  a.T = static_cast<int>(T);
  const int64_t chunks = K / kChunk;
  a.chunks_per_split = static_cast<int>((chunks + splits - 1) / splits);
  const int ki = kernel_index(T);
  const int64_t row_blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const PdlLaunch l = launch_config(ki, splits, row_blocks, smem_bytes(a.chunks_per_split, a.T), b.stream());
  CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, kKernels[ki], a));
}

// Whether the kernel takes rows x K at T tokens (a plan fits), and its split count then; forced > 0:
// that split where it fits (no empty split, shared memory).
int splits_for(int64_t T, int64_t rows, int64_t K, int forced = 0) {
  if (T < 1 || T > kMaxT || rows == 0 || (rows + kRowsPerBlock - 1) / kRowsPerBlock > 65535) return 0;
  if (forced <= 0) return plan_splits(T, rows, K);
  const int64_t chunks = K / kChunk, per = (chunks + forced - 1) / forced;
  if (forced > std::min(most_splits(), static_cast<int>(chunks)) || (chunks + per - 1) / per != forced ||
      smem_bytes(static_cast<int>(per), static_cast<int>(T)) > smem_budget())
    return 0;
  return forced;
}

// fp8_small_n_linear with the plan's split (forced == 0) or a forced one.
bool small_n_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w, int forced) {
  if (!fp8_w8a8_takes(w, kChunk) || (reinterpret_cast<uintptr_t>(x) & 15u) != 0) return false;
  const int64_t K = w.in_features, N = w.out_features;
  if (T == 0 || N == 0) return true;
  // A static activation scale may differ per partition: each partition's rows get x quantized with
  // its own scale. Dynamic scales are per token, the same for every partition.
  const bool stat = w.activation == ActivationQuant::kFp8TensorStatic;
  const int64_t parts = stat && w.partitions > 1 ? w.partitions : 1, rows = N / parts;
  // Pieces of 64 tokens (past 64: the fallback where the tensor-core GEMMs do not run); every piece's
  // plan is checked before anything is launched.
  const int64_t first = std::min(T, kFp8SmallNMaxTokens), last = T % kFp8SmallNMaxTokens;
  if (splits_for(first, rows, K, forced) == 0 || (last != 0 && splits_for(last, rows, K, forced) == 0)) return false;
  CudaBackend::Scratch xq(&b, static_cast<size_t>(first * K) * 2), ts(&b, static_cast<size_t>(first) * 4);
  const auto* wq = static_cast<const uint8_t*>(w.weight.data);
  const auto* ws = static_cast<const float*>(w.weight_scale.data);
  const auto* is = static_cast<const float*>(w.input_scale.data);
  for (int64_t t0 = 0; t0 < T; t0 += kFp8SmallNMaxTokens) {
    const int64_t n = std::min(kFp8SmallNMaxTokens, T - t0);
    const int splits = splits_for(n, rows, K, forced);
    for (int64_t p = 0; p < parts; ++p) {
      fp8_quantize_rows_f16(b.stream(), xq.as<__half>(), ts.as<float>(), x + t0 * K, n, K, stat ? is + p : nullptr,
                            Fp8CodeOrder::kWgmma64);
      run(b, splits, out + t0 * N + p * rows, N, xq.as<__half>(), ts.as<float>(), n, rows, K, wq + p * rows * K,
          ws + p * rows);
    }
  }
  return true;
}

}  // namespace

int fp8_small_n_splits(const Linear& w, int64_t T) {
  if (!fp8_w8a8_takes(w, kChunk)) return 0;
  const bool per_partition = w.activation == ActivationQuant::kFp8TensorStatic && w.partitions > 1;
  return splits_for(std::min(T, kFp8SmallNMaxTokens), w.out_features / (per_partition ? w.partitions : 1),
                    w.in_features);
}

bool fp8_small_n_takes_codes(const Linear& w, int64_t T) {
  return fp8_w8a8_takes(w, kChunk) && w.activation == ActivationQuant::kFp8TokenDynamic &&
         splits_for(T, w.out_features, w.in_features) > 0;
}

void fp8_small_n_codes_linear(CudaBackend& b, float* out, const __half* xq, const float* ts, int64_t T,
                              const Linear& w) {
  CHECK(fp8_small_n_takes_codes(w, T));
  run(b, splits_for(T, w.out_features, w.in_features), out, w.out_features, xq, ts, T, w.out_features, w.in_features,
      static_cast<const uint8_t*>(w.weight.data), static_cast<const float*>(w.weight_scale.data));
}

bool fp8_small_n_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w) {
  return small_n_linear(b, out, x, T, w, 0);
}

bool fp8_small_n_linear_forced(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w, int splits) {
  return splits > 0 && small_n_linear(b, out, x, T, w, splits);
}

}  // namespace sparkserve
