// Chunked Gated DeltaNet prefill on tensor cores (mma.sync m16n8k16 fp16 x fp16 -> fp32, so one kernel
// serves sm_90, sm_100 and sm_120). The function is the CPU backend's gdn_chunked (chunk 64, HF
// torch_chunk_gated_delta_rule); per value head and chunk, with gamma = the in-chunk cumulative log decay,
// L_ij = beta_i k_i.k_j e^(gamma_i - gamma_j) (j < i), T = (I + L)^-1:
//   X_K = K S, X_Q = Q S                            (S: the state before the chunk, [dk, dv])
//   V'  = T R,  R = beta (V - e^gamma X_K)         (= the reference's U - W S, with W S folded into R)
//   O   = e^gamma X_Q + (QK^T (.) Gamma) V'        (Gamma_ij = e^(gamma_i - gamma_j), j <= i)
//   S   = e^gamma_C S + K^T (e^(gamma_C - gamma) V')
//
// Work split: one thread block per (span, value head, slice of 16 * kGroups state columns), walking
// the span's chunks in order. The state pool is f32 or bf16 (gdn_state.cuh): read once into the f32
// accumulators at the span's start, rounded to the pool's dtype only where stored (the span's end and
// each save).
//  - 4 prep warps run one chunk ahead (double-buffered shared memory): cp.async the chunk's normalised
//    fp16 q, k (written by gdn_qk_norm_kernel, shared by the value heads of a key head), g, beta;
//    gamma; KK^T and QK^T on tensor cores; -L and P = QK^T (.) Gamma (strictly lower) in fp16; the four
//    16 x 16 diagonal blocks of T by forward substitution in fp32.
//  - 2 * kGroups state warps, a pair per 16 state columns, one warp per dk half: S^T [16, 64] stays in
//    mma accumulators (f32) for the whole span and is never stored to shared memory. The pair adds
//    its halves of X through shared memory; V' is found by blocked substitution over the chunk's four
//    16-row blocks (Y_i = R_i - sum_j L_ij V'_j; V'_i = Y_i + (T_ii - I) Y_i).
// Precision: every product has fp16 operands (10-bit mantissa, tf32's) and fp32 accumulation. The
// terms that dominate outputs are kept out of the fp16 products: the identity of T (V'_i = Y_i + ...)
// and the diagonal of QK^T (q_i.k_i from fp32 normalised vectors) are added in fp32. Operands without
// a bound (S, R, Y, V') are always the A operand with state columns as rows, so each row gets its own
// power-of-two scale from a max over its 4-lane quad: no overflow, no lost precision for small rows,
// and the scaling is exact. Normalised q, k, L, T and P are bounded by 1 in magnitude.
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gdn_state.cuh"

