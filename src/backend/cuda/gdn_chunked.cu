// Chunked Gated DeltaNet prefill on tensor cores (mma.sync m16n8k16 fp16 x fp16 -> fp32, so one kernel
// serves sm_90, sm_100 and sm_120). The function is the CPU backend's gdn_chunked (chunk 64, HF
// torch_chunk_gated_delta_rule); per value head and chunk, with gamma = the in-chunk cumulative log decay,
// L_ij = beta_i k_i.k_j e^(gamma_i - gamma_j) (j < i), T = (I + L)^-1:
//   X_K = K S, X_Q = Q S                            (S: the state before the chunk, [dk, dv])
//   V'  = T R,  R = beta (V - e^gamma X_K)         (= the reference's U - W S, with W S folded into R)
//   O   = e^gamma X_Q + (QK^T (.) Gamma) V'        (Gamma_ij = e^(gamma_i - gamma_j), j <= i)
//   S   = e^gamma_C S + K^T (e^(gamma_C - gamma) V')
//
// Work split: one thread block per (span, value head, slice of Bv = 16 * kStateWarps state columns),
// walking the span's chunks in order.
//  - 4 prep warps run one chunk ahead (double-buffered shared memory): cp.async the chunk's normalised
//    fp16 q, k (written by gdn_qk_norm_kernel, shared by the value heads of a key head), g, beta;
//    gamma; KK^T and QK^T on tensor cores; -L and P = QK^T (.) Gamma (strictly lower) in fp16; the four
//    16 x 16 diagonal blocks of T by forward substitution in fp32.
//  - kStateWarps state warps each own 16 state columns: S^T [16, dk] stays in mma accumulators (f32)
//    for the whole span and is never stored to shared memory. V' is found by blocked substitution
//    over the chunk's four 16-row blocks (Y_i = R_i - sum_j L_ij V'_j; V'_i = Y_i + (T_ii - I) Y_i).
// Precision: every product has fp16 operands (10-bit mantissa, tf32's) and fp32 accumulation. The
// terms that dominate outputs are kept out of the fp16 products: the identity of T (V'_i = Y_i + ...)
// and the diagonal of QK^T (q_i.k_i from fp32 normalised vectors) are added in fp32. Operands without
// a bound (S, R, Y, V') are always the A operand with state columns as rows, so each row gets its own
// power-of-two scale from a max over its 4-lane quad: no overflow, no lost precision for small rows,
// and the scaling is exact. Normalised q, k, L, T and P are bounded by 1 in magnitude.
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {
namespace {

constexpr int kChunk = 64;
constexpr int kDk = 128;                 // key head dim the kernel is built for (Qwen3.5 / Qwen3-Next)
constexpr int kPrepWarps = 4;
constexpr int kPrepThreads = 32 * kPrepWarps;
constexpr int kKqStages = 3;             // prep reads chunk c+1, state warps chunk c, cp.async fills c+2
constexpr int kVPitch = 20;              // floats per staged V row (16 columns + 4: conflict-free reads)
constexpr int kScaleExp = 5;             // scaled rows have max |x| in [2^5, 2^6): V' = T R grows < 2^10

// Named barriers (0 is __syncthreads): prep-internal, then FULL[2] (prep -> state) and EMPTY[2].
constexpr int kBarPrep = 1, kBarFull = 2, kBarEmpty = 4;

// ---- shared memory layout (bytes) ---------------------------------------------------------------
constexpr int kKqBytes = 2 * kChunk * kDk * 2;          // one stage: K^ then Q^, fp16 [64][128] each
constexpr int kRawBytes = 3 * kChunk * 4;               // one stage: g, beta, q.k of the chunk's tokens
// One prep -> state buffer: -L and P fp16 [64][64], (T_ii - I) fp16 [4][16][16], per-token scalars.
constexpr int kLOff = 0, kPOff = kLOff + kChunk * kChunk * 2, kTdOff = kPOff + kChunk * kChunk * 2,
              kScOff = kTdOff + 4 * 256 * 2, kBufBytes = kScOff + (4 * kChunk + 4) * 4;
// Scalars within a buffer (floats): e^gamma, e^(gamma_C - gamma), beta, q.k, then e^gamma_C.
constexpr int kScEg = 0, kScEd = kChunk, kScBeta = 2 * kChunk, kScQk = 3 * kChunk, kScEgC = 4 * kChunk;
constexpr int kKqOff = 0, kRawOff = kKqOff + kKqStages * kKqBytes, kBufOff = kRawOff + kKqStages * kRawBytes,
              kLdOff = kBufOff + 2 * kBufBytes,          // prep scratch: L's diagonal blocks f32 [4][16][16]
    kGamOff = kLdOff + 4 * 256 * 4, kVOff = kGamOff + kChunk * 4;
constexpr int smem_bytes(int state_warps) { return kVOff + state_warps * 2 * kChunk * kVPitch * 4; }

// ---- PTX helpers --------------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// ldmatrix x4 at a shared-memory byte address.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// c += a b: a [16 x 16] row-major fp16 fragment, b [16 x 8] column fragment, c [16 x 8] f32.
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Copies 16 (or 4) bytes, or zero-fills them when valid is false (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 4 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most one committed group of this thread is still in flight.
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// A 16 x 16 A fragment from two adjacent 16 x 8 accumulator tiles (columns 0-7 and 8-15), times
// per-row factors (rows g and g + 8 of the fragment).
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4], float lo,
                                         float hi) {
  a[0] = pack_half2(c0[0] * lo, c0[1] * lo);
  a[1] = pack_half2(c0[2] * hi, c0[3] * hi);
  a[2] = pack_half2(c1[0] * lo, c1[1] * lo);
  a[3] = pack_half2(c1[2] * hi, c1[3] * hi);
}
// Power of two s with max * s in [2^kScaleExp, 2^(kScaleExp+1)) (1 for max 0), exponent clamped to
// +-60 so products of two scales stay normal floats. *inv = 1 / s.
__device__ __forceinline__ float pow2_scale(float max_abs, float* inv) {
  const int e = static_cast<int>((__float_as_uint(max_abs) >> 23) & 0xff);
  const int s = e == 0 ? 0 : min(60, max(-60, kScaleExp - (e - 127)));
  *inv = __uint_as_float(static_cast<uint32_t>(127 - s) << 23);
  return __uint_as_float(static_cast<uint32_t>(127 + s) << 23);
}
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
// Element offsets of swizzled fp16 tiles: rows of 128 (16-byte chunk ^ row % 8), rows of 64 (the
// same), and 16 x 16 blocks (chunk ^ (row / 4) % 2): ldmatrix and the fragment stores hit 32 banks.
__device__ __forceinline__ int swz128(int row, int chunk) { return row * kDk + ((chunk ^ (row & 7)) << 3); }
// ldmatrix lane addresses. A lane reads row `row` of 8 x 8 matrix `lane / 8`; the matrices of a
// 16 x 16 block are chosen by bits of lane / 8, so within a block every lane's row % 8 is lane % 8
// and its swizzled chunk is (2 kb + half) ^ (lane % 8) = ((half ^ lane % 8) << 4 bytes) ^ (kb << 5).
// Byte offset of a lane's row in block (rb, kb) of a swizzled tile with `row_bytes` rows:
//   rb * 16 * row_bytes + lane_off ^ (kb << 5),  lane_off = row * row_bytes + ((half ^ lane % 8) << 4).
__device__ __forceinline__ uint32_t lane_off(int row, int half, int row_bytes) {
  return static_cast<uint32_t>(row * row_bytes + (((half ^ row) & 7) << 4));
}
__device__ __forceinline__ int swz64(int row, int col) {
  return row * kChunk + ((((col >> 3) ^ row) & 7) << 3) + (col & 7);
}
__device__ __forceinline__ int swz16(int row, int col) {
  return row * 16 + ((((col >> 3) ^ (row >> 2)) & 1) << 3) + (col & 7);
}

// q^ = q / sqrt(sum q^2 + 1e-6) * scale, k^ = k / sqrt(sum k^2 + 1e-6) (HF l2norm, as the CPU backend)
// in fp16, and q^.k^ from the f32 values. One warp per (row of a span, key head).
// qkv: [R, conv_dim] f32 -> qn, kn: [R, Hk, 128] fp16, qk: [R, Hk] f32.
__global__ void gdn_qk_norm_kernel(__half* qn, __half* kn, float* qk, const float* qkv, DeviceLayout L, int Hk,
                                   int64_t conv_dim, float scale) {
  const int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (w >= static_cast<int64_t>(L.total_rows) * Hk) return;
  const int64_t row = w / Hk;
  const int kh = static_cast<int>(w % Hk);
  if (L.span_of_row(static_cast<int>(row)) < 0) return;
  const float* src = qkv + row * conv_dim + kh * kDk + 4 * lane;
  const float4 q = *reinterpret_cast<const float4*>(src);
  const float4 k = *reinterpret_cast<const float4*>(src + static_cast<int64_t>(Hk) * kDk);
  const float rq = 1.0f / sqrtf(warp_sum(q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w) + 1e-6f) * scale;
  const float rk = 1.0f / sqrtf(warp_sum(k.x * k.x + k.y * k.y + k.z * k.z + k.w * k.w) + 1e-6f);
  const float4 a = make_float4(q.x * rq, q.y * rq, q.z * rq, q.w * rq);
  const float4 b = make_float4(k.x * rk, k.y * rk, k.z * rk, k.w * rk);
  const int64_t o = (row * Hk + kh) * kDk + 4 * lane;
  *reinterpret_cast<uint2*>(qn + o) = make_uint2(pack_half2(a.x, a.y), pack_half2(a.z, a.w));
  *reinterpret_cast<uint2*>(kn + o) = make_uint2(pack_half2(b.x, b.y), pack_half2(b.z, b.w));
  const float d = warp_sum(a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w);
  if (lane == 0) qk[row * Hk + kh] = d;
}

struct ChunkArgs {
  float* out;          // [R, Hv, dv]
  const float* qkv;    // [R, conv_dim]: v of value head h at column v_off + h * dv
  const __half* qn;    // [R, Hk, 128]
  const __half* kn;    // [R, Hk, 128]
  const float* qk;     // [R, Hk]
  const float* g;      // [R, Hv]
  const float* beta;   // [R, Hv]
  float* state;        // [slots, Hv, 128, dv]
  DeviceLayout L;
  int Hv, Hk, dv, slices;
  int64_t conv_dim, v_off;
};

// ---- prep warps ---------------------------------------------------------------------------------
__device__ void prep_warps(const ChunkArgs& p, char* smem, int state_threads, int64_t row0, int n, int h, int kh) {
  const int pt = threadIdx.x, pw = pt / 32, lane = pt % 32, g = lane / 4, t = lane % 4;
  const int sync_count = kPrepThreads + state_threads;
  const int nchunks = (n + kChunk - 1) / kChunk;
  float* gam = reinterpret_cast<float*>(smem + kGamOff);
  float* Ld = reinterpret_cast<float*>(smem + kLdOff) + pw * 256;

  auto issue_loads = [&](int c) {
    const int t0 = c * kChunk;
    __half* kq = reinterpret_cast<__half*>(smem + kKqOff + (c % kKqStages) * kKqBytes);
#pragma unroll
    for (int i = 0; i < 16; ++i) {  // 64 rows x 16 chunks of 16 bytes, K^ then Q^
      const int idx = pt + kPrepThreads * i, which = idx >> 10, row = (idx >> 4) & 63, ch = idx & 15;
      const bool valid = t0 + row < n;
      const __half* src = (which ? p.qn : p.kn) + ((row0 + (valid ? t0 + row : 0)) * p.Hk + kh) * kDk + ch * 8;
      cp_async16(kq + which * kChunk * kDk + swz128(row, ch), src, valid);
    }
    float* raw = reinterpret_cast<float*>(smem + kRawOff + (c % kKqStages) * kRawBytes);
    const int tok = pt % kChunk;
    const bool valid = t0 + tok < n;
    const int64_t r = row0 + (valid ? t0 + tok : 0);
    if (pt < kChunk) {
      cp_async4(raw + tok, p.g + r * p.Hv + h, valid);
      cp_async4(raw + kChunk + tok, p.beta + r * p.Hv + h, valid);
    } else {
      cp_async4(raw + 2 * kChunk + tok, p.qk + r * p.Hk + kh, valid);
    }
  };

  if (nchunks > 0) issue_loads(0);
  cp_async_commit();
  for (int c = 0; c < nchunks; ++c) {
    const int b = c & 1;
    char* buf = smem + kBufOff + b * kBufBytes;
    __half* Ln = reinterpret_cast<__half*>(buf + kLOff);
    __half* P = reinterpret_cast<__half*>(buf + kPOff);
    __half* Td = reinterpret_cast<__half*>(buf + kTdOff);
    float* sc = reinterpret_cast<float*>(buf + kScOff);
    bar_sync(kBarEmpty + b, sync_count);  // the state warps are done with chunk c - 2
    if (c + 1 < nchunks) issue_loads(c + 1);
    cp_async_commit();
    cp_async_wait_one();
    bar_sync(kBarPrep, kPrepThreads);  // chunk c's copies of every prep thread have landed
    const uint32_t K = smem_addr(smem + kKqOff + (c % kKqStages) * kKqBytes), Q = K + kChunk * kDk * 2;
    const float* raw = reinterpret_cast<const float*>(smem + kRawOff + (c % kKqStages) * kRawBytes);

    // KK^T rows of block pw (column blocks 0..pw, the diagonal one for T) and QK^T rows of block
    // 3 - pw (column blocks 0..3-pw): 5 column blocks per warp.
    const int kb = pw, qb = 3 - pw;
    float acc_k[4][2][4] = {}, acc_q[4][2][4] = {};
    // A fragments: matrices (rows 0-7 | 8-15) x (columns 0-7 | 8-15) in that order; B fragments
    // of two 8-column tiles: (tile 0: k 0-7 | 8-15), then tile 1.
    const uint32_t aoff = lane_off((lane & 7) + 8 * ((lane >> 3) & 1), lane >> 4, 2 * kDk);
    const uint32_t boff = lane_off((lane & 7) + 8 * (lane >> 4), (lane >> 3) & 1, 2 * kDk);
#pragma unroll
    for (int kk = 0; kk < kDk / 16; ++kk) {
      uint32_t ak[4], aq[4];
      ldsm_x4(ak, K + kb * 16 * 2 * kDk + (aoff ^ (kk << 5)));
      ldsm_x4(aq, Q + qb * 16 * 2 * kDk + (aoff ^ (kk << 5)));
#pragma unroll
      for (int cb = 0; cb < 4; ++cb) {
        if (cb > kb && cb > qb) continue;
        uint32_t bf[4];
        ldsm_x4(bf, K + cb * 16 * 2 * kDk + (boff ^ (kk << 5)));
        if (cb <= kb) {
          mma(acc_k[cb][0], ak, bf[0], bf[1]);
          mma(acc_k[cb][1], ak, bf[2], bf[3]);
        }
        if (cb <= qb) {
          mma(acc_q[cb][0], aq, bf[0], bf[1]);
          mma(acc_q[cb][1], aq, bf[2], bf[3]);
        }
      }
    }
    // gamma = cumsum g, summed left to right as the CPU reference does (adding zeros past pt keeps
    // the sum bitwise; the unrolled loads pipeline).
    if (pt < kChunk) {
      float s = 0.0f;
#pragma unroll
      for (int u = 0; u < kChunk; ++u) s += u <= pt ? raw[u] : 0.0f;
      gam[pt] = s;
    }
    bar_sync(kBarPrep, kPrepThreads);
    if (pt < kChunk) {
      const float gl = gam[kChunk - 1];
      sc[kScEg + pt] = expf(gam[pt]);
      sc[kScEd + pt] = expf(gl - gam[pt]);
      sc[kScBeta + pt] = raw[kChunk + pt];
      sc[kScQk + pt] = raw[2 * kChunk + pt];
      if (pt == 0) sc[kScEgC] = expf(gl);
    }
    // L_ij = beta_i KK_ij e^(gamma_i - gamma_j) and P_ij = QK_ij e^(gamma_i - gamma_j) for j < i
    // (__expf: relative error ~1e-5 at |gamma_i - gamma_j| ~ 100, far below the fp16 operands').
#pragma unroll
    for (int cb = 0; cb < 4; ++cb) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int j = 16 * cb + 8 * nt + 2 * t;
          if (cb <= kb) {
            const int i = 16 * kb + g + 8 * hf;
            const float bi = raw[kChunk + i], gi = gam[i];
            const float v0 = j < i ? bi * acc_k[cb][nt][2 * hf] * __expf(gi - gam[j]) : 0.0f;
            const float v1 = j + 1 < i ? bi * acc_k[cb][nt][2 * hf + 1] * __expf(gi - gam[j + 1]) : 0.0f;
            if (cb == kb) {
              Ld[(i - 16 * kb) * 16 + j - 16 * cb] = v0;
              Ld[(i - 16 * kb) * 16 + j + 1 - 16 * cb] = v1;
            } else {
              *reinterpret_cast<uint32_t*>(Ln + swz64(i, j)) = pack_half2(-v0, -v1);
            }
          }
          if (cb <= qb) {
            const int i = 16 * qb + g + 8 * hf;
            const float gi = gam[i];
            const float v0 = j < i ? acc_q[cb][nt][2 * hf] * __expf(gi - gam[j]) : 0.0f;
            const float v1 = j + 1 < i ? acc_q[cb][nt][2 * hf + 1] * __expf(gi - gam[j + 1]) : 0.0f;
            *reinterpret_cast<uint32_t*>(P + swz64(i, j)) = pack_half2(v0, v1);
          }
        }
      }
    }
    __syncwarp();
    // T_ww = (I + L_ww)^-1 by forward substitution: lane c < 16 owns column c.
    if (lane < 16) {
      float tc[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float a = i == lane ? 1.0f : 0.0f;
#pragma unroll
        for (int m = 0; m < i; ++m) a -= Ld[i * 16 + m] * tc[m];
        tc[i] = a;
      }
#pragma unroll
      for (int i = 0; i < 16; ++i)
        Td[pw * 256 + swz16(i, lane)] = __float2half_rn(i == lane ? tc[i] - 1.0f : tc[i]);
    }
    bar_arrive(kBarFull + b, sync_count);
  }
}

