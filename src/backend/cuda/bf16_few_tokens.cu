// bf16-weight Linear with a few hundred weight rows (the MoE router, 256 x H) at 2..64 tokens (batched
// decode, a speculative verify step): ONE kernel where bf16_split_linear runs three or four (split x
// into bf16 hi / lo, a cuBLASLt GEMM over 2T columns with its split-K reduction, add the halves), for
// a problem of 1-2 MB of weights that the GPU reads in well under a microsecond: there the kernel
// boundaries are the cost (~2 µs each in a replayed graph, docs/performance.md).
//
// A block owns 32 weight rows and one K slice; the S blocks of a row block (its K splits) form a
// thread-block cluster:
// - prologue: each warp loads its weight chunks into registers (16 bytes per lane and row: rows g and
//   g + 8 of both m16 tiles), then (the kernel before, which wrote x, has finished: programmatic
//   dependent launch) its x fragments straight from global memory (L2: x was just written).
// - main loop: mma.sync m16n8k16 with the weights as the M operand (16 rows per tile, two tiles) and
//   the tokens as N (n8 tiles), x split in registers into bf16 hi + lo (split_pack), two MMAs per step.
// - epilogue: each warp's partial sums go to shared memory, the block adds its 8 warps' in warp order,
//   the cluster synchronises, and block r adds the S blocks' sums of its share of the outputs in split
//   order (distributed shared memory) and stores them.
// So each weight byte is read from HBM once, x once per row block (T x K x 4 bytes x N / 32: 3 MB
// at the 122B router and 16 tokens, from L2).
//
// Numerics: those of bf16_gemm.cu's split path. x = hi + lo, hi = bf16(x), lo = bf16(x - hi) (the
// same roundings as split_bf16), each product w · hi and w · lo exact in f32, f32 sums (the MMA's
// accumulation over a warp's k chunks, then the warps in warp order, then the splits in split order:
// deterministic). So bf16_split_linear's bound holds: 2^-16 Σ_k |w_k x_k| + the f32 summation error.
//
// The MMA's k order is free (a dot product does not depend on it): lane quad t4's logical k {2t4,
// 2t4 + 1, 2t4 + 8, 2t4 + 9} of k16 step s are the 32-wide chunk's k 8 t4 + 4 s + {0, 1, 2, 3} for
// both operands, so one 16-byte load of a weight row holds a lane's A fragments of both steps and two
// float4 loads of a token row its B fragments (as bf16_small_n.cu).
#include <cooperative_groups.h>
#include <cuda_bf16.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/launch_config.cuh"
#include "backend/cuda/mma_primitives.cuh"
#include "backend/cuda/tc_gemm.h"
#include "core/check.h"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "bf16_few_tokens.cu needs sm_90 or newer (thread-block clusters, programmatic dependent launch)"
#endif

namespace sparkserve {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kMTiles = 2;                 // m16 weight tiles per block
constexpr int kRows = 16 * kMTiles;        // weight rows per block
constexpr int kChunk = 32;                 // k per chunk: 16 bytes of bf16 per lane and row
constexpr int kMaxChunksPerWarp = 2;       // weight chunks a warp holds in registers
constexpr int kMaxSplits = 16;             // the largest cluster (non-portable; 8 is portable)
constexpr int kMaxTiles = static_cast<int>(kBf16FewTokensMaxTokens / 8);  // n8 token tiles
static_assert(kBf16FewTokensMaxTokens % 8 == 0, "whole n8 tiles");

struct FewArgs {
  const __nv_bfloat16* __restrict__ w;  // [N, K]
  const float* __restrict__ x;          // [T, K]
  float* __restrict__ out;              // [T, N]
  int N, K, T;
  int chunks, cps;                      // K / 32; chunks per split
};

// Shared memory: the warps' partial sums [kWarps][8 NT tokens][kLd] f32, rows fastest (kLd = 36: a
// warp's fragment stores hit 32 distinct banks, and a warp's loads of 32 rows of one token, local or
// from another block of the cluster, are 128 contiguous bytes); the block's sums replace warp 0's.
constexpr int kLd = kRows + 4;
constexpr int64_t smem_bytes(int nt) { return int64_t{kWarps} * 8 * nt * kLd * 4; }

// Programmatic dependent launch (no-ops for launches that did not ask for it): wait blocks until the
// kernel before has completed and its writes are visible; launch_dependents lets the next kernel (the
// routing's) be scheduled once every block of this one has issued it, so its launch overlaps this
// kernel (it waits for this one's outputs at its own griddepcontrol.wait).
__device__ __forceinline__ void pdl_wait_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ void pdl_launch_next() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// grid: (S, ceil(N / 32)), clusters of (S, 1, 1): block (r, b) = K split r of row block b. NT: n8 token
// tiles (T <= 8 NT).
template <int NT>
__global__ void __launch_bounds__(kThreads) bf16_few_tokens_kernel(const FewArgs a) {
  extern __shared__ float part[];
  const cg::cluster_group cluster = cg::this_cluster();
  const int S = static_cast<int>(cluster.num_blocks()), split = static_cast<int>(cluster.block_rank());
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t4 = lane % 4;
  const int r0 = static_cast<int>(blockIdx.y) * kRows;
  const int c0 = split * a.cps, c1 = min(c0 + a.cps, a.chunks);

  // Weight chunks c0 + warp + 8 i of rows g, g + 8 of both m16 tiles (rows past N repeat the last; their
  // sums are not stored). They do not depend on the kernel before: loaded before griddepcontrol.wait.
  uint4 wv[kMaxChunksPerWarp][kMTiles][2];
#pragma unroll
  for (int i = 0; i < kMaxChunksPerWarp; ++i) {
    const int c = c0 + warp + kWarps * i;
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = min(r0 + 16 * mt + 8 * h + g, a.N - 1);
        wv[i][mt][h] = c < c1 ? ld_stream16(reinterpret_cast<const uint8_t*>(
                                    a.w + static_cast<int64_t>(row) * a.K + c * kChunk + 8 * t4))
                              : make_uint4(0, 0, 0, 0);
      }
  }
  pdl_launch_next();
  pdl_wait_grid();