namespace sparkserve {
namespace {

constexpr int kChunk = 64;
constexpr int kDk = 128;                 // key head dim the kernel is built for (Qwen3.5 / Qwen3-Next)
constexpr int kPrepWarps = 4;
constexpr int kPrepThreads = 32 * kPrepWarps;
constexpr int kKqStages = 3;             // prep reads chunk c+1, state warps chunk c, cp.async fills c+2
constexpr int kVPitch = 16;              // floats per staged V row (a group's 16 columns)
constexpr int kScaleExp = 5;             // scaled rows have max |x| in [2^5, 2^6): V' = T R grows < 2^10
constexpr int kXFloats = 48;             // per lane, a warp's partial X: X_K (32) + the other half's X_Q (16)

// Named barriers (0 is __syncthreads): prep-internal, FULL[2] (prep -> state), EMPTY[2], and one per
// pair of state warps (the two dk halves of a column group).
constexpr int kBarPrep = 1, kBarFull = 2, kBarEmpty = 4, kBarPair = 6;

// ---- shared memory layout (bytes) ---------------------------------------------------------------
constexpr int kKqBytes = 2 * kChunk * kDk * 2;          // one stage: K^ then Q^, fp16 [64][128] each
constexpr int kRawBytes = 3 * kChunk * 4;               // one stage: g, beta, q.k of the chunk's tokens
// One prep -> state buffer: -L and P fp16 [64][64], (T_ii - I) fp16 [4][16][16], per-token scalars.
constexpr int kLOff = 0, kPOff = kLOff + kChunk * kChunk * 2, kTdOff = kPOff + kChunk * kChunk * 2,
              kScOff = kTdOff + 4 * 256 * 2, kBufBytes = kScOff + (5 * kChunk + 4) * 4;
// Scalars within a buffer (floats): e^gamma, e^(gamma_C - gamma), beta, q.k, gamma (for state saves
// inside the chunk), then e^gamma_C.
constexpr int kScEg = 0, kScEd = kChunk, kScBeta = 2 * kChunk, kScQk = 3 * kChunk, kScGam = 4 * kChunk,
              kScEgC = 5 * kChunk;
constexpr int kKqOff = 0, kRawOff = kKqOff + kKqStages * kKqBytes, kBufOff = kRawOff + kKqStages * kRawBytes,
              kLdOff = kBufOff + 2 * kBufBytes,          // prep scratch: L's diagonal blocks f32 [4][16][16]
    kGamOff = kLdOff + 4 * 256 * 4, kVOff = kGamOff + kChunk * 4;
// Per column group: V [2 stages][64][16] f32, then the pair's partial X [2 halves][kXFloats][32] f32.
constexpr int kVBytes = 2 * kChunk * kVPitch * 4, kXBytes = 2 * kXFloats * 32 * 4;
constexpr int smem_bytes(int groups) { return kVOff + groups * (kVBytes + kXBytes); }

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
  void* state;         // [slots, Hv, 128, dv] f32 or bf16 (the kernel's St)
  DeviceLayout L;
  int Hv, Hk, dv, slices;
  int64_t conv_dim, v_off;
};

// ---- prep warps ---------------------------------------------------------------------------------
// Per chunk each warp w computes five 16 x 16 blocks of KK^T / QK^T: KK^T row block w, column
// blocks 0..w (the last one is L's diagonal block, for T_ww), and QK^T row block 3 - w, column
// blocks 0..3-w. Job j <= w is KK^T (w, j), job j > w is QK^T (3 - w, j - w - 1): no branches.
__device__ void prep_warps(const ChunkArgs& p, char* smem, int sync_count, int64_t row0, int n, int h, int kh) {
  const int pt = threadIdx.x, pw = pt / 32, lane = pt % 32, g = lane / 4, t = lane % 4;
  const int nchunks = (n + kChunk - 1) / kChunk;
  float* gam = reinterpret_cast<float*>(smem + kGamOff);
  float* Ld = reinterpret_cast<float*>(smem + kLdOff) + pw * 256;
  // This thread's 16 copies of 16 bytes per chunk: rows (pt >> 4) + 8 i of K^ (i < 8) and Q^ (i >= 8),
  // 16-byte column pt & 15. Source row stride Hk * 128 halves.
  const int crow = pt >> 4, cch = pt & 15;
  const int64_t rstride = static_cast<int64_t>(p.Hk) * kDk;
  const __half* ksrc = p.kn + (row0 * p.Hk + kh) * kDk + cch * 8;
  const __half* qsrc = p.qn + (row0 * p.Hk + kh) * kDk + cch * 8;
  const int tok = pt % kChunk;  // the token whose scalars this thread copies

  auto issue_loads = [&](int c) {
    const int t0 = c * kChunk;
    __half* kq = reinterpret_cast<__half*>(smem + kKqOff + (c % kKqStages) * kKqBytes);
    const __half* kc = ksrc + t0 * rstride;  // the chunk's first row (32-bit offsets below)
    const __half* qc = qsrc + t0 * rstride;
    const int rs = static_cast<int>(rstride);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int row = crow + 8 * i;
      const bool valid = t0 + row < n;
      const int off = valid ? row * rs : 0;
      cp_async16(kq + swz128(row, cch), (valid ? kc : ksrc) + off, valid);
      cp_async16(kq + kChunk * kDk + swz128(row, cch), (valid ? qc : qsrc) + off, valid);
    }
    float* raw = reinterpret_cast<float*>(smem + kRawOff + (c % kKqStages) * kRawBytes);
    const bool valid = t0 + tok < n;
    const int64_t r = row0 + (valid ? t0 + tok : 0);
    if (pt < kChunk) {
      cp_async4(raw + tok, p.g + r * p.Hv + h, valid);
      cp_async4(raw + kChunk + tok, p.beta + r * p.Hv + h, valid);
    } else {
      cp_async4(raw + 2 * kChunk + tok, p.qk + r * p.Hk + kh, valid);
    }
  };

