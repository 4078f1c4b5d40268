// Decode GEMVs (few tokens) for bf16 / FP8 / NVFP4 weights, dense and MoE (decode_gemv.h).
//
// Decode reads every weight once per step at ~2 FLOP per weight: it is bandwidth-bound, so these
// kernels are built to keep enough bytes in flight: 16-byte streaming weight loads (L1 bypassed),
// several independent rows and chunks per warp issued before any arithmetic, one weight pass shared
// by up to 8 tokens. The activation side (x, already quantized the way the Linear says) sits in
// shared memory, computed by each block's prologue with the CPU reference's exact operations
// (quant_math.cuh), so the quantized x̂ is bit-identical to the CPU's and no scratch round trip
// through device memory is needed.
//
// Numerics vs the CPU specification (backend/cpu/quant_linear.cpp): same x̂ bit for bit; the weight
// side is the same values, but the per-row / per-block scale is applied after the partial sum
// instead of to every weight (NVFP4: Σ_blocks factor_b · Σ_i e2m1_i x̂_i with factor_b =
// fp8(sf_b) · (1/gs) or · ws2; FP8 W8A16: ws[n] · Σ code·x), i.e. a different f32 rounding order of
// the same sum: ~1e-7 relative, the 1e-5 bound of the other fp32 ops (tests/gpu/ops_vs_cpu.cpp).
// W8A8 is as the CPU: the code products summed in f32, then (double)s_t · ws[n] · sum.
//
// E2M1 decoding without tables: the nibble (s e1 e0 m) placed at bits 9..12 of an f16 (mantissa top
// bit m at 9, exponent e1e0 at 10..11, sign moved from 12 to 15) is e2m1 · 2^-14 for every code,
// normal and subnormal; two codes per f16x2, widened to f32 exactly, 2^14 folded into the block
// factor.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_stream.h"
#include "backend/cuda/decode_gemv.h"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/quant_math.cuh"
#include "core/check.h"

namespace sparkserve {
namespace {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kMaxTokens = 8;                 // tokens sharing one pass over the weights
constexpr int kMaxExperts = 8;                // routed experts per token in the fused MoE
enum Fmt : int { kFmtBf16 = 0, kFmtFp8 = 1, kFmtNvfp4 = 2 };
constexpr int kActNone = static_cast<int>(ActivationQuant::kNone);
constexpr int kActNvfp4 = static_cast<int>(ActivationQuant::kNvfp4);
constexpr int kActFp8Dyn = static_cast<int>(ActivationQuant::kFp8TokenDynamic);
constexpr int kActFp8Static = static_cast<int>(ActivationQuant::kFp8TensorStatic);

// One weight row as the dot loop sees it.
struct Row {
  const uint8_t* w;   // row payload, 16-byte aligned
  const uint8_t* s;   // NVFP4: the row's K/16 E4M3 block scales
  const float* x;     // the activation row(s) the product reads (shared memory, swizzled), stride ldx
  float gmul;         // NVFP4: 2^14 / weight_global_scale (CT) or 2^14 · weight_scale_2 (ModelOpt)
  bool valid;
};

__device__ __forceinline__ float2 half2_bits_to_float2(uint32_t bits) {
  __half2_raw r;
  r.x = static_cast<unsigned short>(bits & 0xffffu);
  r.y = static_cast<unsigned short>(bits >> 16);
  return __half22float2(__half2(r));
}

// Codes i and i + 4 of the eight E2M1 nibbles in q, times 2^-14 (see the file comment).
template <int I>
__device__ __forceinline__ float2 e2m1_pair(uint32_t q) {
  uint32_t g = (I < 3 ? (q << (9 - 4 * I)) : (q >> 3)) & 0x1E001E00u;
  g += (g & 0x10001000u) * 7u;  // sign bit 12 -> 15 (and 28 -> 31)
  return half2_bits_to_float2(g);
}

// Two E4M3 codes (low 16 bits) widened exactly through f16.
__device__ __forceinline__ float2 e4m3_pair(uint32_t v) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  return __half22float2(__half2(h));
}

__device__ __forceinline__ float e4m3_scale(uint32_t b) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(b & 0xffu), __NV_E4M3)));
}

// Activation rows in shared memory are stored by float4 granule g (elements 4g..4g+3) at position
// swz(g): lane i of a warp reads chunk i, i.e. granules 16 bytes x (chunk elements / 4) apart, which
// in a plain layout puts 4-8 lanes of each 8-lane phase on the same banks (measured: a 4-8x slower
// FP8 / NVFP4 GEMV). XOR-ing the granule index with bits 3..5 permutes granules inside each aligned
// group of 8 (32 floats) so that the 8 lanes of a phase hit 8 different bank groups, for the 2-, 4-
// and 8-granule chunks of bf16, FP8 and NVFP4 alike. Rows are padded to a multiple of 32 floats.
__device__ __forceinline__ int64_t swz(int64_t g) { return g ^ ((g >> 3) & 7); }
__host__ __device__ constexpr int64_t padded32(int64_t k) { return (k + 31) / 32 * 32; }

// Weights of 8-weight group G of a 16-byte chunk widened to f32 (NVFP4: times 2^-14, the block
// factor applied to the block's partial sum).
template <int FMT, int G>
__device__ __forceinline__ void decode8(const uint4& q, float (&w)[8]) {
  const uint32_t word[4] = {q.x, q.y, q.z, q.w};
  if constexpr (FMT == kFmtBf16) {  // one group: 8 bf16
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[2 * j] = __uint_as_float(word[j] << 16);
      w[2 * j + 1] = __uint_as_float(word[j] & 0xffff0000u);
    }
  } else if constexpr (FMT == kFmtFp8) {  // two groups of 8 E4M3
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float2 lo = e4m3_pair(word[2 * G + j]), hi = e4m3_pair(word[2 * G + j] >> 16);
      w[4 * j] = lo.x;
      w[4 * j + 1] = lo.y;
      w[4 * j + 2] = hi.x;
      w[4 * j + 3] = hi.y;
    }
  } else {  // four groups of 8 E2M1 (one word each; two groups per 16-block)
    const uint32_t v = word[G];
    const float2 p0 = e2m1_pair<0>(v), p1 = e2m1_pair<1>(v), p2 = e2m1_pair<2>(v), p3 = e2m1_pair<3>(v);
    w[0] = p0.x; w[1] = p1.x; w[2] = p2.x; w[3] = p3.x;
    w[4] = p0.y; w[5] = p1.y; w[6] = p2.y; w[7] = p3.y;
  }
}

