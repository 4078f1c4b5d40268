// Grouped NVFP4 W4A4 GEMM, small-N regime (nvfp4_group_gemm.h): up to 8 activation rows per work pair
// (batched decode: a few tokens per routed expert), memory-bound, so the weights go straight from
// global memory into registers like a GEMV. A block's 4 warps share one work item, two m16 tiles
// (gate_up: 16 gate rows and the same up rows; plain: 32 consecutive rows), and split its K: warp w
// takes the 128-k chunks w, w+4, ... (so the block reads 256 consecutive bytes of a row at a time),
// lane (g, t) streaming 16 bytes of rows g and g+8 of each tile per chunk (k 32t..32t+31 of the
// chunk: 4 words, 8 mmas) with kU chunks in flight; the few activation rows (L2-resident, shared by
// the warps through L1) by 16-byte loads of the prepared layout. The partial sums are added in warp
// order through shared memory (deterministic) and warp 0 runs the epilogue. Decode and mma:
// nvfp4_group_common.cuh.
#include <algorithm>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/nvfp4_group_common.cuh"
#include "backend/cuda/nvfp4_group_gemm.h"

namespace sparkserve {
namespace {

constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kChunk = 128;  // k per chunk: 64 payload bytes and 8 block scales per row
constexpr int kU = 3;        // chunks in flight per lane (4 rows x 16 bytes each)

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

template <bool kGateUp>
__global__ void __launch_bounds__(kThreads) group_gemv_kernel(const GroupGemmArgs a) {
  __shared__ float partial[kWarps - 1][2][4][32];  // warps 1..3's sums: [tile][register][lane]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t K = a.K, M = a.M, rb = K / 2, sb = K / 16, nch = K / kChunk;
  const int64_t groups = M / 32;  // gate_up: 16 gate rows and their 16 up rows; plain: 32 rows
  const int64_t num_pairs = num_work_pairs(a, 8);
  const int64_t Mp = M / a.P;
  for (int64_t item = blockIdx.x; item < num_pairs * groups; item += gridDim.x) {
    const int64_t pair = item / groups, rg = item % groups;
    const WorkPair wp = work_pair(a, pair, 8);
    const int64_t e = wp.e, start = wp.start;
    const int rows = wp.rows;
    const int64_t row_a = kGateUp ? rg * 16 : rg * 32;
    const int64_t row_b = kGateUp ? M / 2 + rg * 16 : row_a + 16;
    const int part_a = kGateUp ? 0 : static_cast<int>(row_a / Mp);
    const int part_b = kGateUp ? a.P - 1 : part_a;
    const int read_a = read_partition(a.in_scale, e, a.P, part_a), read_b = read_partition(a.in_scale, e, a.P, part_b);
    const bool two_b = read_a != read_b;
    // This lane's rows (tile A rows g, g+8; tile B rows g, g+8) at this warp's first chunk.
    const uint8_t* wrow[4];
    const uint8_t* sp[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t row = e * M + (r < 2 ? row_a : row_b) + g + 8 * (r % 2);
      wrow[r] = a.w + row * rb + 16 * t + warp * 64;
      sp[r] = a.ws + row * sb + 2 * t + warp * 8;
    }
    // Column g of the pair (padding columns repeat the last row; their outputs are dropped).
    const int64_t tok = start + min(g, rows - 1);
    const __half* xa = a.xq + (tok * a.P + read_a) * K + 32 * t + warp * kChunk;
    const __half* xb = a.xq + (tok * a.P + read_b) * K + 32 * t + warp * kChunk;
    const int64_t n = (nch - warp + kWarps - 1) / kWarps;  // this warp's chunks: warp + kWarps * c
    float acc[2][4] = {};
    uint4 q[kU][4];
    uint32_t sc[kU][4];
    auto load = [&](int u, int64_t c) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        q[u][r] = ld_stream16(wrow[r] + c * (kWarps * 64));
        sc[u][r] = __ldg(reinterpret_cast<const unsigned short*>(sp[r] + c * (kWarps * 8)));
      }
    };
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (u < n) load(u, u);
    for (int64_t c0 = 0; c0 < n; c0 += kU) {
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t c = c0 + u;
        if (c >= n) break;
        uint4 ba[4], bb[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          ba[i] = __ldg(reinterpret_cast<const uint4*>(xa + c * (kWarps * kChunk) + 8 * i));
          bb[i] = two_b ? __ldg(reinterpret_cast<const uint4*>(xb + c * (kWarps * kChunk) + 8 * i)) : ba[i];
        }
        __half2 s[4][2];  // [row][block 2t, 2t+1], each broadcast to both halves
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const __half2 h = e4m3x2_to_half2(sc[u][r] & 0xffu, sc[u][r] >> 8);
          s[r][0] = __low2half2(h);
          s[r][1] = __high2half2(h);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          uint32_t fa[4], fb[4];
          decode_a<0>(word(q[u][0], i), word(q[u][1], i), s[0][i / 2], s[1][i / 2], fa);
          decode_a<0>(word(q[u][2], i), word(q[u][3], i), s[2][i / 2], s[3][i / 2], fb);
          mma16816(acc[0], fa, ba[i].x, ba[i].y);
          mma16816(acc[1], fb, bb[i].x, bb[i].y);
          decode_a<1>(word(q[u][0], i), word(q[u][1], i), s[0][i / 2], s[1][i / 2], fa);
          decode_a<1>(word(q[u][2], i), word(q[u][3], i), s[2][i / 2], s[3][i / 2], fb);
          mma16816(acc[0], fa, ba[i].z, ba[i].w);
          mma16816(acc[1], fb, bb[i].z, bb[i].w);
        }
        if (c + kU < n) load(u, c + kU);
      }
    }
    if (warp > 0) {
#pragma unroll
      for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int r = 0; r < 4; ++r) partial[warp - 1][x][r][lane] = acc[x][r];
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int w = 0; w < kWarps - 1; ++w)
#pragma unroll
        for (int x = 0; x < 2; ++x)