  const int kb = pw, qb = 3 - pw;
  // ldmatrix lanes: A fragments (rows 0-7 | 8-15) x (columns 0-7 | 8-15); B fragments of two
  // 8-column tiles (tile 0: k 0-7 | 8-15, then tile 1).
  const uint32_t aoff = lane_off((lane & 7) + 8 * ((lane >> 3) & 1), lane >> 4, 2 * kDk);
  const uint32_t boff = lane_off((lane & 7) + 8 * (lane >> 4), (lane >> 3) & 1, 2 * kDk);

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

    float acc[5][2][4] = {};
#pragma unroll
    for (int kk = 0; kk < kDk / 16; ++kk) {
      uint32_t ak[4], aq[4];
      ldsm_x4(ak, K + kb * 16 * 2 * kDk + (aoff ^ (kk << 5)));
      ldsm_x4(aq, Q + qb * 16 * 2 * kDk + (aoff ^ (kk << 5)));
#pragma unroll
      for (int j = 0; j < 5; ++j) {
        const bool isk = j <= kb;
        const int cb = isk ? j : j - kb - 1;
        const uint32_t a[4] = {isk ? ak[0] : aq[0], isk ? ak[1] : aq[1], isk ? ak[2] : aq[2], isk ? ak[3] : aq[3]};
        uint32_t bf[4];
        ldsm_x4(bf, K + cb * 16 * 2 * kDk + (boff ^ (kk << 5)));
        mma(acc[j][0], a, bf[0], bf[1]);
        mma(acc[j][1], a, bf[2], bf[3]);
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
      sc[kScGam + pt] = gam[pt];
      if (pt == 0) sc[kScEgC] = expf(gl);
    }
    // L_ij = beta_i KK_ij e^(gamma_i - gamma_j) and P_ij = QK_ij e^(gamma_i - gamma_j) for j < i
    // (__expf: relative error ~1e-5 at |gamma_i - gamma_j| ~ 100, far below the fp16 operands';
    // the argument is clamped to <= 0 so masked entries cannot overflow).
#pragma unroll
    for (int j = 0; j < 5; ++j) {
      const bool isk = j <= kb;
      const int cb = isk ? j : j - kb - 1, rb = isk ? kb : qb;
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int i = 16 * rb + g + 8 * hf;
        const float gi = gam[i], fi = isk ? raw[kChunk + i] : 1.0f;
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const int c0 = 16 * cb + 8 * nt + 2 * t;
          float v[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float x = fi * acc[j][nt][2 * hf + e] * __expf(fminf(gi - gam[c0 + e], 0.0f));
            v[e] = c0 + e < i ? x : 0.0f;
          }
          if (isk && cb == kb) {
            *reinterpret_cast<float2*>(Ld + (i - 16 * kb) * 16 + c0 - 16 * cb) = make_float2(v[0], v[1]);
          } else {
            __half* dst = isk ? Ln : P;
            const float sgn = isk ? -1.0f : 1.0f;
            *reinterpret_cast<uint32_t*>(dst + swz64(i, c0)) = pack_half2(sgn * v[0], sgn * v[1]);
          }
        }
      }
    }
    __syncwarp();
    // T_ww = (I + L_ww)^-1 by forward substitution: lane c < 16 owns column c. Row i's sum runs in
    // four partial sums (a chain of i/4 instead of i dependent FMAs); L's rows are broadcast float4s.
    if (lane < 16) {
      float tc[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float l[16];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          if (4 * q >= i) break;
          const float4 v = *reinterpret_cast<const float4*>(Ld + i * 16 + 4 * q);
          l[4 * q] = v.x;
          l[4 * q + 1] = v.y;
          l[4 * q + 2] = v.z;
          l[4 * q + 3] = v.w;
        }
        float a[4] = {i == lane ? 1.0f : 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int m = 0; m < i; ++m) a[m & 3] -= l[m] * tc[m];
        tc[i] = (a[0] + a[1]) + (a[2] + a[3]);
      }