template <int FMT>
__host__ __device__ constexpr int groups_per_chunk() {
  return FMT == kFmtBf16 ? 1 : (FMT == kFmtFp8 ? 2 : 4);
}

// acc[r][t] += dot(group G of chunk c of row r, x_r[t]) over the group's 8 weights.
template <int FMT, int G, int NR, int TT, bool kSharedX>
__device__ __forceinline__ void group_fma(const uint4 (&q)[NR], const Row (&rows)[NR], int64_t ldx, int64_t k,
                                          float (&acc)[NR][TT]) {
  if constexpr (!kSharedX) {
    // Each row has its own activations: decode, load and use one row at a time, so only 8 decoded
    // weights are live (the MoE down kernel's 8 experts x 8 weights made it 165 registers, 1 block/SM).
    // Same products in the same order per accumulator as the shared-x path.
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      if (!rows[r].valid) continue;
      float w[8];
      decode8<FMT, G>(q[r], w);
#pragma unroll
      for (int t = 0; t < TT; ++t) {
        const float* xp = rows[r].x + t * ldx;
        const float4 a = *reinterpret_cast<const float4*>(xp + 4 * swz(k / 4));
        const float4 b = *reinterpret_cast<const float4*>(xp + 4 * swz(k / 4 + 1));
        float s = acc[r][t];
        s = fmaf(w[0], a.x, s);
        s = fmaf(w[1], a.y, s);
        s = fmaf(w[2], a.z, s);
        s = fmaf(w[3], a.w, s);
        s = fmaf(w[4], b.x, s);
        s = fmaf(w[5], b.y, s);
        s = fmaf(w[6], b.z, s);
        s = fmaf(w[7], b.w, s);
        acc[r][t] = s;
      }
    }
  } else {
    // All rows share the activations: decode every row first, then each x load serves NR rows.
    float w[NR][8];
#pragma unroll
    for (int r = 0; r < NR; ++r) decode8<FMT, G>(q[r], w[r]);
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      float4 a, b;
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        if (r == 0) {  // one activation load serves all rows
          const float* xp = rows[r].x + t * ldx;
          a = *reinterpret_cast<const float4*>(xp + 4 * swz(k / 4));
          b = *reinterpret_cast<const float4*>(xp + 4 * swz(k / 4 + 1));
        }
        if (!rows[r].valid) continue;
        float s = acc[r][t];
        s = fmaf(w[r][0], a.x, s);
        s = fmaf(w[r][1], a.y, s);
        s = fmaf(w[r][2], a.z, s);
        s = fmaf(w[r][3], a.w, s);
        s = fmaf(w[r][4], b.x, s);
        s = fmaf(w[r][5], b.y, s);
        s = fmaf(w[r][6], b.z, s);
        s = fmaf(w[r][7], b.w, s);
        acc[r][t] = s;
      }
    }
  }
}

// acc[r][t] += dot(16-byte chunk c of row r, x_r[t]) for all NR rows.
template <int FMT, int NR, int TT, bool kSharedX>
__device__ __forceinline__ void chunk_rows(const uint4 (&q)[NR], const uint32_t (&sc)[NR], const Row (&rows)[NR],
                                           int64_t ldx, int c, float (&acc)[NR][TT]) {
  constexpr int kElems = 8 * groups_per_chunk<FMT>();
  const int64_t k = static_cast<int64_t>(c) * kElems;
  if constexpr (FMT != kFmtNvfp4) {
    group_fma<FMT, 0, NR, TT, kSharedX>(q, rows, ldx, k, acc);
    if constexpr (FMT == kFmtFp8) group_fma<FMT, 1, NR, TT, kSharedX>(q, rows, ldx, k + 8, acc);
  } else {
#pragma unroll
    for (int blk = 0; blk < 2; ++blk) {
      float bs[NR][TT];
#pragma unroll
      for (int r = 0; r < NR; ++r)
#pragma unroll
        for (int t = 0; t < TT; ++t) bs[r][t] = 0.0f;
      if (blk == 0) {
        group_fma<FMT, 0, NR, TT, kSharedX>(q, rows, ldx, k, bs);
        group_fma<FMT, 1, NR, TT, kSharedX>(q, rows, ldx, k + 8, bs);
      } else {
        group_fma<FMT, 2, NR, TT, kSharedX>(q, rows, ldx, k + 16, bs);
        group_fma<FMT, 3, NR, TT, kSharedX>(q, rows, ldx, k + 24, bs);
      }
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        const float f = e4m3_scale(sc[r] >> (8 * blk)) * rows[r].gmul;
#pragma unroll
        for (int t = 0; t < TT; ++t) acc[r][t] = fmaf(f, bs[r][t], acc[r][t]);
      }
    }
  }
}

// acc[r][t] = this lane's share of dot(row r, x_r[t]) over the rows' cpr 16-byte chunks. All loads of
// U chunks x NR rows are issued before their arithmetic.
template <int FMT, int NR, int U, int TT, bool kSharedX>
__device__ __forceinline__ void rows_dot(const Row (&rows)[NR], int cpr, int64_t ldx, float (&acc)[NR][TT]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int t = 0; t < TT; ++t) acc[r][t] = 0.0f;
  for (int c0 = lane; c0 < cpr; c0 += 32 * U) {
    uint4 q[U][NR];
    uint32_t sc[U][NR];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + 32 * u;
#pragma unroll
      for (int r = 0; r < NR; ++r) {
        if (c < cpr && rows[r].valid) {
          q[u][r] = ld_stream16(rows[r].w + static_cast<int64_t>(c) * 16);
          if constexpr (FMT == kFmtNvfp4) sc[u][r] = __ldg(reinterpret_cast<const unsigned short*>(rows[r].s) + c);
          else sc[u][r] = 0;
        } else {
          q[u][r] = make_uint4(0, 0, 0, 0);
          sc[u][r] = 0;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + 32 * u;
      if (c < cpr) chunk_rows<FMT, NR, TT, kSharedX>(q[u], sc[u], rows, ldx, c, acc);
    }
  }
}

