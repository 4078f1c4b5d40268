// W8A8 FP8 Linear for 2..kFp8FewTokensMax tokens (a speculative verify step at batch 1, decode at
// batch 2-4): tc_gemm.h's fp8_few_tokens_linear, ONE kernel per linear where fp8_small_n.cu runs
// two (the activation quantization, then the GEMM with its split-K reduction in a cluster). The weights are the MMA's M
// operand (16 rows per tile), the tokens its N operand (one tile of 8), so each weight byte is read
// from HBM once whatever T is.
//
// A block owns 128 weight rows and one K slice; the S blocks of a row block (its K splits) form a
// thread-block cluster:
// - prologue: the block's first weight chunks are loaded into registers; then (the kernel before,
//   which wrote x, finished: programmatic dependent launch) x's slice of every token row is copied
//   into shared memory (cp.async, all copies in flight together), the block takes each row's amax
//   over its slice, the cluster exchanges the partial maxima through distributed shared memory (max
//   is order-free: every block gets the CPU's row amax, hence its scale), and the block writes the
//   codes of its slice (their exact f16 values) into shared memory.
// - main loop: mma.sync m16n8k16 over the slice, the activation fragments from shared memory.
// - epilogue: each block's partial sums go into its shared memory; block r of the cluster adds the
//   S partial sums of its share of the outputs in split order (0 + p0 + p1 + ...), then scales.
// Every block reads its slice of x (T x K x 4 bytes per row block in all): at <= 4 tokens a few
// MB from L2 for the largest layers, against their 25-50 MB of weights from HBM; at 8-16 tokens
// that read and the f32 staging (shared memory, so fewer blocks per SM) made this kernel slower than
// the quantization + GEMM + reduction of the time (docs/performance.md), hence its token limit;
// fp8_small_n.cu now stages f16 codes quantized once instead.
//
// Numerics as fp8_gemm.cu's exact route: the activation codes and scales are the CPU's
// (fp8_quantize_rows_f16's operations), E4M3 values of both operands are exact in f16, the MMA
// multiplies them exactly and accumulates in f32; s_t · ws[n] is applied to the f32 sum.
// Deterministic: the split order of the sums is fixed.
//
// Per warp: 32 weight rows (two m16 tiles) over the block's 64-wide K chunks. A lane loads 16 bytes
// of codes per row and chunk (4 lanes cover a row's 64 bytes) and converts them in registers (one cvt
// per 2 codes). The MMA's K order is free (a dot product does not depend on it), so the lane's bytes
// 4s..4s+3 serve MMA step s as its k pairs (2q, 2q+1) and (2q + 8, 2q + 9), and the B fragment takes
// the same four activation values: x[n][16q + 4s .. + 3], one 8-byte shared load.
#include <cooperative_groups.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "backend/cuda/fp8_codes.cuh"
#include "backend/cuda/fp8_split_reduce.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/launch_config.cuh"
#include "backend/cuda/mma_primitives.cuh"
#include "backend/cuda/quant_math.cuh"
#include "backend/cuda/tc_gemm.h"
#include "core/check.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "fp8_few_tokens.cu needs sm_90 or newer (thread-block clusters, programmatic dependent launch)"
#endif

namespace sparkserve {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMTiles = 2;                  // m16 tiles per warp
constexpr int kRowsPerWarp = 16 * kMTiles;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kChunk = 64;                  // K per step (16 bytes of codes per lane and row)
constexpr int kStages = 4;                  // chunks of weights in registers: one computed, three in flight
constexpr int kMaxSplits = 16;              // the largest cluster (non-portable; 8 is portable)
constexpr int kMaxT = static_cast<int>(kFp8FewTokensMax);
static_assert(kMaxT <= 8, "one n8 token tile");
// Activation code rows are L + 4 f16 apart (L a multiple of 64): a row stride of 8 bytes mod 128, so
// the 8-byte fragment loads of a half-warp (4 rows g x 4 lanes q, 32 bytes apart) hit distinct banks.
constexpr int kXPad = 4;
constexpr int kPartLd = kRowsPerBlock + 4;  // f32 partial-sum rows: the 4 q lanes' rows in distinct banks
constexpr int64_t kSmemMost = 200 * 1024;

struct FewArgs {
  const uint8_t* w;           // [rows, K] E4M3, row stride K
  const float* x;             // [T, K] f32
  const float* static_scale;  // [1] the static activation scale, or null (dynamic per-token scales)
  const float* ws;            // [rows] weight scales
  float* out;                 // [T, ldo]
  int64_t K, rows, ldo;
  int T, chunks_per_split;
};

// Shared memory: x's slice [T][L] f32, reused after the main loop for the partial sums [T][kPartLd]
// f32; the activation codes [T][L + kXPad] f16; the partial maxima and the scales, [kMaxT] f32 each.
__host__ __device__ inline int64_t raw_bytes(int chunks_per_split, int T) {
  const int64_t raw = static_cast<int64_t>(T) * chunks_per_split * kChunk * 4, part = int64_t{T} * kPartLd * 4;
  return raw > part ? raw : part;
}
__host__ __device__ inline int64_t codes_bytes(int chunks_per_split, int T) {
  return (int64_t{T} * (chunks_per_split * kChunk + kXPad) * 2 + 15) / 16 * 16;
}
inline int64_t smem_bytes(int chunks_per_split, int T) {
  return raw_bytes(chunks_per_split, T) + codes_bytes(chunks_per_split, T) + 2 * kMaxT * 4;
}



// grid: (S, ceil(rows / 128)), clusters of (S, 1, 1): block (r, b) = K split r of row block b.
__global__ void __launch_bounds__(kThreads) fp8_few_tokens_kernel(FewArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  const cg::cluster_group cluster = cg::this_cluster();
  const int S = static_cast<int>(cluster.num_blocks()), split = static_cast<int>(cluster.block_rank());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4, tid = threadIdx.x;
  const int T = a.T;
  const int L = a.chunks_per_split * kChunk, ldx = L + kXPad;
  float* raw = reinterpret_cast<float*>(smem);  // x's slice, then the partial sums
  float* part = raw;
  __half* xs = reinterpret_cast<__half*>(smem + raw_bytes(a.chunks_per_split, T));
  float* amax_s = reinterpret_cast<float*>(smem + raw_bytes(a.chunks_per_split, T) + codes_bytes(a.chunks_per_split, T));
  float* scale_s = amax_s + kMaxT;

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
  // while it finishes and while the prologue runs.
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st)
    if (c0 + st < c1) load(buf[st], c0 + st);
  asm volatile("griddepcontrol.wait;" ::: "memory");

