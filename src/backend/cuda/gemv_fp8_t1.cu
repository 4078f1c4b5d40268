// The one-token FP8 GEMV (gemv_dense.h: fp8_t1_linear), decode's largest dense regime at batch 1.
#include "backend/cuda/gemv_dense.h"
#include "backend/cuda/gemv_rows.cuh"

namespace sparkserve {
namespace {
using namespace gemv;  // NOLINT(google-build-using-namespace): the GEMV building blocks

// ---- FP8, one token ---------------------------------------------------------------------------
//
// The one-token FP8 GEMV (qkv / z / q / k / v / out_proj / shared expert at batch 1): rows round-robin
// over every warp of a grid of 3 blocks per SM, each row cut into tiles of U 16-byte chunks per lane.
// What it does where dense_gemv_kernel stalled (H200, ncu on a first version with dense_gemv_kernel's
// inner loop and 2 blocks per SM: 0.5 instructions issued per scheduler cycle, ~100 per 16-byte chunk,
// 25% occupancy, 31-47% of DRAM bandwidth):
// - the warp's first tile is loaded into registers (and the next two prefetched into L2) before the
//   prologue, so the prologue runs under the first DRAM round trip instead of before it;
// - the prologue reads x once (global -> shared, raw), takes the amax, then quantizes its own granules
//   in place with the hardware conversions (f32 -> E4M3 pair, E4M3 pair -> f16x2 -> f32: exact, the
//   same codes and values as quant_math.cuh's fp8_quant_value, without its ldexpf decode: out_proj's
//   8192-value prologue was ~4 us of every block);
// - tiles are double-buffered: the next tile's loads are issued before the current one's arithmetic;
// - fewer instructions per chunk (44 in the inner loop: 4 LDS.128, 8 E4M3x2 -> f16x2, 16 f16 -> f32,
//   16 FFMA): per-lane shared-memory addresses fixed for the whole kernel, the rows walked by pointer
//   steps, no bounds checks when the tiles divide the row; <= 85 registers, so 24 warps per SM.
// Numerics as dense_gemv_kernel: the same x̂ and code products; each lane sums its U chunks in U
// separate f32 accumulators (a different, fixed summation order: deterministic, ~1e-7 relative).

struct Fp8T1Args {
  const uint8_t* w;      // [N, K] E4M3
  const float* ws;       // [N] row scales
  const float* iscale;   // static activation scale [1] or null
  const float* x;        // [K]
  float* out;            // [N]
  int64_t N, K, row_bytes;
  int cpr, act;
};

// Tile j of a row: wp is the lane's first chunk of the row (row base + 16 lane); chunks past the row
// end (cpr) read as zero and are skipped by the arithmetic.
template <int U, bool kFull>
__device__ __forceinline__ void fp8_t1_load(uint4 (&q)[U], const uint8_t* wp, int cpr, int j, int lane) {
  const int tile0 = j * 32 * U;
  const uint8_t* p = wp + tile0 * 16;
#pragma unroll
  for (int u = 0; u < U; ++u)
    q[u] = kFull || tile0 + 32 * u + lane < cpr ? ld_stream16(p + 512 * u) : make_uint4(0, 0, 0, 0);
}

// Four E4M3 codes -> f16x2 pairs (codes 0,1 and 2,3): the two halves of the word go to the
// conversion directly (no shift / mask instructions).
__device__ __forceinline__ void e4m3x4_to_f16x2(uint32_t w, uint32_t& h01, uint32_t& h23) {
  asm("{.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\tcvt.rn.f16x2.e4m3x2 %0, lo;\n\tcvt.rn.f16x2.e4m3x2 %1, hi;}"
      : "=r"(h01), "=r"(h23)
      : "r"(w));
}

// An f16x2 register widened to two f32, each conversion reading its half in place (through
// half2_bits_to_float2 the compiler split and re-packed the halves: 2 more instructions per pair).
__device__ __forceinline__ float2 f16x2_to_f32x2(uint32_t h) {
  float2 f;
  asm("{.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %2;\n\tcvt.f32.f16 %0, lo;\n\tcvt.f32.f16 %1, hi;}"
      : "=f"(f.x), "=f"(f.y)
      : "r"(h));
  return f;
}

// acc[u] += dot(chunk (tile j, u) of the row, x̂) for this lane. The chunk's four float4 granules
// 4c + i sit at swz(4c + i) = 4c ^ (i ^ m) with m = (lane >> 1) & 7 for every tile and u (c = lane +
// a multiple of 32), so xl[i] = xs + 4 * ((4 lane) ^ i ^ m) and the rest is an offset of 512 floats
// per 32 chunks: no swizzle arithmetic in the loop.
template <int U, bool kFull>
__device__ __forceinline__ void fp8_t1_fma(const uint4 (&q)[U], const float* const (&xl)[4], int cpr, int j,
                                           int lane, float (&acc)[U]) {
  const int tile0 = j * 32 * U;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int c = tile0 + 32 * u + lane;
    if (!kFull && c >= cpr) continue;
    const int off = (tile0 + 32 * u) * 16;  // floats: 4 granules x 4 floats per chunk
    const uint32_t word[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
    float s = acc[u];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4 xv = *reinterpret_cast<const float4*>(xl[i] + off);
      uint32_t h01, h23;
      e4m3x4_to_f16x2(word[i], h01, h23);
      const float2 lo = f16x2_to_f32x2(h01), hi = f16x2_to_f32x2(h23);
      s = fmaf(lo.x, xv.x, s);
      s = fmaf(lo.y, xv.y, s);
      s = fmaf(hi.x, xv.z, s);
      s = fmaf(hi.y, xv.w, s);
    }
    acc[u] = s;
  }
}

// kFull: the row is a whole number of tiles (cpr % (32 U) == 0), so no chunk needs a bounds check.
template <int U, int kMinBlocks, bool kFull>
__global__ void __launch_bounds__(kThreads, kMinBlocks) fp8_t1_kernel(Fp8T1Args a) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  __shared__ float red[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;
  const int64_t W = static_cast<int64_t>(gridDim.x) * kWarps;  // warps in the grid: the row step
  const int tpr = (a.cpr + 32 * U - 1) / (32 * U);              // tiles per row
  int64_t r = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  // The row walk as pointer steps (64-bit index products per tile were ~15% of the instructions).
  const int64_t row_step = W * a.row_bytes;
  const uint8_t* wp = a.w + r * a.row_bytes + 16 * lane;
  int j = 0;
  uint4 qa[U], qb[U];
  if (r < a.N) fp8_t1_load<U, kFull>(qa, wp, a.cpr, j, lane);
  // The warp's next two tiles into L2 (lines of 128 bytes, one per lane).
  {
    int64_t pr = r;
    int pj = j;
#pragma unroll
    for (int d = 0; d < 2; ++d) {
      if (++pj == tpr) { pj = 0; pr += W; }
      const int64_t first = static_cast<int64_t>(pj) * 32 * U, n = min(static_cast<int64_t>(32 * U), a.cpr - first);
      if (pr < a.N && lane < (n * 16 + 127) / 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a.w + pr * a.row_bytes + first * 16 + lane * 128));
    }
  }
  // Prologue: x (raw) into shared memory and the amax, then each thread quantizes its own granules.
  const int64_t G = a.K / 4;
  float amax = 0.0f;
  for (int64_t g0 = tid; g0 < G; g0 += 4 * kThreads) {
    float4 v[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (g0 + i * kThreads < G) v[i] = *reinterpret_cast<const float4*>(a.x + 4 * (g0 + i * kThreads));
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (g0 + i * kThreads < G) {
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)), fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
        *reinterpret_cast<float4*>(xs + 4 * swz(g0 + i * kThreads)) = v[i];
      }
  }
  float ts = 0.0f;  // the activation scale (FP8 W8A8)
  if (a.act != kActNone) {
    if (a.act == kActFp8Dyn) {
      for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
      if (lane == 0) red[warp] = amax;
      __syncthreads();
      float m = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) m = fmaxf(m, red[w]);
      ts = fp8_token_scale_from_amax(m);
    } else {
      ts = *a.iscale;
    }
    for (int64_t g = tid; g < G; g += kThreads) {  // the granules this thread stored
      float4* p = reinterpret_cast<float4*>(xs + 4 * swz(g));
      const float4 v = *p;
      const float2 lo = fp8_quant_pair(v.x, v.y, ts), hi = fp8_quant_pair(v.z, v.w, ts);
      *p = make_float4(lo.x, lo.y, hi.x, hi.y);
    }
  }
  __syncthreads();
  const float* xl[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) xl[i] = xs + 4 * ((4 * lane) ^ i ^ ((lane >> 1) & 7));
  float acc[U];