// Two f32 values quantized to E4M3 at scale s and widened back (the CPU's fp8(x / s) per value) with the
// hardware conversions: the same codes and values as quant_math.cuh fp8_quant_value, fewer instructions.
__device__ __forceinline__ float2 fp8_quant_pair(float a, float b, float s) {
  const __nv_fp8x2_storage_t c =
      __nv_cvt_float2_to_fp8x2(make_float2(__fdiv_rn(a, s), __fdiv_rn(b, s)), __NV_SATFINITE, __NV_E4M3);
  return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(c, __NV_E4M3)));
}

// The activation rows the product reads, computed by the whole block: xs[t, :] for t < TT from
// x[t, :] (t < T; zero rows above T), quantized as `act` says with the partition's input scale;
// ts[t] = the FP8 activation scale of token t. Uses red[kWarps * TT]. Ends with a barrier.
// kHwFp8: FP8 values through fp8_quant_pair (the dense GEMVs) instead of fp8_quant_value (the MoE
// kernels, left as they were measured).
// x: [T, K] f32 (global) -> xs: [TT, ldx] f32 (shared, swizzled), ts: [TT]
template <int TT, bool kHwFp8 = false>
__device__ void quantize_rows(float* xs, int64_t ldx, float* ts, float* red, const float* x, int T, int64_t K,
                              int act, bool modelopt, float in_s) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (act == kActNvfp4) {
    // Four threads per 16-block (4 values each), the block amax by two shuffles.
    const float gs = modelopt ? 1.0f / in_s : in_s;
    const int64_t quads = static_cast<int64_t>(TT) * K / 4;
    const int64_t rounds = (quads + kThreads - 1) / kThreads;
    for (int64_t i = 0; i < rounds; ++i) {
      const int64_t qd = i * kThreads + tid;
      const int64_t t = TT == 1 ? 0 : qd * 4 / K, k = qd * 4 - t * K;  // no 64-bit division at one token
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (qd < quads && t < T) v = *reinterpret_cast<const float4*>(x + t * K + k);
      float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      if (qd < quads) {
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t < T) {
          float sf, out_scale;
          nvfp4_block_scales(amax, gs, sf, out_scale);
          o.x = nvfp4_fake_quant_value(v.x, sf, out_scale, gs, in_s, modelopt);
          o.y = nvfp4_fake_quant_value(v.y, sf, out_scale, gs, in_s, modelopt);
          o.z = nvfp4_fake_quant_value(v.z, sf, out_scale, gs, in_s, modelopt);
          o.w = nvfp4_fake_quant_value(v.w, sf, out_scale, gs, in_s, modelopt);
        }
        *reinterpret_cast<float4*>(xs + t * ldx + 4 * swz(k / 4)) = o;
      }
    }
  } else if (act == kActNone) {
    for (int t = 0; t < TT; ++t)
      for (int64_t k = tid * 4; k < K; k += kThreads * 4)
        *reinterpret_cast<float4*>(xs + t * ldx + 4 * swz(k / 4)) =
            t < T ? *reinterpret_cast<const float4*>(x + t * K + k) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  } else {
    if (act == kActFp8Dyn) {  // every thread's share of every token's amax, then one reduction
      float amax[TT];
#pragma unroll
      for (int t = 0; t < TT; ++t) {
        amax[t] = 0.0f;
        if (t < T)
          for (int64_t k = tid * 4; k < K; k += kThreads * 4) {
            const float4 v = *reinterpret_cast<const float4*>(x + t * K + k);
            amax[t] = fmaxf(amax[t], fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w))));
          }
        for (int o = 16; o > 0; o >>= 1) amax[t] = fmaxf(amax[t], __shfl_xor_sync(0xffffffffu, amax[t], o));
        if (lane == 0) red[warp * TT + t] = amax[t];
      }
      __syncthreads();
      if (tid < T) {
        float m = 0.0f;
        for (int w = 0; w < kWarps; ++w) m = fmaxf(m, red[w * TT + tid]);
        ts[tid] = fp8_token_scale_from_amax(m);
      }
    } else if (tid < T) {
      ts[tid] = in_s;
    }
    __syncthreads();
    for (int t = 0; t < TT; ++t)
      for (int64_t k = tid * 4; k < K; k += kThreads * 4) {
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t < T) {
          const float4 v = *reinterpret_cast<const float4*>(x + t * K + k);
          const float s = ts[t];
          if constexpr (kHwFp8) {
            const float2 lo = fp8_quant_pair(v.x, v.y, s), hi = fp8_quant_pair(v.z, v.w, s);
            o = make_float4(lo.x, lo.y, hi.x, hi.y);
          } else {
            o = make_float4(fp8_quant_value(v.x, s), fp8_quant_value(v.y, s), fp8_quant_value(v.z, s),
                            fp8_quant_value(v.w, s));
          }
        }
        *reinterpret_cast<float4*>(xs + t * ldx + 4 * swz(k / 4)) = o;
      }
  }
  __syncthreads();
}

__device__ __forceinline__ float nvfp4_gmul(float g, bool modelopt) {
  return modelopt ? g * 16384.0f : __fdiv_rn(16384.0f, g);
}

// The row's output from its lane-reduced sum: FP8 applies the row scale (and the token scale for W8A8).
template <int FMT>
__device__ __forceinline__ float finish(float sum, int act, const float* ws, int64_t n, float ts) {
  if constexpr (FMT == kFmtFp8) {
    const float s = ws[n];
    if (act == kActNone) return sum * s;
    return static_cast<float>(static_cast<double>(ts) * s * static_cast<double>(sum));
  } else {
    return sum;
  }
}

// ---- dense ----------------------------------------------------------------------------------

struct DenseArgs {
  const uint8_t* w;
  const uint8_t* ws;     // NVFP4: E4M3 [N, K/16]; FP8: f32 [N]
  const float* gscale;   // NVFP4 [P]
  const float* iscale;   // [P] or null
  const float* x;        // [T, K]
  float* out;            // [T, ldo]
  int64_t K, Np, ldo, row_bytes, rows_per_cta;
  int T, cpr, act, modelopt;
  int interleave;        // 1 partition: warp g of the grid takes rows g·RPW + i·(all warps)·RPW
  int hw_fp8;            // FP8 activations via fp8_quant_pair (1) or, SPARKSERVE_FP8_T1=0, fp8_quant_value (0)
};