  float d[kMTiles][NT][4];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) d[mt][nt][0] = d[mt][nt][1] = d[mt][nt][2] = d[mt][nt][3] = 0.0f;
#pragma unroll
  for (int i = 0; i < kMaxChunksPerWarp; ++i) {
    const int c = c0 + warp + kWarps * i;
    if (c >= c1) break;  // warp-uniform
    // Token 8 nt + g's k 8 t4 .. 8 t4 + 7 of the chunk (zeros past T).
    float4 xv[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int t = 8 * nt + g;
      if (t < a.T) {
        const float4* p = reinterpret_cast<const float4*>(a.x + static_cast<int64_t>(t) * a.K + c * kChunk + 8 * t4);
        xv[nt][0] = p[0];
        xv[nt][1] = p[1];
      } else {
        xv[nt][0] = xv[nt][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      uint32_t af[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        af[mt][0] = s == 0 ? wv[i][mt][0].x : wv[i][mt][0].z;  // row g,     k 8 t4 + 4 s + {0, 1}
        af[mt][1] = s == 0 ? wv[i][mt][1].x : wv[i][mt][1].z;  // row g + 8
        af[mt][2] = s == 0 ? wv[i][mt][0].y : wv[i][mt][0].w;  // row g,     k 8 t4 + 4 s + {2, 3}
        af[mt][3] = s == 0 ? wv[i][mt][1].y : wv[i][mt][1].w;  // row g + 8
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const float4 v = xv[nt][s];
        uint32_t hi0, lo0, hi1, lo1;
        split_pack(v.x, v.y, hi0, lo0);
        split_pack(v.z, v.w, hi1, lo1);
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_bf16_16816(d[mt][nt], af[mt], hi0, hi1);
          mma_bf16_16816(d[mt][nt], af[mt], lo0, lo1);
        }
      }
    }
  }

  // D fragment: rows g / g + 8 of the m16 tile, tokens 2 t4, 2 t4 + 1 of the n8 tile.
  float* mine = part + warp * 8 * NT * kLd;
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int row = 16 * mt + g, t = 8 * nt + 2 * t4;
      mine[t * kLd + row] = d[mt][nt][0];
      mine[(t + 1) * kLd + row] = d[mt][nt][1];
      mine[t * kLd + row + 8] = d[mt][nt][2];
      mine[(t + 1) * kLd + row + 8] = d[mt][nt][3];
    }
  __syncthreads();
  // The block's sums, warps in order, into warp 0's rows (each output read and written by one thread).
  for (int o = static_cast<int>(threadIdx.x); o < kRows * 8 * NT; o += kThreads) {
    const int at = (o / kRows) * kLd + o % kRows;
    float s = part[at];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) s += part[w * 8 * NT * kLd + at];
    part[at] = s;
  }
  cluster.sync();  // every block's sums written
  // Outputs (token, row) of this row block, rows fastest (coalesced loads and stores), shared out over
  // the cluster's blocks; each the S blocks' sums in split order, all S loads in flight at once.
  for (int o = split * kThreads + static_cast<int>(threadIdx.x); o < kRows * a.T; o += S * kThreads) {
    const int t = o / kRows, row = o % kRows, n = r0 + row;
    const int at = t * kLd + row;
    float v[kMaxSplits];
#pragma unroll
    for (int r = 0; r < kMaxSplits; ++r)
      if (r < S) v[r] = *cluster.map_shared_rank(part + at, r);
    float s = v[0];
#pragma unroll
    for (int r = 1; r < kMaxSplits; ++r)
      if (r < S) s += v[r];
    if (n < a.N) a.out[static_cast<int64_t>(t) * a.N + n] = s;
  }
  cluster.sync();  // no block leaves while another reads its shared memory
}