// XK^T += S^T K^T and XQ^T += S^T Q^T over dk for the chunk's 64 tokens: S^T [16 x 128] accumulator
// tiles scaled by lo/hi per row into fp16; K, Q the chunk's fp16 [64][128] swizzled rows.
__device__ __forceinline__ void state_times_kq(float (&XK)[8][4], float (&XQ)[8][4], const float (&S)[16][4],
                                               uint32_t K, uint32_t Q, float lo, float hi, uint32_t loff) {
#pragma unroll
  for (int kk = 0; kk < kDk / 16; ++kk) {
    uint32_t a[4];
    acc_to_a(a, S[2 * kk], S[2 * kk + 1], lo, hi);
    const uint32_t off = loff ^ (kk << 5);
#pragma unroll
    for (int np = 0; np < 4; ++np) {
      uint32_t bk[4], bq[4];
      ldsm_x4(bk, K + np * 16 * 2 * kDk + off);
      ldsm_x4(bq, Q + np * 16 * 2 * kDk + off);
      mma(XK[2 * np], a, bk[0], bk[1]);
      mma(XK[2 * np + 1], a, bk[2], bk[3]);
      mma(XQ[2 * np], a, bq[0], bq[1]);
      mma(XQ[2 * np + 1], a, bq[2], bq[3]);
    }
  }
}