// grid: P x ceil(Np / rows_per_cta) blocks, each a run of rows inside one partition; warp w takes
// rows n0 + w*RPW.. (+ kWarps*RPW per step). Interleaved (one partition, a grid of ~2 blocks per SM):
// the rows go round-robin over all warps of the grid, so every SM gets the same share of rows to
// within one warp step (a run of rows per block left SMs with 2 and 3 blocks' worth).
template <int FMT, int RPW, int U, int TT>
__global__ void __launch_bounds__(kThreads) dense_gemv_kernel(DenseArgs a) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  __shared__ float ts[TT], red[kWarps * TT];
  int64_t p = 0, n0, n1, r_step = kWarps * RPW;
  if (a.interleave) {
    n0 = static_cast<int64_t>(blockIdx.x) * kWarps * RPW;
    n1 = a.Np;
    r_step = static_cast<int64_t>(gridDim.x) * kWarps * RPW;
    const int64_t first = min(static_cast<int64_t>(kWarps * RPW), n1 - n0);  // the block's first step
    prefetch_l2(a.w + n0 * a.row_bytes, first * a.row_bytes);
    if (FMT == kFmtNvfp4) prefetch_l2(a.ws + n0 * (a.K / 16), first * (a.K / 16));
  } else {
    const int64_t bpp = (a.Np + a.rows_per_cta - 1) / a.rows_per_cta;
    p = blockIdx.x / bpp;
    n0 = p * a.Np + (blockIdx.x % bpp) * a.rows_per_cta;
    n1 = min(n0 + a.rows_per_cta, (p + 1) * a.Np);
    prefetch_l2(a.w + n0 * a.row_bytes, (n1 - n0) * a.row_bytes);
    if (FMT == kFmtNvfp4) prefetch_l2(a.ws + n0 * (a.K / 16), (n1 - n0) * (a.K / 16));
  }
  const int64_t ldx = padded32(a.K);
  if (a.hw_fp8)
    quantize_rows<TT, true>(xs, ldx, ts, red, a.x, a.T, a.K, a.act, a.modelopt != 0, a.iscale ? a.iscale[p] : 1.0f);
  else
    quantize_rows<TT, false>(xs, ldx, ts, red, a.x, a.T, a.K, a.act, a.modelopt != 0, a.iscale ? a.iscale[p] : 1.0f);
  const float gmul = FMT == kFmtNvfp4 ? nvfp4_gmul(a.gscale[p], a.modelopt != 0) : 0.0f;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t r0 = n0 + warp * RPW; r0 < n1; r0 += r_step) {
    Row rows[RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const bool valid = r0 + r < n1;
      const int64_t n = valid ? r0 + r : r0;
      rows[r] = Row{a.w + n * a.row_bytes, FMT == kFmtNvfp4 ? a.ws + n * (a.K / 16) : nullptr, xs, gmul, valid};
    }
    float acc[RPW][TT];
    rows_dot<FMT, RPW, U, TT, true>(rows, a.cpr, ldx, acc);
#pragma unroll
    for (int r = 0; r < RPW; ++r)
#pragma unroll
      for (int t = 0; t < TT; ++t) {
        const float s = warp_sum(acc[r][t]);
        if (lane == (r * TT + t) % 32 && rows[r].valid && t < a.T)
          a.out[t * a.ldo + r0 + r] =
              finish<FMT>(s, a.act, reinterpret_cast<const float*>(a.ws), r0 + r, FMT == kFmtFp8 ? ts[t] : 0.0f);
      }
  }
}

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

// ---- MoE ------------------------------------------------------------------------------------

struct MoeArgs {
  // gate_up [E, 2I, H] (P 1 or 2 partitions) and down [E, H, I] (one partition)
  const uint8_t *gw, *gws, *dw, *dws;
  const float *ggs, *gis, *dgs, *dis;
  int64_t g_row_bytes, d_row_bytes;
  int g_cpr, d_cpr, g_act, d_act, g_P, g_modelopt, d_modelopt;
  const float* x;          // [T, H]
  float* xq;               // [T*k, P, padded32(H)]: each slot's gate_up input, quantized once (swizzled)
  float* xts;              // [T*k, P]: its FP8 activation scales
  const int32_t* ids;      // [T, k]
  const float* weights;    // [T, k]
  float* act;              // [T*k, I]: silu(gate)*up, already quantized for down's input
  float* out;              // [T, H]
  int64_t H, I, E, k, rows_per_cta;
};

// Each (token, slot) pair's gate_up input for partition blockIdx.y, quantized once with the
// expert's input scale (was: by every gate_up block of the slot, 32 blocks at T = 1).
__global__ void __launch_bounds__(kThreads) moe_quantize_x_kernel(MoeArgs a) {
  __shared__ float ts[1], red[kWarps];
  const int64_t slot = blockIdx.x, t = slot / a.k;
  const int p = static_cast<int>(blockIdx.y);
  const int64_t e = a.ids[slot];
  if (e < 0 || e >= a.E) __trap();
  const int64_t ldx = padded32(a.H);
  quantize_rows<1>(a.xq + (slot * a.g_P + p) * ldx, ldx, ts, red, a.x + t * a.H, 1, a.H, a.g_act,
                   a.g_modelopt != 0, a.gis ? a.gis[e * a.g_P + p] : 1.0f);
  if (threadIdx.x == 0) a.xts[slot * a.g_P + p] = ts[0];  // only meaningful for FP8 activations
}