#pragma unroll
      for (int i = 0; i < 16; ++i)
        Td[pw * 256 + swz16(i, lane)] = __float2half_rn(i == lane ? tc[i] - 1.0f : tc[i]);
    }
    bar_arrive(kBarFull + b, sync_count);
  }
}

// ---- state warps --------------------------------------------------------------------------------
// acc (a warp's dk half of S^T: 8 accumulator tiles, the sigma domain) += (V' (.) f)^T K over the chunk's
// tokens 0..last (blocks of 16 past `last` are skipped: their factors are 0), f(tk) the factor of token
// tk; vp: V' as 8 tiles (16 state columns x 64 tokens). K: the chunk's K^ stage, toff128: the lane's
// transposed ldmatrix offset.
template <int kUnroll, class Factor>
__device__ __forceinline__ void add_kv(float (&acc)[8][4], const float (&vp)[8][4], Factor f, int last, uint32_t K,
                                       uint32_t toff128, int hk, int t) {
#pragma unroll kUnroll
  for (int j = 0; j < 4; ++j) {
    if (16 * j > last) break;
    const float e0 = f(16 * j + 2 * t), e1 = f(16 * j + 2 * t + 1);
    const float e2 = f(16 * j + 8 + 2 * t), e3 = f(16 * j + 9 + 2 * t);
    uint32_t a[4];
    a[0] = pack_half2(vp[2 * j][0] * e0, vp[2 * j][1] * e1);
    a[1] = pack_half2(vp[2 * j][2] * e0, vp[2 * j][3] * e1);
    a[2] = pack_half2(vp[2 * j + 1][0] * e2, vp[2 * j + 1][1] * e3);
    a[3] = pack_half2(vp[2 * j + 1][2] * e2, vp[2 * j + 1][3] * e3);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      uint32_t bk[4];
      ldsm_x4_trans(bk, K + j * 16 * 2 * kDk + (toff128 ^ ((4 * hk + q) << 5)));
      mma(acc[2 * q], a, bk[0], bk[1]);
      mma(acc[2 * q + 1], a, bk[2], bk[3]);
    }
  }
}

// A warp's tiles of S^T, times the per-row factors lo / hi, into state rows at dst (S[k][d] at
// dst[k dv + d], the warp's first dk row and the pair's first column), rounded to the pool's St.
template <class St>
__device__ __forceinline__ void store_state(St* dst, const float (&st)[8][4], float lo, float hi, int dv, int g,
                                            int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int k = 8 * j + 2 * t;
    state_store1(dst + static_cast<int64_t>(k) * dv + g, st[j][0] * lo);
    state_store1(dst + static_cast<int64_t>(k + 1) * dv + g, st[j][1] * lo);
    state_store1(dst + static_cast<int64_t>(k) * dv + g + 8, st[j][2] * hi);
    state_store1(dst + static_cast<int64_t>(k + 1) * dv + g + 8, st[j][3] * hi);
  }
}