// ---- state warps --------------------------------------------------------------------------------
template <int kStateWarps>
__device__ void state_warp(const ChunkArgs& p, char* smem, int64_t row0, int n, int h, int slot, int slice) {
  constexpr int kBv = 16 * kStateWarps;
  const int sw = threadIdx.x / 32 - kPrepWarps, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int sync_count = kPrepThreads + 32 * kStateWarps;
  const int nchunks = (n + kChunk - 1) / kChunk;
  const int d0 = slice * kBv + 16 * sw;  // this warp's first state column (dv index)
  float* Sg = p.state + (static_cast<int64_t>(slot) * p.Hv + h) * kDk * p.dv + d0;  // S[k][d] at Sg[k dv + d]
  float* Vs = reinterpret_cast<float*>(smem + kVOff) + sw * 2 * kChunk * kVPitch;
  const float* vsrc = p.qkv + p.v_off + static_cast<int64_t>(h) * p.dv + d0;

  // S^T [16 x 128] as 16 accumulator tiles: tile j = dk 8j..8j+7; regs (row g, 2t), (g, 2t+1),
  // (g+8, 2t), (g+8, 2t+1). The registers hold rho * S (rho: a power of two per row).
  float S[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int k = 8 * j + 2 * t;
    S[j][0] = Sg[static_cast<int64_t>(k) * p.dv + g];
    S[j][1] = Sg[static_cast<int64_t>(k + 1) * p.dv + g];
    S[j][2] = Sg[static_cast<int64_t>(k) * p.dv + g + 8];
    S[j][3] = Sg[static_cast<int64_t>(k + 1) * p.dv + g + 8];
  }
  float rho_lo = 1.0f, rho_hi = 1.0f, irho_lo = 1.0f, irho_hi = 1.0f;

  auto issue_v = [&](int c) {  // V [64 tokens x 16 columns] of chunk c into stage c % 2
    float* dst = Vs + (c & 1) * kChunk * kVPitch;
    const int t0 = c * kChunk;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int idx = lane + 32 * i, tok = idx >> 2, q4 = idx & 3;
      const bool valid = t0 + tok < n;
      cp_async16(dst + tok * kVPitch + 4 * q4, vsrc + (row0 + (valid ? t0 + tok : 0)) * p.conv_dim + 4 * q4, valid);
    }
  };

  if (nchunks > 0) bar_arrive(kBarEmpty, sync_count);
  if (nchunks > 1) bar_arrive(kBarEmpty + 1, sync_count);
  if (nchunks > 0) issue_v(0);
  cp_async_commit();
  // ldmatrix lanes: B fragments of two 8-column tiles from [n][k] rows (K^, Q^, -L, P, T_ii - I),
  // and transposed from [k][n] rows (K^ in the state update).
  const int nrow = (lane & 7) + 8 * (lane >> 4), nch = (lane >> 3) & 1;
  const uint32_t boff128 = lane_off(nrow, nch, 2 * kDk), boff64 = lane_off(nrow, nch, 2 * kChunk),
                 toff128 = lane_off((lane & 7) + 8 * ((lane >> 3) & 1), lane >> 4, 2 * kDk),
                 td_off = 2 * swz16(nrow, 8 * nch);
  for (int c = 0; c < nchunks; ++c) {
    const int b = c & 1, t0 = c * kChunk;
    const char* buf = smem + kBufOff + b * kBufBytes;
    const uint32_t Ln = smem_addr(buf + kLOff), P = smem_addr(buf + kPOff), Td = smem_addr(buf + kTdOff);
    const float* sc = reinterpret_cast<const float*>(buf + kScOff);
    const uint32_t K = smem_addr(smem + kKqOff + (c % kKqStages) * kKqBytes), Q = K + kChunk * kDk * 2;
    __syncwarp();  // every lane is done reading the V stage the next copy overwrites
    if (c + 1 < nchunks) issue_v(c + 1);
    cp_async_commit();
    bar_sync(kBarFull + b, sync_count);

    // X^T = S^T [K; Q]^T, S^T scaled by tau per row into fp16.
    float ilo, ihi;
    float mlo = 0.0f, mhi = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      mlo = fmaxf(mlo, fmaxf(fabsf(S[j][0]), fabsf(S[j][1])));
      mhi = fmaxf(mhi, fmaxf(fabsf(S[j][2]), fabsf(S[j][3])));
    }
    const float tau_lo = pow2_scale(quad_max(mlo), &ilo), tau_hi = pow2_scale(quad_max(mhi), &ihi);
    const float xs_lo = ilo * irho_lo, xs_hi = ihi * irho_hi;  // X^T = mma result * xs
    float XK[8][4] = {}, XQ[8][4] = {};
    state_times_kq(XK, XQ, S, K, Q, tau_lo, tau_hi, boff128);

    // R^T = beta (V^T - e^gamma X_K^T), in XK.
    cp_async_wait_one();
    __syncwarp();
    const float* Vc = Vs + b * kChunk * kVPitch;
    mlo = 0.0f;
    mhi = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tok = 8 * nt + 2 * t + e;
        const float bt = sc[kScBeta + tok], eg = sc[kScEg + tok];
        XK[nt][e] = bt * (Vc[tok * kVPitch + g] - eg * (XK[nt][e] * xs_lo));
        XK[nt][2 + e] = bt * (Vc[tok * kVPitch + g + 8] - eg * (XK[nt][2 + e] * xs_hi));
        mlo = fmaxf(mlo, fabsf(XK[nt][e]));
        mhi = fmaxf(mhi, fabsf(XK[nt][2 + e]));
      }
    }
    float isig_lo, isig_hi;
    const float sig_lo = pow2_scale(quad_max(mlo), &isig_lo), sig_hi = pow2_scale(quad_max(mhi), &isig_hi);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      XK[nt][0] *= sig_lo;
      XK[nt][1] *= sig_lo;
      XK[nt][2] *= sig_hi;
      XK[nt][3] *= sig_hi;
    }
    // V' by blocked forward substitution over the 16-token blocks (sigma domain, in XK).
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < i; ++j) {  // Y_i += V'_j (-L_ij)^T
        uint32_t va[4], bl[4];
        acc_to_a(va, XK[2 * j], XK[2 * j + 1], 1.0f, 1.0f);
        ldsm_x4(bl, Ln + i * 16 * 2 * kChunk + (boff64 ^ (j << 5)));
        mma(XK[2 * i], va, bl[0], bl[1]);
        mma(XK[2 * i + 1], va, bl[2], bl[3]);
      }
      uint32_t y[4], bt[4];
      acc_to_a(y, XK[2 * i], XK[2 * i + 1], 1.0f, 1.0f);
      ldsm_x4(bt, Td + i * 512 + td_off);
      mma(XK[2 * i], y, bt[0], bt[1]);  // V'_i = Y_i + Y_i (T_ii - I)^T
      mma(XK[2 * i + 1], y, bt[2], bt[3]);
    }

    // O^T = e^gamma X_Q^T + diag(q.k) V'^T + V'^T P^T (sigma domain, in XQ), then stored.
    {
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tok = 8 * nt + 2 * t + e;
          const float eg = sc[kScEg + tok], qk = sc[kScQk + tok];
          XQ[nt][e] = sig_lo * (eg * (XQ[nt][e] * xs_lo)) + qk * XK[nt][e];
          XQ[nt][2 + e] = sig_hi * (eg * (XQ[nt][2 + e] * xs_hi)) + qk * XK[nt][2 + e];
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t va[4];
        acc_to_a(va, XK[2 * j], XK[2 * j + 1], 1.0f, 1.0f);
#pragma unroll
        for (int m = j; m < 4; ++m) {
          uint32_t bp[4];
          ldsm_x4(bp, P + m * 16 * 2 * kChunk + (boff64 ^ (j << 5)));
          mma(XQ[2 * m], va, bp[0], bp[1]);
          mma(XQ[2 * m + 1], va, bp[2], bp[3]);
        }
      }
      float* obase = p.out + ((row0 + t0) * p.Hv + h) * p.dv + d0 + g;
      const int64_t ostride = static_cast<int64_t>(p.Hv) * p.dv;
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tok = 8 * nt + 2 * t + e;
          if (t0 + tok < n) {
            obase[tok * ostride] = XQ[nt][e] * isig_lo;
            obase[tok * ostride + 8] = XQ[nt][2 + e] * isig_hi;
          }
        }
      }
    }

    // S from the rho domain to the sigma domain, decayed over the chunk: sigma e^gamma_C S.
    {
      const float egc = sc[kScEgC];
      const float f_lo = sig_lo * irho_lo * egc, f_hi = sig_hi * irho_hi * egc;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        S[j][0] *= f_lo;
        S[j][1] *= f_lo;
        S[j][2] *= f_hi;
        S[j][3] *= f_hi;
      }
      rho_lo = sig_lo;
      rho_hi = sig_hi;
      irho_lo = isig_lo;
      irho_hi = isig_hi;
    }

    // S^T += (V' e^(gamma_C - gamma))^T K (sigma domain, accumulated in place).
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float e0 = sc[kScEd + 16 * j + 2 * t], e1 = sc[kScEd + 16 * j + 2 * t + 1];
      const float e2 = sc[kScEd + 16 * j + 8 + 2 * t], e3 = sc[kScEd + 16 * j + 9 + 2 * t];
      uint32_t a[4];
      a[0] = pack_half2(XK[2 * j][0] * e0, XK[2 * j][1] * e1);
      a[1] = pack_half2(XK[2 * j][2] * e0, XK[2 * j][3] * e1);
      a[2] = pack_half2(XK[2 * j + 1][0] * e2, XK[2 * j + 1][1] * e3);
      a[3] = pack_half2(XK[2 * j + 1][2] * e2, XK[2 * j + 1][3] * e3);