  // Prologue: x's slice into shared memory, every copy in flight at once (one L2 round trip).
  const int64_t k0 = c0 * kChunk;
  const int n4 = static_cast<int>(c1 - c0) * (kChunk / 4);  // float4 per token row of the slice
  for (int i = tid; i < T * n4; i += kThreads) {
    const int t = i / n4, c = i % n4;
    cp_async16(raw + t * L + 4 * c, a.x + t * a.K + k0 + 4 * c);
  }
  cp_async_commit();
  cp_async_wait_all();
  __syncthreads();
  // The partial amax of each token row over the slice, exchanged in the cluster.
  if (a.static_scale == nullptr) {
    for (int t = warp; t < T; t += kWarps) {
      float m = 0.0f;
      for (int c = lane; c < n4; c += 32) {
        const float4 v = *reinterpret_cast<const float4*>(raw + t * L + 4 * c);
        m = fmaxf(m, fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
      }
      for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      if (lane == 0) amax_s[t] = m;
    }
    cluster.sync();  // every block's partial maxima written
  }
  if (tid < T) {
    float s;
    if (a.static_scale != nullptr) {
      s = *a.static_scale;
    } else {
      float m = 0.0f;
      for (int r = 0; r < S; ++r) m = fmaxf(m, *cluster.map_shared_rank(amax_s + tid, r));
      s = fp8_token_scale_from_amax(m);
    }
    scale_s[tid] = s;
  }
  __syncthreads();
  // The codes of the slice.
  for (int i = tid; i < T * n4; i += kThreads) {
    const int t = i / n4, c = i % n4;
    store_codes4<Fp8CodeOrder::kNatural>(xs + t * ldx, 4 * c,
                                         codes4(*reinterpret_cast<const float4*>(raw + t * L + 4 * c), scale_s[t]));
  }
  __syncthreads();  // the codes written; x's slice read for the last time

  const __half* xp = xs + min(g, T - 1) * ldx + 16 * q;  // token columns past T read row T - 1 (not stored)
  float acc[kMTiles][4];
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[i][e] = 0.0f;
  auto compute = [&](const uint4 (&wq)[2 * kMTiles], int64_t c) {
    const int off = static_cast<int>(c - c0) * kChunk;
#pragma unroll
    for (int s = 0; s < 4; ++s) {
      const uint2 xb = *reinterpret_cast<const uint2*>(xp + off + 4 * s);
#pragma unroll
      for (int i = 0; i < kMTiles; ++i) {
        const uint32_t lo = code_word(wq[2 * i], s), hi = code_word(wq[2 * i + 1], s);
        const uint32_t af[4] = {e4m3x2_f16x2(lo), e4m3x2_f16x2(hi), e4m3x2_f16x2(lo >> 16), e4m3x2_f16x2(hi >> 16)};
        mma_f16_16816(acc[i], af, xb.x, xb.y);
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
  // C fragment: acc[i] = rows (tile i) g and g + 8, tokens 2 q and 2 q + 1.
  if (S == 1) {
#pragma unroll
    for (int i = 0; i < kMTiles; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t n = row0 + 16 * i + 8 * h + g;
        if (n >= a.rows) continue;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int t = 2 * q + e;
          if (t < T) a.out[t * a.ldo + n] = acc[i][2 * h + e] * (scale_s[t] * a.ws[n]);
        }
      }
    return;
  }
#pragma unroll
  for (int i = 0; i < kMTiles; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int t = 2 * q + e;
        if (t < T) part[t * kPartLd + warp * kRowsPerWarp + 16 * i + 8 * h + g] = acc[i][2 * h + e];
      }
  cluster_split_sum_store<kThreads, kRowsPerBlock, kPartLd, kMaxSplits>(cluster, part, S, split, T, tid, row_base,
                                                                         a.rows, a.out, a.ldo, scale_s, a.ws);
}

// The largest cluster this device runs the kernel in (16 where non-portable sizes are allowed, else 8).
int most_splits() {
  static const int most = [] {
    if (cudaFuncSetAttribute(fp8_few_tokens_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
        cudaSuccess) {
      (void)cudaGetLastError();
      return 8;
    }
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(kMaxSplits);
    cfg.blockDim = dim3(kThreads);
    int n = 0;
    if (cudaOccupancyMaxPotentialClusterSize(&n, fp8_few_tokens_kernel, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      return 8;
    }
    return n >= kMaxSplits ? kMaxSplits : 8;
  }();
  return most;
}

// Launch configuration: clusters of the S splits of a row block, programmatic stream serialization
// (the weight loads overlap the tail of the kernel before).
PdlLaunch launch_config(int splits, int64_t row_blocks, int64_t smem, cudaStream_t stream) {
  static int64_t allowed = 0;
  allow_smem(fp8_few_tokens_kernel, smem, allowed);
  return PdlLaunch(dim3(static_cast<unsigned>(splits), static_cast<unsigned>(row_blocks)), dim3(kThreads), smem,
                   stream, static_cast<unsigned>(splits));
}

// Clusters of `splits` blocks with `smem` bytes each that the device holds at once (cached: the query
// is a driver call).
int resident_clusters(int splits, int64_t smem) {
  static std::mutex mu;
  static std::map<std::pair<int, int64_t>, int> cache;
  const std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find({splits, smem});
  if (it != cache.end()) return it->second;
  PdlLaunch l = launch_config(splits, 1, smem, nullptr);
  cudaLaunchConfig_t& cfg = l.cfg;
  cfg.numAttrs = 1;  // the cluster shape only
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, fp8_few_tokens_kernel, &cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    n = 0;
  }
  cache[{splits, smem}] = n;
  return n;
}

// K splits: the most (up to a cluster; each split at least two chunks) whose row blocks all run in one
// wave of resident clusters: every block then streams from the start, and a block's fixed costs
// (prologue, cluster barriers) are paid once per SM slot. Where no split count gives one wave, the
// fewest that fit shared memory. 0: none fits.
int plan_splits(int64_t T, int64_t rows, int64_t K) {
  static const int64_t budget = [] {  // the Blackwell consumer parts have ~100 KB per block
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return std::min<int64_t>(kSmemMost, optin);
  }();
  const int64_t chunks = K / kChunk, row_blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  const int most = static_cast<int>(std::min<int64_t>(most_splits(), std::max<int64_t>(1, chunks / 2)));
  int fallback = 0;
  for (int s = most; s >= 1; --s) {
    const int64_t per = (chunks + s - 1) / s;
    if ((chunks + per - 1) / per != s) continue;  // an empty split: the same as fewer splits
    const int64_t smem = smem_bytes(static_cast<int>(per), static_cast<int>(T));
    if (smem > budget) continue;
    const int resident = resident_clusters(s, smem);
    if (resident == 0) continue;
    fallback = s;
    if (row_blocks <= resident) return s;
  }
  return fallback;
}

}  // namespace

bool fp8_few_tokens_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w) {
  if (T < 1 || T > kFp8FewTokensMax || !fp8_w8a8_takes(w, kChunk) || (reinterpret_cast<uintptr_t>(x) & 15u) != 0)
    return false;
  const int64_t K = w.in_features, N = w.out_features;
  // A static activation scale may differ per partition: each partition's rows get x quantized with
  // its own scale. Dynamic scales are per token, the same for every partition.
  const bool stat = w.activation == ActivationQuant::kFp8TensorStatic;
  const int64_t parts = stat && w.partitions > 1 ? w.partitions : 1, rows = N / parts;
  const int64_t row_blocks = (rows + kRowsPerBlock - 1) / kRowsPerBlock;
  if (N == 0) return true;
  const int splits = plan_splits(T, rows, K);
  if (splits == 0 || row_blocks > 65535) return false;  // a slice that does not fit shared memory
  FewArgs a{};
  a.K = K;
  a.rows = rows;
  a.ldo = N;
  a.T = static_cast<int>(T);
  a.x = x;
  const int64_t chunks = K / kChunk;
  a.chunks_per_split = static_cast<int>((chunks + splits - 1) / splits);
  const auto* wq = static_cast<const uint8_t*>(w.weight.data);
  const auto* ws = static_cast<const float*>(w.weight_scale.data);
  const auto* is = static_cast<const float*>(w.input_scale.data);
  for (int64_t p = 0; p < parts; ++p) {
    a.w = wq + p * rows * K;
    a.ws = ws + p * rows;
    a.out = out + p * rows;
    a.static_scale = stat ? is + p : nullptr;
    const PdlLaunch l = launch_config(splits, row_blocks, smem_bytes(a.chunks_per_split, a.T), b.stream());
    CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, fp8_few_tokens_kernel, a));
  }
  return true;
}

}  // namespace sparkserve