// One (token, slot) pair per blockIdx.y, gate rows [n0, n1) per blockIdx.x (a multiple of 16, so the
// epilogue can quantize whole NVFP4 blocks of the down projection's input). Capped at 128 registers
// so that two blocks share an SM (the launch sizes the grid for that).
template <int FMT, int RPW, int U>
__global__ void __launch_bounds__(kThreads, 2) moe_gate_up_kernel(MoeArgs a) {
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);  // [P][H]
  const int64_t ldx = padded32(a.H);
  float* acts = xs + a.g_P * ldx;               // [rows_per_cta]
  __shared__ float ts[2];
  const int64_t slot = blockIdx.y;
  const int64_t e = a.ids[slot];
  if (e < 0 || e >= a.E) __trap();  // the CPU reference CHECKs this too
  const int64_t N = 2 * a.I, H = a.H;
  const int64_t n0 = static_cast<int64_t>(blockIdx.x) * a.rows_per_cta, n1 = min(n0 + a.rows_per_cta, a.I);
  const uint8_t* wbase = a.gw + e * N * a.g_row_bytes;
  const uint8_t* sbase = FMT == kFmtNvfp4 ? a.gws + e * N * (H / 16) : nullptr;
  prefetch_l2(wbase + n0 * a.g_row_bytes, (n1 - n0) * a.g_row_bytes);
  prefetch_l2(wbase + (a.I + n0) * a.g_row_bytes, (n1 - n0) * a.g_row_bytes);
  if (FMT == kFmtNvfp4) {
    prefetch_l2(sbase + n0 * (H / 16), (n1 - n0) * (H / 16));
    prefetch_l2(sbase + (a.I + n0) * (H / 16), (n1 - n0) * (H / 16));
  }
  // The slot's quantized input (moe_quantize_x_kernel) from L2, every load issued before any store.
  {
    stage_to_shared(xs, a.xq + slot * a.g_P * ldx, a.g_P * ldx * 4);
    if (threadIdx.x < a.g_P) ts[threadIdx.x] = a.xts[slot * a.g_P + threadIdx.x];
    __syncthreads();
  }
  const int pu = a.g_P - 1;  // partition of the up rows
  const float gm0 = FMT == kFmtNvfp4 ? nvfp4_gmul(a.ggs[e * a.g_P], a.g_modelopt != 0) : 0.0f;
  const float gm1 = FMT == kFmtNvfp4 ? nvfp4_gmul(a.ggs[e * a.g_P + pu], a.g_modelopt != 0) : 0.0f;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* wsf = reinterpret_cast<const float*>(a.gws) + e * N;
  for (int64_t r0 = n0 + warp * RPW; r0 < n1; r0 += kWarps * RPW) {
    Row rows[2 * RPW];
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const bool valid = r0 + r < n1;
      const int64_t n = valid ? r0 + r : r0;
      rows[r] = Row{wbase + n * a.g_row_bytes, sbase ? sbase + n * (H / 16) : nullptr, xs, gm0, valid};
      rows[RPW + r] = Row{wbase + (a.I + n) * a.g_row_bytes, sbase ? sbase + (a.I + n) * (H / 16) : nullptr,
                          xs + pu * ldx, gm1, valid};
    }
    float acc[2 * RPW][1];
    rows_dot<FMT, 2 * RPW, U, 1, false>(rows, a.g_cpr, ldx, acc);
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
      const float g = finish<FMT>(warp_sum(acc[r][0]), a.g_act, wsf, r0 + r, ts[0]);
      const float u = finish<FMT>(warp_sum(acc[RPW + r][0]), a.g_act, wsf, a.I + r0 + r, ts[pu]);
      if (lane == r && rows[r].valid) acts[r0 + r - n0] = silu_f(g) * u;
    }
  }
  __syncthreads();
  // Epilogue: the down projection's input quantization of these rows (local to 16-blocks / elements),
  // four threads per NVFP4 block as in quantize_rows.
  float* o = a.act + slot * a.I + n0;
  const int64_t nr = n1 - n0;
  const float d_in = a.dis ? a.dis[e] : 1.0f;
  if (a.d_act == kActNvfp4) {
    const bool mo = a.d_modelopt != 0;
    const float gs = mo ? 1.0f / d_in : d_in;
    const int64_t quads = nr / 4, rounds = (quads + kThreads - 1) / kThreads;
    for (int64_t i = 0; i < rounds; ++i) {
      const int64_t qd = i * kThreads + threadIdx.x;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (qd < quads) v = *reinterpret_cast<const float4*>(acts + qd * 4);
      float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      if (qd < quads) {
        float sf, out_scale;
        nvfp4_block_scales(amax, gs, sf, out_scale);
        o[qd * 4] = nvfp4_fake_quant_value(v.x, sf, out_scale, gs, d_in, mo);
        o[qd * 4 + 1] = nvfp4_fake_quant_value(v.y, sf, out_scale, gs, d_in, mo);
        o[qd * 4 + 2] = nvfp4_fake_quant_value(v.z, sf, out_scale, gs, d_in, mo);
        o[qd * 4 + 3] = nvfp4_fake_quant_value(v.w, sf, out_scale, gs, d_in, mo);
      }
    }
  } else if (a.d_act == kActFp8Static) {
    for (int64_t i = threadIdx.x; i < nr; i += kThreads) o[i] = fp8_quant_value(acts[i], d_in);
  } else {
    for (int64_t i = threadIdx.x; i < nr; i += kThreads) o[i] = acts[i];
  }
}

// One token per blockIdx.y, down rows [h0, h1) per blockIdx.x; each warp computes one output row h
// against all of the token's k experts at once (k rows in flight), then the routing-weighted sum in
// ascending expert id (HF's eager order, as the CPU reference).
// Capped at 128 registers: two blocks per SM (16 warps streaming), as the launch's grid assumes.
template <int FMT, int U>
__global__ void __launch_bounds__(kThreads, 2) moe_down_kernel(MoeArgs a) {
  constexpr int KE = kMaxExperts;
  __shared__ int64_t s_e[KE];
  __shared__ float s_w[KE], s_gm[KE], s_ts[KE];
  __shared__ int s_order[KE];
  const int64_t t = blockIdx.y, I = a.I, H = a.H;
  const int k = static_cast<int>(a.k);
  const int64_t h0 = static_cast<int64_t>(blockIdx.x) * a.rows_per_cta, h1 = min(h0 + a.rows_per_cta, H);
  if (threadIdx.x < k) {
    const int j = threadIdx.x;
    const int64_t e = a.ids[t * k + j];
    if (e < 0 || e >= a.E) __trap();
    s_e[j] = e;
    s_w[j] = a.weights[t * k + j];
    s_gm[j] = FMT == kFmtNvfp4 ? nvfp4_gmul(a.dgs[e], a.d_modelopt != 0) : 0.0f;
    s_ts[j] = a.dis ? a.dis[e] : 1.0f;
  }
  __syncthreads();
  // Each warp prefetches one expert's rows of this block; thread j ranks expert j (ascending id,
  // ids of a token are distinct; equal ids keep slot order).
  for (int j = threadIdx.x / 32; j < k; j += kWarps) {
    const int64_t e = s_e[j];
    const uint8_t* base = a.dw + (e * H + h0) * a.d_row_bytes;
    for (int64_t off = (threadIdx.x % 32) * 128; off < min((h1 - h0) * a.d_row_bytes, int64_t{64 * 1024});
         off += 32 * 128)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(base + off));
  }
  if (threadIdx.x < k) {
    const int i = threadIdx.x;
    int rank = 0;
    for (int j = 0; j < k; ++j) rank += s_e[j] < s_e[i] || (s_e[j] == s_e[i] && j < i);
    s_order[rank] = i;
  }
  __syncthreads();
  // The token's k activation rows (already quantized by the gate_up kernel) into shared memory.
  extern __shared__ float4 smem4[];
  float* xs = reinterpret_cast<float*>(smem4);
  const int64_t ldx = padded32(I);
  for (int j = 0; j < k; ++j)
    for (int64_t g = threadIdx.x; g < I / 4; g += kThreads)
      *reinterpret_cast<float4*>(xs + j * ldx + 4 * swz(g)) =
          *reinterpret_cast<const float4*>(a.act + (t * k + j) * I + 4 * g);
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int64_t h = h0 + warp; h < h1; h += kWarps) {
    Row rows[KE];
#pragma unroll
    for (int j = 0; j < KE; ++j) {
      const bool valid = j < k;
      const int64_t e = s_e[valid ? j : 0];
      rows[j] = Row{a.dw + (e * H + h) * a.d_row_bytes, FMT == kFmtNvfp4 ? a.dws + (e * H + h) * (I / 16) : nullptr,
                    xs + (valid ? j : 0) * ldx, s_gm[valid ? j : 0], valid};
    }
    float acc[KE][1];
    rows_dot<FMT, KE, U, 1, false>(rows, a.d_cpr, ldx, acc);
    float y[KE];
#pragma unroll
    for (int j = 0; j < KE; ++j)
      y[j] = finish<FMT>(warp_sum(acc[j][0]), a.d_act, reinterpret_cast<const float*>(a.dws) + s_e[j < k ? j : 0] * H,
                         h, s_ts[j < k ? j : 0]);
    if (lane == 0) {
      float o = 0.0f;
      for (int i = 0; i < k; ++i) {
        const int j = s_order[i];
        float yj = 0.0f;
#pragma unroll
        for (int jj = 0; jj < KE; ++jj)
          if (jj == j) yj = y[jj];
        o += s_w[j] * yj;
      }
      a.out[t * H + h] = o;
    }
  }
}

