// Grouped bf16 experts on the tensor cores (moe_bf16_grouped.h). Block (n block, tile): 8 warps, each
// 16 weight rows of the tile's expert on the MMA's M side, streamed once from global memory straight
// into A fragments; the tile's slots (up to 16 per pass, 8 per n8 group) are the N side, their x
// rows read from L1/L2 and split in registers. Memory-bound at the few slots per expert of decode and
// speculative batches (122B MTP layer at 192 rows: ~6 per expert), where the per-slot GEMVs read an
// expert once per slot and the SIMT tiles are compute-bound.
//
// The k order inside each 32-wide chunk is permuted (a dot product does not depend on it): lane
// quad t loads 8 consecutive values k0 + 8t .. 8t + 7 of a weight row as one 16-byte load, and the
// same 8 of each x row; pairs 0 and 1 are its fragment columns (2t, 2t + 8) of the first k16 step,
// pairs 2 and 3 those of the second, identically on the A (weights) and B (x) sides.
//
// Numerics: x = hi + mid + lo exactly (three bf16 roundings of the remainders: 8 + 8 + 8 significant
// bits hold f32's 24; for |x| < 2^-110 the last part would fall below bf16's smallest subnormal, far
// under any sum's rounding), each product with a bf16 weight exact in f32; hi products go to one f32
// accumulator, mid + lo (2^-8 smaller) to another, added at the end. The tensor core adds each k16
// step into its f32 accumulator truncating (up to ~1 ulp of the partial sum per step, toward zero:
// 2.3e-5 of the partial sums over K = 3072 if they ran in one accumulator), so the hi products of each
// 128-wide k chunk are summed on the tensor core from zero (8 steps, a chunk's partial sum) and the
// chunks added in f32 with rounding to nearest: the result differs from the CPU's sequential f32 sum
// by about the summation order's own error (tests/gpu/moe_bf16_checks.cpp: kFp32).
#include <cuda_bf16.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/mma_primitives.cuh"
#include "backend/cuda/moe_bf16_grouped.h"
#include "core/check.h"

namespace sparkserve {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps, kRowsPerWarp = 16, kBlockRows = kWarps * kRowsPerWarp;
constexpr int kGroups = 2;  // n8 groups of slots per pass (16 slots: 115 registers, no spills)
constexpr int kUnroll = 4;  // 32-wide k chunks of weights in flight per warp (16 KB per warp)

__device__ __forceinline__ uint32_t pack_bf16(__nv_bfloat16 a, __nv_bfloat16 b) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(a)) | (static_cast<uint32_t>(__bfloat16_as_ushort(b)) << 16);
}

// x0, x1 -> exact three-part bf16 split, packed in pairs (x0 in the low half).
__device__ __forceinline__ void split3_pack(float x0, float x1, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
  const __nv_bfloat16 h0 = __float2bfloat16_rn(x0), h1 = __float2bfloat16_rn(x1);
  const float r0 = x0 - __bfloat162float(h0), r1 = x1 - __bfloat162float(h1);
  const __nv_bfloat16 m0 = __float2bfloat16_rn(r0), m1 = __float2bfloat16_rn(r1);
  hi = pack_bf16(h0, h1);
  mid = pack_bf16(m0, m1);
  lo = pack_bf16(__float2bfloat16_rn(r0 - __bfloat162float(m0)), __float2bfloat16_rn(r1 - __bfloat162float(m1)));
}