// A save after token e < 63 of the chunk, into dst (store_state's layout): sigma e^gamma_e S + the
// update over tokens 0..e, times 1/sigma. S: the warp's tiles before the chunk's decay; f_lo / f_hi:
// sigma e^gamma_e / rho per row; vp: V' (sigma domain); sc: the chunk's scalars. Not inlined, and
// given copies: the chunk loop runs at the register limit, and saves are rare.
template <class St>
__device__ __noinline__ void save_inside_chunk(St* dst, const float (&S)[8][4], const float (&vp)[8][4],
                                               float f_lo, float f_hi, float is_lo, float is_hi, const float* sc,
                                               int e, uint32_t K, uint32_t toff128, int hk, int dv) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  float acc[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    acc[j][0] = S[j][0] * f_lo;
    acc[j][1] = S[j][1] * f_lo;
    acc[j][2] = S[j][2] * f_hi;
    acc[j][3] = S[j][3] * f_hi;
  }
  const float ge = sc[kScGam + e];
  add_kv<4>(acc, vp, [&](int tk) { return tk <= e ? expf(ge - sc[kScGam + tk]) : 0.0f; }, e, K, toff128, hk, t);
  store_state(dst, acc, is_lo, is_hi, dv, g, t);
}

// A pair of warps owns 16 state columns: warp half hk holds S^T rows' dk half [64 hk, 64 hk + 64)
// as 8 accumulator tiles (tile j = dk 64 hk + 8j..+7; regs (row g, 2t), (g, 2t+1), (g+8, 2t),
// (g+8, 2t+1)), scaled by rho (a power of two per row, the same in both warps). Each warp computes
// its dk half of X = S^T [K; Q]^T; the halves are added through shared memory (in the same order
// in both warps, so both hold the same X_K and compute the same R, scales and V'); the pair then
// splits the output's tokens and the state update's dk rows.
// State saves (SeqSpan::saves) of span s: one after the chunk's last token is S after the update; one
// after token e inside the chunk is what a chunk ending at e leaves, e^gamma_e S + sum_{j <= e}
// k_j e^(gamma_e - gamma_j) V'_j (V'_j depends on tokens <= j only), from the same V'.
template <int kGroups, class St>
__device__ void state_warp(const ChunkArgs& p, char* smem, int sync_count, int64_t row0, int n, int h, int s,
                           int slice) {
  const int sw = threadIdx.x / 32 - kPrepWarps, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int grp = sw >> 1, hk = sw & 1, k0 = 64 * hk;
  const int nchunks = (n + kChunk - 1) / kChunk;
  const int d0 = (slice * kGroups + grp) * 16;  // the pair's first state column (dv index)
  // S[k0 + k][d0 + d] of pool row `row` at state_row(row)[k dv + d].
  auto state_row = [&](int row) {
    return static_cast<St*>(p.state) + ((static_cast<int64_t>(row) * p.Hv + h) * kDk + k0) * p.dv + d0;
  };
  St* Sg = state_row(p.L.gdn_slot(s));
  // The span's saves: save_at(next) = the next one, {tokens, row}, tokens 0 when none is left.
  const int saves = p.L.num_saves(s);
  int next = 0;
  auto save_at = [&](int i) { return i < saves ? p.L.save(s, i) : make_int2(0, 0); };
  char* gbase = smem + kVOff + grp * (kVBytes + kXBytes);
  float* Vs = reinterpret_cast<float*>(gbase);
  float* Xmine = reinterpret_cast<float*>(gbase + kVBytes) + hk * kXFloats * 32 + lane;
  const float* Xother = reinterpret_cast<const float*>(gbase + kVBytes) + (1 - hk) * kXFloats * 32 + lane;
  const float* vsrc = p.qkv + p.v_off + static_cast<int64_t>(h) * p.dv + d0;

  float S[8][4];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int k = 8 * j + 2 * t;
    S[j][0] = state_load1(Sg + static_cast<int64_t>(k) * p.dv + g);
    S[j][1] = state_load1(Sg + static_cast<int64_t>(k + 1) * p.dv + g);
    S[j][2] = state_load1(Sg + static_cast<int64_t>(k) * p.dv + g + 8);
    S[j][3] = state_load1(Sg + static_cast<int64_t>(k + 1) * p.dv + g + 8);
  }
  float rho_lo = 1.0f, rho_hi = 1.0f, irho_lo = 1.0f, irho_hi = 1.0f;

  // V [64 tokens x 16 columns] of chunk c into stage c % 2; this warp copies tokens 32 hk..32 hk+31.
  auto issue_v = [&](int c) {
    float* dst = Vs + (c & 1) * kChunk * kVPitch;
    const int t0 = c * kChunk;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int idx = lane + 32 * i, tk = 32 * hk + (idx >> 2), q4 = idx & 3;
      const bool valid = t0 + tk < n;
      cp_async16(dst + tk * kVPitch + 4 * q4, vsrc + (row0 + (valid ? t0 + tk : 0)) * p.conv_dim + 4 * q4, valid);
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
    if (c + 1 < nchunks) issue_v(c + 1);  // stage (c+1) % 2 was last read in chunk c - 1
    cp_async_commit();
    bar_sync(kBarFull + b, sync_count);

    // This warp's dk half of X^T = S^T [K; Q]^T, S^T scaled by tau per row into fp16.
    float ilo, ihi, mlo = 0.0f, mhi = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      mlo = fmaxf(mlo, fmaxf(fabsf(S[j][0]), fabsf(S[j][1])));
      mhi = fmaxf(mhi, fmaxf(fabsf(S[j][2]), fabsf(S[j][3])));
    }
    const float tau_lo = pow2_scale(quad_max(mlo), &ilo), tau_hi = pow2_scale(quad_max(mhi), &ihi);
    const float xs_lo = ilo * irho_lo, xs_hi = ihi * irho_hi;  // X^T = mma result * xs
    float XK[8][4] = {}, XQ[8][4] = {};
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
      uint32_t a[4];
      acc_to_a(a, S[2 * kk], S[2 * kk + 1], tau_lo, tau_hi);
      const uint32_t off = boff128 ^ ((4 * hk + kk) << 5);
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
    // Publish this half's X_K and the other warp's tokens of X_Q; add the other half's.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        XK[nt][r] *= r < 2 ? xs_lo : xs_hi;
        XQ[nt][r] *= r < 2 ? xs_lo : xs_hi;
        Xmine[(4 * nt + r) * 32] = XK[nt][r];
      }
    }
    // (Register arrays take compile-time indices only: loop over all tiles, keep the other half's.)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      if ((nt >> 2) != hk)
