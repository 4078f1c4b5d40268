// The row-dot machinery of the decode GEMVs (gemv_dense.cu, gemv_fp8_t1.cu, moe_decode.cu): weight
// decoding by format, activation rows quantized into swizzled shared memory, the per-row epilogue.
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
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/quant_math.cuh"

namespace sparkserve {
namespace gemv {

constexpr int kWarps = 8, kThreads = kWarps * 32;
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

// ---- host side ------------------------------------------------------------------------------

// What the kernels need to know about a weight, or false when they do not take it.
struct View {
  int fmt = 0;
  int64_t row_bytes = 0;
  int cpr = 0;
  bool modelopt = false;
};
inline bool make_view(const Linear& w, View& v) {
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

}  // namespace gemv
}  // namespace sparkserve