// Shared memory above 48 KB and clusters above 8 blocks are opt-in per instantiation (host-side calls,
// safe inside a stream capture).
template <int NT>
void allow(int64_t smem, int splits) {
  static int64_t allowed = 0;
  static bool non_portable = false;
  allow_smem(bf16_few_tokens_kernel<NT>, smem, allowed);
  if (splits > 8 && !non_portable) {
    CUDA_CHECK(cudaFuncSetAttribute(bf16_few_tokens_kernel<NT>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    non_portable = true;
  }
}

// The largest cluster this device runs the kernel in (up to 16 where non-portable sizes are allowed,
// else 8).
int most_splits() {
  static const int most = [] {
    const auto kern = bf16_few_tokens_kernel<kMaxTiles>;
    if (cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) {
      (void)cudaGetLastError();
      return 8;
    }
    allow<kMaxTiles>(smem_bytes(kMaxTiles), kMaxSplits);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(kMaxSplits);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = static_cast<size_t>(smem_bytes(kMaxTiles));
    int n = 0;
    if (cudaOccupancyMaxPotentialClusterSize(&n, kern, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();
      return 8;
    }
    return std::clamp(n, 8, kMaxSplits);
  }();
  return most;
}

template <int NT>
void launch(const FewArgs& a, int splits, int row_blocks, cudaStream_t stream) {
  const int64_t smem = smem_bytes(NT);
  allow<NT>(smem, splits);
  const PdlLaunch l(dim3(static_cast<unsigned>(splits), static_cast<unsigned>(row_blocks)), dim3(kThreads), smem,
                    stream, static_cast<unsigned>(splits));
  CUDA_CHECK(cudaLaunchKernelEx(&l.cfg, bf16_few_tokens_kernel<NT>, a));
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool bf16_few_tokens_takes(const Linear& w, int64_t T) {
  const int64_t K = w.in_features, N = w.out_features;
  return T >= 1 && T <= kBf16FewTokensMaxTokens && bf16_gemm_takes(w) && K % kChunk == 0 && N > 0 &&
         N <= kBf16FewTokensMaxRows && K <= int64_t{kChunk} * kWarps * kMaxChunksPerWarp * 8;
}

bool bf16_few_tokens_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w) {
  if (!bf16_few_tokens_takes(w, T) || (reinterpret_cast<uintptr_t>(x) & 15u) != 0) return false;
  const int64_t K = w.in_features, N = w.out_features;
  // K splits: one 32-wide chunk per warp and split where the cluster allows it (122B router: 96 chunks
  // in 12 splits of 8; 35B: 64 in 8), else up to kMaxChunksPerWarp per warp in the largest cluster.
  const int chunks = static_cast<int>(K / kChunk);
  int splits = std::min((chunks + kWarps - 1) / kWarps, most_splits());
  const int cps = (chunks + splits - 1) / splits;
  if (cps > kWarps * kMaxChunksPerWarp) return false;
  splits = (chunks + cps - 1) / cps;  // no empty split
  FewArgs a{};
  a.w = static_cast<const __nv_bfloat16*>(w.weight.data);
  a.x = x;
  a.out = out;
  a.N = static_cast<int>(N);
  a.K = static_cast<int>(K);
  a.T = static_cast<int>(T);
  a.chunks = chunks;
  a.cps = cps;
  const int row_blocks = static_cast<int>((N + kRows - 1) / kRows);
  const int nt = static_cast<int>((T + 7) / 8);
  switch (nt) {
    case 1: launch<1>(a, splits, row_blocks, b.stream()); break;
    case 2: launch<2>(a, splits, row_blocks, b.stream()); break;
    case 3:
    case 4: launch<4>(a, splits, row_blocks, b.stream()); break;
    default: launch<8>(a, splits, row_blocks, b.stream()); break;
  }
  return true;
}

}  // namespace sparkserve