#pragma unroll
        for (int r = 0; r < 4; ++r) Xmine[(32 + 4 * (nt & 3) + r) * 32] = XQ[nt][r];
    cp_async_wait_one();  // this warp's half of V for chunk c (chunk c + 1's may still be in flight)
    bar_sync(kBarPair + grp, 64);
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) XK[nt][r] += Xother[(4 * nt + r) * 32];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      if ((nt >> 2) == hk)
#pragma unroll
        for (int r = 0; r < 4; ++r) XQ[nt][r] += Xother[(32 + 4 * (nt & 3) + r) * 32];

    // R^T = beta (V^T - e^gamma X_K^T), in XK.
    const float* Vc = Vs + b * kChunk * kVPitch;
    mlo = 0.0f;
    mhi = 0.0f;
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tk = 8 * nt + 2 * t + e;
        const float bt = sc[kScBeta + tk], eg = sc[kScEg + tk];
        XK[nt][e] = bt * (Vc[tk * kVPitch + g] - eg * XK[nt][e]);
        XK[nt][2 + e] = bt * (Vc[tk * kVPitch + g + 8] - eg * XK[nt][2 + e]);
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

    // O^T = e^gamma X_Q^T + diag(q.k) V'^T + V'^T P^T for this warp's tokens 32 hk..32 hk+31
    // (sigma domain, in XQ), then stored.
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      if ((nt >> 2) != hk) continue;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int tk = 8 * nt + 2 * t + e;
        const float eg = sc[kScEg + tk], qk = sc[kScQk + tk];
        XQ[nt][e] = sig_lo * (eg * XQ[nt][e]) + qk * XK[nt][e];
        XQ[nt][2 + e] = sig_hi * (eg * XQ[nt][2 + e]) + qk * XK[nt][2 + e];
      }
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t va[4];
      acc_to_a(va, XK[2 * j], XK[2 * j + 1], 1.0f, 1.0f);