// ---- host side ------------------------------------------------------------------------------

// What the kernels need to know about a weight, or false when they do not take it.
struct View {
  int fmt = 0;
  int64_t row_bytes = 0;
  int cpr = 0;
  bool modelopt = false;
};
bool make_view(const Linear& w, View& v) {
  const int64_t K = w.in_features;
  if ((reinterpret_cast<uintptr_t>(w.weight.data) & 15u) != 0) return false;
  switch (w.format) {
    case WeightFormat::kBf16:
      if (w.activation != ActivationQuant::kNone) return false;
      v.fmt = kFmtBf16;
      v.row_bytes = K * 2;
      break;
    case WeightFormat::kFp8Channel:
    case WeightFormat::kFp8Tensor:
      if (w.activation == ActivationQuant::kNvfp4) return false;
      v.fmt = kFmtFp8;
      v.row_bytes = K;
      break;
    case WeightFormat::kNvfp4:
    case WeightFormat::kNvfp4ModelOpt:
      if (w.activation != ActivationQuant::kNone && w.activation != ActivationQuant::kNvfp4) return false;
      if (K % 32 != 0) return false;
      v.fmt = kFmtNvfp4;
      v.row_bytes = K / 2;
      v.modelopt = w.format == WeightFormat::kNvfp4ModelOpt;
      break;
    default:
      return false;
  }
  if (v.row_bytes % 16 != 0 || v.row_bytes / 16 > (1 << 30)) return false;
  if (w.activation != ActivationQuant::kNone && w.activation != ActivationQuant::kFp8TokenDynamic &&
      w.input_scale.data == nullptr)
    return false;
  v.cpr = static_cast<int>(v.row_bytes / 16);
  return true;
}

template <int FMT, int RPW, int U, int TT>
void launch_dense_t(const DenseArgs& a, unsigned grid, int64_t smem, cudaStream_t s) {
  auto k = dense_gemv_kernel<FMT, RPW, U, TT>;
  static int64_t allowed = 0;
  allow_smem(k, smem, allowed);
  k<<<grid, kThreads, static_cast<size_t>(smem), s>>>(a);
  CUDA_CHECK_LAUNCH();
}

// Rows per warp and chunks per lane in flight: 4 x 16 bytes per lane either way. Several tokens or
// short rows: 4 rows at once (each activation load from shared memory serves 4 rows); one token and
// long rows: 4 chunks of one row. The interleaved FP8 GEMVs at one token keep more in flight: 6
// chunks when a row is 192 of them (K = 3072: one pass of the lane loop, no idle lanes), 8 for rows
// of 256 chunks and more (out_proj, K = 8192).
template <int FMT, int TT>
void launch_dense_rows(const DenseArgs& a, unsigned grid, int64_t smem, cudaStream_t s, bool long_rows) {
  if constexpr (TT == 1) {
    if (long_rows) {
      if constexpr (FMT == kFmtFp8) {
        if (a.interleave && a.cpr == 192) {
          launch_dense_t<FMT, 1, 6, TT>(a, grid, smem, s);
          return;
        }
        if (a.interleave && a.cpr >= 256) {
          launch_dense_t<FMT, 1, 8, TT>(a, grid, smem, s);
          return;
        }
      }
      launch_dense_t<FMT, 1, 4, TT>(a, grid, smem, s);
      return;
    }
  }
  launch_dense_t<FMT, 4, 1, TT>(a, grid, smem, s);
}