#pragma unroll
  for (int u = 0; u < U; ++u) acc[u] = 0.0f;
  // Double-buffered tile loop: qa holds tile (r, j); load the next into qb, compute qa, then swap roles.
  auto step = [&](uint4 (&cur)[U], uint4 (&nxt)[U]) {
    const bool last = j + 1 == tpr;  // row r complete after this tile
    const int64_t r2 = last ? r + W : r;
    const uint8_t* wp2 = last ? wp + row_step : wp;
    const int j2 = last ? 0 : j + 1;
    if (r2 < a.N) fp8_t1_load<U, kFull>(nxt, wp2, a.cpr, j2, lane);
    fp8_t1_fma<U, kFull>(cur, xl, a.cpr, j, lane, acc);
    if (last) {
      float sum = 0.0f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        sum += acc[u];
        acc[u] = 0.0f;
      }
      sum = warp_sum(sum);
      if (lane == 0) a.out[r] = finish<kFmtFp8>(sum, a.act, a.ws, r, ts);
    }
    r = r2;
    wp = wp2;
    j = j2;
  };
  while (r < a.N) {
    step(qa, qb);
    if (r >= a.N) break;
    step(qb, qa);
  }
}

template <int U, int kMinBlocks, bool kFull>
void launch_fp8_t1_k(const Fp8T1Args& a, int sm_count, cudaStream_t s) {
  const int64_t blocks = std::min<int64_t>((a.N + kWarps - 1) / kWarps, static_cast<int64_t>(kMinBlocks) * sm_count);
  const int64_t smem = padded32(a.K) * 4;
  auto k = fp8_t1_kernel<U, kMinBlocks, kFull>;
  static int64_t allowed = 0;
  allow_smem(k, smem, allowed);
  k<<<static_cast<unsigned>(blocks), kThreads, static_cast<size_t>(smem), s>>>(a);
  CUDA_CHECK_LAUNCH();
}
template <int U, int kMinBlocks>
void launch_fp8_t1_u(const Fp8T1Args& a, int sm_count, cudaStream_t s) {
  if (a.cpr % (32 * U) == 0) launch_fp8_t1_k<U, kMinBlocks, true>(a, sm_count, s);
  else launch_fp8_t1_k<U, kMinBlocks, false>(a, sm_count, s);
}