#pragma unroll
      for (int q = 0; q < kDk / 16; ++q) {
        uint32_t bk[4];
        ldsm_x4_trans(bk, K + j * 16 * 2 * kDk + (toff128 ^ (q << 5)));
        mma(S[2 * q], a, bk[0], bk[1]);
        mma(S[2 * q + 1], a, bk[2], bk[3]);
      }
    }
    __syncwarp();
    if (c + 2 < nchunks) bar_arrive(kBarEmpty + b, sync_count);  // buffer b and this K/Q stage are free
  }

#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const int k = 8 * j + 2 * t;
    Sg[static_cast<int64_t>(k) * p.dv + g] = S[j][0] * irho_lo;
    Sg[static_cast<int64_t>(k + 1) * p.dv + g] = S[j][1] * irho_lo;
    Sg[static_cast<int64_t>(k) * p.dv + g + 8] = S[j][2] * irho_hi;
    Sg[static_cast<int64_t>(k + 1) * p.dv + g + 8] = S[j][3] * irho_hi;
  }
}

template <int kStateWarps>
__global__ void __launch_bounds__(32 * (kPrepWarps + kStateWarps), 1) gdn_chunk_kernel(const ChunkArgs p) {
  extern __shared__ __align__(128) char smem[];
  const int slice = static_cast<int>(blockIdx.x % p.slices);
  const int head = static_cast<int>(blockIdx.x / p.slices);  // span * Hv + value head
  const int s = head / p.Hv, h = head % p.Hv, kh = h / (p.Hv / p.Hk);
  const int64_t row0 = p.L.row_begin(s);
  const int n = p.L.num_tokens(s);
  if (threadIdx.x < kPrepThreads)
    prep_warps(p, smem, 32 * kStateWarps, row0, n, h, kh);
  else
    state_warp<kStateWarps>(p, smem, row0, n, h, p.L.gdn_slot(s), slice);
}