#pragma unroll
      for (int m = j; m < 4; ++m) {
        if ((m >> 1) != hk) continue;
        uint32_t bp[4];
        ldsm_x4(bp, P + m * 16 * 2 * kChunk + (boff64 ^ (j << 5)));
        mma(XQ[2 * m], va, bp[0], bp[1]);
        mma(XQ[2 * m + 1], va, bp[2], bp[3]);
      }
    }
    {
      float* obase = p.out + ((row0 + t0) * p.Hv + h) * p.dv + d0 + g;
      const int ostride = p.Hv * p.dv;  // 32-bit offsets within the chunk
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        if ((nt >> 2) != hk) continue;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int tk = 8 * nt + 2 * t + e;
          if (t0 + tk < n) {
            obase[tk * ostride] = XQ[nt][e] * isig_lo;
            obase[tk * ostride + 8] = XQ[nt][2 + e] * isig_hi;
          }
        }
      }
    }

    // Saves inside the chunk (before its last token).
    const int len = min(kChunk, n - t0);
    for (int2 save = save_at(next); save.x > 0 && save.x < t0 + len; save = save_at(++next)) {
      const int e = save.x - t0 - 1;
      const float ege = expf(sc[kScGam + e]);
      float Sc[8][4], Vc[8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          Sc[j][r] = S[j][r];
          Vc[j][r] = XK[j][r];
        }
      save_inside_chunk(state_row(save.y), Sc, Vc, sig_lo * irho_lo * ege, sig_hi * irho_hi * ege, isig_lo, isig_hi,
                        sc, e, K, toff128, hk, p.dv);
    }

    // S from the rho domain to the sigma domain, decayed over the chunk: sigma e^gamma_C S.
    {
      const float egc = sc[kScEgC];
      const float f_lo = sig_lo * irho_lo * egc, f_hi = sig_hi * irho_hi * egc;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
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

    // This half's S^T += (V' e^(gamma_C - gamma))^T K (sigma domain, accumulated in place).
    add_kv<4>(S, XK, [&](int tk) { return sc[kScEd + tk]; }, kChunk - 1, K, toff128, hk, t);
    // A save after the chunk's last token.
    for (int2 save = save_at(next); save.x > 0 && save.x == t0 + len; save = save_at(++next))
      store_state(state_row(save.y), S, irho_lo, irho_hi, p.dv, g, t);
    // Both warps of the pair are done with this chunk's partials and V stage before either writes
    // the next ones.
    bar_sync(kBarPair + grp, 64);
    if (c + 2 < nchunks) bar_arrive(kBarEmpty + b, sync_count);  // buffer b and this K/Q stage are free
  }

  store_state(Sg, S, irho_lo, irho_hi, p.dv, g, t);
}

template <int kGroups, class St>
__global__ void __launch_bounds__(32 * (kPrepWarps + 2 * kGroups), 1) gdn_chunk_kernel(const ChunkArgs p) {
  extern __shared__ __align__(128) char smem[];
  const int slice = static_cast<int>(blockIdx.x % p.slices);
  const int head = static_cast<int>(blockIdx.x / p.slices);  // span * Hv + value head
  const int s = head / p.Hv, h = head % p.Hv, kh = h / (p.Hv / p.Hk);
  const int64_t row0 = p.L.row_begin(s);
  const int n = p.L.num_tokens(s);
  const int sync_count = kPrepThreads + 64 * kGroups;
  if (threadIdx.x < kPrepThreads)
    prep_warps(p, smem, sync_count, row0, n, h, kh);
  else
    state_warp<kGroups, St>(p, smem, sync_count, row0, n, h, s, slice);
}