template <int FMT>
void launch_dense_fmt(const DenseArgs& a, int tt, unsigned grid, int64_t smem, cudaStream_t s, bool long_rows) {
  switch (tt) {
    case 1: launch_dense_rows<FMT, 1>(a, grid, smem, s, long_rows); break;
    case 2: launch_dense_rows<FMT, 2>(a, grid, smem, s, long_rows); break;
    case 4: launch_dense_rows<FMT, 4>(a, grid, smem, s, long_rows); break;
    default: launch_dense_rows<FMT, 8>(a, grid, smem, s, long_rows); break;
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

// SPARKSERVE_FP8_T1=0 (read once) takes the previous FP8 path instead, for A/B measurements:
// dense_gemv_kernel at T = 1 and quant_math.cuh's fp8_quant_value in every FP8 prologue.
bool fp8_t1_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("SPARKSERVE_FP8_T1");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return on;
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

bool decode_linear(CudaBackend& b, float* out, const float* x, int64_t T, const Linear& w) {
  View v;
  if (!make_view(w, v)) return false;
  const int64_t K = w.in_features, N = w.out_features, P = w.partitions;
  if (!is_quantized(w.format) && T > 2 * kMaxTokens) return false;  // bf16 prefill: the tiled GEMM
  if (P < 1 || N % P != 0 || K <= 0) return false;
  if ((reinterpret_cast<uintptr_t>(x) & 15u) != 0) return false;  // the prologue's float4 loads
  // Tokens per weight pass: a power of two (the kernels' register tiles) whose activations fit.
  int64_t chunk = kMaxTokens;
  while (chunk > 1 && chunk * padded32(K) * 4 > smem_budget()) chunk /= 2;
  if (padded32(K) * 4 > smem_budget()) return false;
  if (T == 0 || N == 0) return true;
  // One token, FP8 weights, an activation quantization the same for every partition.
  const bool fp8_t1 = fp8_t1_enabled();
  if (fp8_t1 && T == 1 && v.fmt == kFmtFp8 && (w.activation != ActivationQuant::kFp8TensorStatic || P == 1)) {
    Fp8T1Args a{};
    a.w = static_cast<const uint8_t*>(w.weight.data);
    a.ws = static_cast<const float*>(w.weight_scale.data);
    a.iscale = w.activation == ActivationQuant::kFp8TensorStatic ? static_cast<const float*>(w.input_scale.data)
                                                                 : nullptr;
    a.x = x;
    a.out = out;
    a.N = N;
    a.K = K;
    a.row_bytes = v.row_bytes;
    a.cpr = v.cpr;
    a.act = static_cast<int>(w.activation);
    launch_fp8_t1(a, b.sm_count(), b.stream());
    return true;
  }
  const int64_t Np = N / P;
  const bool long_rows = v.cpr >= 96 && T == 1;
  const int64_t unit = kWarps * (long_rows ? 1 : 4);  // rows per block step
  // Blocks for ~2 per SM, each at least one step of rows: the prologue runs once per block.
  const int64_t steps = (N + unit - 1) / unit;
  const int64_t per_block = std::max<int64_t>(1, steps / (2 * static_cast<int64_t>(b.sm_count())));
  DenseArgs a{};
  a.w = static_cast<const uint8_t*>(w.weight.data);
  a.ws = static_cast<const uint8_t*>(w.weight_scale.data);
  a.gscale = is_nvfp4(w.format) ? static_cast<const float*>(w.global_scale.data) : nullptr;
  a.iscale = w.activation != ActivationQuant::kNone ? static_cast<const float*>(w.input_scale.data) : nullptr;
  a.K = K;
  a.Np = Np;
  a.ldo = N;
  a.row_bytes = v.row_bytes;
  a.rows_per_cta = unit * per_block;
  a.cpr = v.cpr;
  a.act = static_cast<int>(w.activation);
  a.modelopt = v.modelopt ? 1 : 0;
  a.hw_fp8 = fp8_t1 ? 1 : 0;
  // FP8 at one token with long rows (qkv, z, q, out_proj): rows round-robin over ~2 blocks per SM.
  a.interleave = v.fmt == kFmtFp8 && long_rows && P == 1 ? 1 : 0;
  const int64_t blocks = a.interleave ? std::min<int64_t>(steps, 2 * static_cast<int64_t>(b.sm_count()))
                                      : P * ((Np + a.rows_per_cta - 1) / a.rows_per_cta);
  CHECK(blocks <= INT32_MAX);
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int tc = static_cast<int>(std::min<int64_t>(chunk, T - t0));
    const int tt = tc <= 1 ? 1 : tc <= 2 ? 2 : tc <= 4 ? 4 : 8;  // <= chunk: both powers of two
    a.x = x + t0 * K;
    a.out = out + t0 * N;
    a.T = tc;
    const int64_t smem = tt * padded32(K) * 4;
    switch (v.fmt) {
      case kFmtBf16: launch_dense_fmt<kFmtBf16>(a, tt, static_cast<unsigned>(blocks), smem, b.stream(), long_rows); break;
      case kFmtFp8: launch_dense_fmt<kFmtFp8>(a, tt, static_cast<unsigned>(blocks), smem, b.stream(), long_rows); break;
      default: launch_dense_fmt<kFmtNvfp4>(a, tt, static_cast<unsigned>(blocks), smem, b.stream(), long_rows); break;
    }
  }
  return true;
}

namespace {

template <int FMT>
void launch_gate_up(const MoeArgs& a, dim3 grid, int64_t smem, cudaStream_t s) {
  // 2 gate + 2 up rows per warp, 3 chunks each in flight: one pass of the lane loop for an NVFP4 row
  // of H = 3072 (96 chunks), two for FP8.
  auto k = moe_gate_up_kernel<FMT, 2, 3>;
  static int64_t allowed = 0;
  allow_smem(k, smem, allowed);
  k<<<grid, kThreads, static_cast<size_t>(smem), s>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <int FMT, int U>
void launch_down_t(const MoeArgs& a, dim3 grid, int64_t smem, cudaStream_t s) {
  auto k = moe_down_kernel<FMT, U>;
  static int64_t allowed = 0;
  allow_smem(k, smem, allowed);
  k<<<grid, kThreads, static_cast<size_t>(smem), s>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <int FMT>
void launch_down(const MoeArgs& a, dim3 grid, int64_t smem, cudaStream_t s, bool two_chunks) {
  if (two_chunks)
    launch_down_t<FMT, 2>(a, grid, smem, s);
  else
    launch_down_t<FMT, 1>(a, grid, smem, s);
}

}  // namespace

namespace {
// decode_moe with only the launches `stages` names (bit 0 gate_up, bit 1 down) and the gate_up grid
// sized for gu_per_sm blocks per SM (0: the default, 2): decode_moe itself, and the kernel
// benchmark's split timing and grid sweep (decode_moe_probe).
bool decode_moe_impl(CudaBackend& b, float* out, const float* x, const int32_t* ids, const float* weights,
                     int64_t T, int64_t k, const Linear& gate_up, const Linear& down, int stages, int gu_per_sm) {
  View g, d;
  if (!make_view(gate_up, g) || !make_view(down, d)) return false;
  const int64_t H = gate_up.in_features, I = down.in_features, E = gate_up.weight.dim(0);
  if (k < 1 || k > kMaxExperts) return false;
  if ((reinterpret_cast<uintptr_t>(x) & 15u) != 0 || H % 4 != 0) return false;  // float4 prologue loads
  const int64_t P = gate_up.partitions;
  if (!(P == 1 || (P == 2 && gate_up.out_features / 2 == I))) return false;
  if (down.partitions != 1) return false;
  if (down.activation == ActivationQuant::kFp8TokenDynamic) return false;  // needs the whole row's amax
  if (d.fmt == kFmtNvfp4 && I % 16 != 0) return false;
  const int64_t slots = T * k;
  if (slots > 65535 || T > 65535) return false;
  // Gate rows per block: a multiple of 16 (the down input's NVFP4 blocks) and of the 16-row step.
  const int64_t unit = 16;
  const int64_t steps = (I + unit - 1) / unit;
  // ~2 blocks per SM (the kernel's register cap lets two share one): at T = 1, 8 slots x 32 blocks of
  // 32 gate rows (was 1 block per SM, 8 warps streaming per SM).
  const int64_t want_blocks =
      std::max<int64_t>(1, (gu_per_sm > 0 ? gu_per_sm : 2) * static_cast<int64_t>(b.sm_count()) / slots);
  const int64_t per_block = std::max<int64_t>(1, (steps + want_blocks - 1) / want_blocks);
  const int64_t rows_gu = unit * per_block;
  const int64_t smem_gu = (P * padded32(H) + rows_gu) * 4;
  const int64_t smem_d = k * padded32(I) * 4;
  if (smem_d > smem_budget() || I % 4 != 0) return false;
  if (smem_gu > smem_budget()) return false;
  if (T == 0) return true;
  CudaBackend::Scratch act(&b, static_cast<size_t>(slots * I) * 4),
      xq(&b, static_cast<size_t>(slots * P * padded32(H)) * 4), xts(&b, static_cast<size_t>(slots * P) * 4);
  MoeArgs a{};
  a.gw = static_cast<const uint8_t*>(gate_up.weight.data);
  a.gws = static_cast<const uint8_t*>(gate_up.weight_scale.data);
  a.dw = static_cast<const uint8_t*>(down.weight.data);
  a.dws = static_cast<const uint8_t*>(down.weight_scale.data);
  a.ggs = g.fmt == kFmtNvfp4 ? static_cast<const float*>(gate_up.global_scale.data) : nullptr;
  a.dgs = d.fmt == kFmtNvfp4 ? static_cast<const float*>(down.global_scale.data) : nullptr;
  a.gis = gate_up.activation != ActivationQuant::kNone ? static_cast<const float*>(gate_up.input_scale.data) : nullptr;
  a.dis = down.activation != ActivationQuant::kNone ? static_cast<const float*>(down.input_scale.data) : nullptr;
  a.g_row_bytes = g.row_bytes;
  a.d_row_bytes = d.row_bytes;
  a.g_cpr = g.cpr;
  a.d_cpr = d.cpr;
  a.g_act = static_cast<int>(gate_up.activation);
  a.d_act = static_cast<int>(down.activation);
  a.g_P = static_cast<int>(P);
  a.g_modelopt = g.modelopt ? 1 : 0;
  a.d_modelopt = d.modelopt ? 1 : 0;
  a.x = x;
  a.ids = ids;
  a.weights = weights;
  a.act = act.as<float>();
  a.xq = xq.as<float>();
  a.xts = xts.as<float>();
  a.out = out;
  a.H = H;
  a.I = I;
  a.E = E;
  a.k = k;
  a.rows_per_cta = rows_gu;
  const dim3 grid_gu(static_cast<unsigned>((I + rows_gu - 1) / rows_gu), static_cast<unsigned>(slots));
  if (stages & 1) {
    moe_quantize_x_kernel<<<dim3(static_cast<unsigned>(slots), static_cast<unsigned>(P)), kThreads, 0, b.stream()>>>(a);
    CUDA_CHECK_LAUNCH();
  }
  if (stages & 1) switch (g.fmt) {
      case kFmtBf16: launch_gate_up<kFmtBf16>(a, grid_gu, smem_gu, b.stream()); break;
      case kFmtFp8: launch_gate_up<kFmtFp8>(a, grid_gu, smem_gu, b.stream()); break;
      default: launch_gate_up<kFmtNvfp4>(a, grid_gu, smem_gu, b.stream()); break;
    }
  // Down: one output row per warp step; at most ~2 blocks per SM, all resident at once (rounded up:
  // at T = 1, 192 blocks of 16 rows instead of 384 of 8, half the activation staging per row).
  const int64_t dsteps = (H + kWarps - 1) / kWarps;
  const int64_t dwant = std::max<int64_t>(1, 2 * static_cast<int64_t>(b.sm_count()) / T);
  a.rows_per_cta = kWarps * std::max<int64_t>(1, (dsteps + dwant - 1) / dwant);
  const dim3 grid_d(static_cast<unsigned>((H + a.rows_per_cta - 1) / a.rows_per_cta), static_cast<unsigned>(T));
  const bool two = d.cpr >= 64;
  if (stages & 2) switch (d.fmt) {
      case kFmtBf16: launch_down<kFmtBf16>(a, grid_d, smem_d, b.stream(), two); break;
      case kFmtFp8: launch_down<kFmtFp8>(a, grid_d, smem_d, b.stream(), two); break;
      default: launch_down<kFmtNvfp4>(a, grid_d, smem_d, b.stream(), two); break;
    }
  return true;
}
}  // namespace

bool decode_moe(CudaBackend& b, float* out, const float* x, const int32_t* ids, const float* weights, int64_t T,
                int64_t k, const Linear& gate_up, const Linear& down) {
  return decode_moe_impl(b, out, x, ids, weights, T, k, gate_up, down, 3, 0);
}

bool decode_moe_probe(Backend& b, const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                      const Linear& gate_up, const Linear& down, int stages, int gu_blocks_per_sm) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  if (!c) return false;
  return decode_moe_impl(*c, out.ptr<float>(), x.ptr<const float>(), ids.ptr<const int32_t>(),
                         weights.ptr<const float>(), x.dim(0), ids.dim(1), gate_up, down, stages, gu_blocks_per_sm);
}

cudaStream_t cuda_stream_of(Backend& b) {
  auto* c = dynamic_cast<CudaBackend*>(&b);
  return c ? c->stream() : nullptr;
}

}  // namespace sparkserve