template <int kStateWarps>
void launch_chunk(const ChunkArgs& a, int64_t blocks, cudaStream_t stream) {
  const int bytes = smem_bytes(kStateWarps);
  static const bool attr_set = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(gdn_chunk_kernel<kStateWarps>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)attr_set;
  gdn_chunk_kernel<kStateWarps><<<static_cast<unsigned>(blocks), 32 * (kPrepWarps + kStateWarps), bytes, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaBackend::gdn_chunked(const Tensor& out, const Tensor& qkv, const Tensor& g, const Tensor& beta,
                              const Tensor& state_pool, const BatchLayout& batch, const GdnDims& d) {
  const int64_t Hv = d.num_v_heads, Hk = d.num_k_heads, dk = d.k_head_dim, dv = d.v_head_dim, C = d.conv_dim();
  CHECK(qkv.dim(1) == C && state_pool.dim(1) == Hv && state_pool.dim(2) == dk && state_pool.dim(3) == dv &&
        Hv % Hk == 0);
  const auto aligned16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (dk != kDk || dv % 16 != 0 || C % 4 != 0 || !aligned16(qkv.data)) {
    // Geometry the tensor-core kernel is not built for (the test models' small heads): the
    // token-by-token recurrence computes the same function.
    gdn_recurrent(out, qkv, g, beta, state_pool, batch, d);
    return;
  }
  for (const SeqSpan& s : batch.seqs) CHECK(s.gdn_slot >= 0 && s.gdn_slot < state_pool.dim(0));
  if (batch.seqs.empty()) return;
  const int64_t R = batch.total_rows, spans = static_cast<int64_t>(batch.seqs.size());
  // The widest slice (least prep work repeated per head) that still gives ~every SM a block (one
  // block fits an SM: 128 blocks on 132 SMs beat 256 in two waves).
  int warps = 1;
  for (int w : {4, 2}) {
    if (dv % (16 * w) == 0 && 8 * spans * Hv * (dv / (16 * w)) >= 7 * sm_count_) {
      warps = w;
      break;
    }
  }
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
  if (optin < smem_bytes(warps)) {
    // sm_120 / sm_121 (99 KB per block) cannot hold the kernel's three K/Q stages: the token-by-token
    // kernel there.
    gdn_recurrent(out, qkv, g, beta, state_pool, batch, d);
    return;
  }
  DeviceLayout L = device_layout(batch);
  Scratch qn(this, static_cast<size_t>(R * Hk * kDk) * 2), kn(this, static_cast<size_t>(R * Hk * kDk) * 2),
      qk(this, static_cast<size_t>(R * Hk) * 4);
  gdn_qk_norm_kernel<<<blocks_for(R * Hk * 32, 256), 256, 0, stream_>>>(
      qn.as<__half>(), kn.as<__half>(), qk.as<float>(), qkv.ptr<const float>(), L, static_cast<int>(Hk), C,
      1.0f / sqrtf(static_cast<float>(dk)));
  CUDA_CHECK_LAUNCH();

  const int slices = static_cast<int>(dv / (16 * warps));
  const ChunkArgs a{out.ptr<float>(), qkv.ptr<const float>(), qn.as<const __half>(), kn.as<const __half>(),
                    qk.as<const float>(), g.ptr<const float>(), beta.ptr<const float>(), state_pool.ptr<float>(),
                    L, static_cast<int>(Hv), static_cast<int>(Hk), static_cast<int>(dv), slices, C, 2 * Hk * dk};
  const int64_t blocks = spans * Hv * slices;
  if (warps == 4) launch_chunk<4>(a, blocks, stream_);
  else if (warps == 2) launch_chunk<2>(a, blocks, stream_);
  else launch_chunk<1>(a, blocks, stream_);
}

}  // namespace sparkserve