template <int kGroups, class St>
void launch_chunk(const ChunkArgs& a, int64_t blocks, cudaStream_t stream) {
  const int bytes = smem_bytes(kGroups);
  static const bool attr_set = [&] {
    CUDA_CHECK(
        cudaFuncSetAttribute(gdn_chunk_kernel<kGroups, St>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)attr_set;
  gdn_chunk_kernel<kGroups, St><<<static_cast<unsigned>(blocks), 32 * (kPrepWarps + 2 * kGroups), bytes, stream>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <class St>
void launch_chunk_groups(int groups, const ChunkArgs& a, int64_t blocks, cudaStream_t stream) {
  if (groups == 4) launch_chunk<4, St>(a, blocks, stream);
  else if (groups == 2) launch_chunk<2, St>(a, blocks, stream);
  else launch_chunk<1, St>(a, blocks, stream);
}

}  // namespace

void CudaBackend::gdn_chunked(const Tensor& out, const Tensor& qkv, const Tensor& g, const Tensor& beta,
                              const Tensor& state_pool, const BatchLayout& batch, const GdnDims& d) {
  const int64_t Hv = d.num_v_heads, Hk = d.num_k_heads, dk = d.k_head_dim, dv = d.v_head_dim, C = d.conv_dim();
  CHECK(qkv.dim(1) == C && state_pool.dim(1) == Hv && state_pool.dim(2) == dk && state_pool.dim(3) == dv &&
        Hv % Hk == 0);
  CHECK_MSG(state_pool.dtype == DType::kF32 || state_pool.dtype == DType::kBF16,
            "a GDN recurrent state pool is f32 or bf16");
  const auto aligned16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  if (dk != kDk || dv % 16 != 0 || C % 4 != 0 || !aligned16(qkv.data)) {
    // Geometry the tensor-core kernel is not built for (the test models' small heads): the
    // token-by-token recurrence computes the same function.
    gdn_recurrent(out, qkv, g, beta, state_pool, batch, d);
    return;
  }
  for (const SeqSpan& s : batch.seqs) CHECK(gdn_rows_ok(s, state_pool.dim(0)));
  if (batch.seqs.empty()) return;
  const int64_t R = batch.total_rows, spans = static_cast<int64_t>(batch.seqs.size());
  // The widest slice (least prep work repeated per head) that still gives ~every SM a block (one
  // block fits an SM: 128 blocks on 132 SMs beat 256 in two waves). A slice is `groups` groups of 16
  // state columns, two warps per group.
  int groups = 1;
  for (int w : {4, 2}) {
    if (dv % (16 * w) == 0 && 8 * spans * Hv * (dv / (16 * w)) >= 7 * sm_count_) {
      groups = w;
      break;
    }
  }
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
  if (optin < smem_bytes(groups)) {
    // sm_120 / sm_121 (99 KB per block) cannot hold the kernel's three K/Q stages: the token-by-token
    // kernel there.
    gdn_recurrent(out, qkv, g, beta, state_pool, batch, d);
    return;
  }
  DeviceLayout L = device_layout(batch);
  // Normalised q, k (fp16) and q.k in one allocation (one stream-ordered alloc / free per layer).
  const int64_t qk_elems = R * Hk * kDk;
  Scratch norm(this, static_cast<size_t>(2 * qk_elems * 2 + R * Hk * 4));
  __half* qn = norm.as<__half>();
  __half* kn = qn + qk_elems;
  float* qk = reinterpret_cast<float*>(kn + qk_elems);
  gdn_qk_norm_kernel<<<blocks_for(R * Hk * 32, 256), 256, 0, stream_>>>(
      qn, kn, qk, qkv.ptr<const float>(), L, static_cast<int>(Hk), C, 1.0f / sqrtf(static_cast<float>(dk)));
  CUDA_CHECK_LAUNCH();

  const int slices = static_cast<int>(dv / (16 * groups));
  const ChunkArgs a{out.ptr<float>(), qkv.ptr<const float>(), qn, kn,
                    qk, g.ptr<const float>(), beta.ptr<const float>(), state_pool.data,
                    L, static_cast<int>(Hv), static_cast<int>(Hk), static_cast<int>(dv), slices, C, 2 * Hk * dk};
  const int64_t blocks = spans * Hv * slices;
  if (state_pool.dtype == DType::kBF16) launch_chunk_groups<uint16_t>(groups, a, blocks, stream_);
  else launch_chunk_groups<float>(groups, a, blocks, stream_);
}

}  // namespace sparkserve