// One-token FP8 GEMV: three blocks of 256 threads per SM (<= 85 registers), tiles of 96 chunks
// (3 per lane) where they divide the row (K = 3072: 2 tiles), else 128 (K = 8192: 4 tiles), rows of
// at most 64 chunks in one 64-chunk tile. Measured on the H200 (gpu_ops --bench-kernels): two blocks
// per SM with whole-row tiles of 6 / 8 chunks was 7-25% slower; four blocks with 2-chunk tiles
// within +-5% (better for z / out_proj, worse for q / k).
void launch_fp8_t1(const Fp8T1Args& a, int sm_count, cudaStream_t s) {
  if (a.cpr <= 64) launch_fp8_t1_u<2, 3>(a, sm_count, s);
  else if (a.cpr % 96 == 0) launch_fp8_t1_u<3, 3>(a, sm_count, s);
  else launch_fp8_t1_u<4, 3>(a, sm_count, s);
}

}  // namespace

void fp8_t1_linear(CudaBackend& b, float* out, const float* x, const Linear& w, const gemv::View& v) {
  Fp8T1Args a{};
  a.w = static_cast<const uint8_t*>(w.weight.data);
  a.ws = static_cast<const float*>(w.weight_scale.data);
  a.iscale = w.activation == ActivationQuant::kFp8TensorStatic ? static_cast<const float*>(w.input_scale.data)
                                                               : nullptr;
  a.x = x;
  a.out = out;
  a.N = w.out_features;
  a.K = w.in_features;
  a.row_bytes = v.row_bytes;
  a.cpr = v.cpr;
  a.act = static_cast<int>(w.activation);
  launch_fp8_t1(a, b.sm_count(), b.stream());
}

}  // namespace sparkserve