#pragma unroll
          for (int r = 0; r < 4; ++r) acc[x][r] += partial[w][x][r][lane];
      float(&fa)[1][4] = *reinterpret_cast<float(*)[1][4]>(acc[0]);
      float(&fb)[1][4] = *reinterpret_cast<float(*)[1][4]>(acc[1]);
      if constexpr (kGateUp) {
        const float d_in = a.act_in_scale[e];
        const float fg = global_factor(a.w_global[e * a.P + part_a], a.in_scale[e * a.P + part_a], a.modelopt);
        const float fu = global_factor(a.w_global[e * a.P + part_b], a.in_scale[e * a.P + part_b], a.modelopt);
        store_gate_up<1>(fa, fb, fg, fu, a.act_modelopt ? 1.0f / d_in : d_in, a.act, M / 2, start, row_a, 0, rows, g, t);
      } else {
        const float f = global_factor(a.w_global[e * a.P + part_a], a.in_scale[e * a.P + part_a], a.modelopt);
        store_plain<1>(fa, f, a.out, a.ldo, a.out_row, start, row_a, 0, rows, g, t);
        store_plain<1>(fb, f, a.out, a.ldo, a.out_row, start, row_b, 0, rows, g, t);
      }
    }
    __syncthreads();  // partial is rewritten by the next item
  }
}

template <bool kGateUp>
void launch(CudaBackend& b, const GroupGemmArgs& a) {
  auto kern = group_gemv_kernel<kGateUp>;
  static const int per_sm = [&] {
    int n = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kern, kThreads, 0));
    return std::max(1, n);
  }();
  const int64_t pairs = a.pair_e ? a.max_pairs : (a.dense_rows + 7) / 8;
  const int64_t grid = std::min<int64_t>(pairs * (a.M / 32), static_cast<int64_t>(per_sm) * b.sm_count());
  if (grid <= 0) return;
  kern<<<static_cast<unsigned>(grid), kThreads, 0, b.stream()>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_group_gemv(CudaBackend& b, const GroupGemmArgs& a) {
  if (a.gate_up)
    launch<true>(b, a);
  else
    launch<false>(b, a);
}

}  // namespace sparkserve