// w: [E, N, K] bf16, x: [*, K] f32 -> out: [slots, N] f32
__global__ void __launch_bounds__(kThreads, 2)
    grouped_bf16_mma_kernel(float* out, const float* x, int64_t x_div, SlotTiles tiles, const __nv_bfloat16* w,
                            int64_t K, int64_t N) {
  const int tile = static_cast<int>(blockIdx.y);
  if (tile >= *tiles.num_tiles) return;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * kBlockRows + warp * kRowsPerWarp;
  if (n0 >= N) return;
  const int64_t e = tiles.tile_e[tile];
  const int start = tiles.tile_start[tile], rows = tiles.tile_rows[tile];
  const __nv_bfloat16* w0 = w + (e * N + n0 + g) * K + 8 * t;  // rows g and g + 8 of the warp's 16
  const __nv_bfloat16* w8 = w0 + 8 * K;
  for (int r0 = 0; r0 < rows; r0 += 8 * kGroups) {
    const int groups = min(kGroups, (rows - r0 + 7) / 8);
    const float* xr[kGroups];  // this lane's B column (slot r0 + 8j + g) of group j; null past the tile
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
      const int r = r0 + 8 * j + g;
      xr[j] = r < rows ? x + (tiles.sorted[start + r] / x_div) * K + 8 * t : nullptr;
    }
    float acc_hi[kGroups][4] = {}, acc_lo[kGroups][4] = {};
    for (int64_t k0 = 0; k0 < K; k0 += 32 * kUnroll) {
      float part[kGroups][4] = {};  // this chunk's hi products: see the note on accumulation above
      uint4 a0[kUnroll], a8[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t kk = k0 + 32 * u;
        if (kk < K) {
          a0[u] = __ldcs(reinterpret_cast<const uint4*>(w0 + kk));
          a8[u] = __ldcs(reinterpret_cast<const uint4*>(w8 + kk));
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t kk = k0 + 32 * u;
        if (kk >= K) break;
        const uint32_t s0[4] = {a0[u].x, a8[u].x, a0[u].y, a8[u].y};  // first k16 step
        const uint32_t s1[4] = {a0[u].z, a8[u].z, a0[u].w, a8[u].w};  // second
#pragma unroll
        for (int j = 0; j < kGroups; ++j) {
          if (j >= groups) break;
          float4 va = make_float4(0.0f, 0.0f, 0.0f, 0.0f), vb = va;
          if (xr[j]) {
            va = __ldg(reinterpret_cast<const float4*>(xr[j] + kk));
            vb = __ldg(reinterpret_cast<const float4*>(xr[j] + kk + 4));
          }
          uint32_t h[4], m[4], l[4];
          split3_pack(va.x, va.y, h[0], m[0], l[0]);
          split3_pack(va.z, va.w, h[1], m[1], l[1]);
          split3_pack(vb.x, vb.y, h[2], m[2], l[2]);
          split3_pack(vb.z, vb.w, h[3], m[3], l[3]);
          mma_bf16_16816(part[j], s0, h[0], h[1]);
          mma_bf16_16816(part[j], s1, h[2], h[3]);
          mma_bf16_16816(acc_lo[j], s0, m[0], m[1]);
          mma_bf16_16816(acc_lo[j], s1, m[2], m[3]);
          mma_bf16_16816(acc_lo[j], s0, l[0], l[1]);
          mma_bf16_16816(acc_lo[j], s1, l[2], l[3]);
        }
      }
#pragma unroll
      for (int j = 0; j < kGroups; ++j)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc_hi[j][c] += part[j][c];
    }
    // C fragment: c0, c1 at (weight row g, slots 2t, 2t + 1 of the group), c2, c3 at row g + 8.
#pragma unroll
    for (int j = 0; j < kGroups; ++j) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int r = r0 + 8 * j + 2 * t + c;
        if (r >= rows) continue;
        float* o = out + static_cast<int64_t>(tiles.sorted[start + r]) * N + n0 + g;
        o[0] = acc_hi[j][c] + acc_lo[j][c];
        o[8] = acc_hi[j][2 + c] + acc_lo[j][2 + c];
      }
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

bool grouped_bf16_mma_takes(const void* w, const float* x, int64_t K, int64_t N) {
  return K > 0 && N > 0 && K % 32 == 0 && N % kRowsPerWarp == 0 && aligned16(w) && aligned16(x);
}

void launch_grouped_bf16_mma(cudaStream_t s, float* out, const float* x, int64_t x_div, const SlotTiles& tiles,
                             const void* w, int64_t K, int64_t N) {
  CHECK(grouped_bf16_mma_takes(w, x, K, N));
  if (tiles.max_tiles == 0) return;
  CHECK_MSG(tiles.max_tiles <= 65535, "CUDA grouped bf16 experts: too many (token, expert) tiles in one call");
  const dim3 grid(blocks_for(N, kBlockRows), static_cast<unsigned>(tiles.max_tiles));
  grouped_bf16_mma_kernel<<<grid, kThreads, 0, s>>>(out, x, x_div, tiles, static_cast<const __nv_bfloat16*>(w), K, N);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sparkserve
