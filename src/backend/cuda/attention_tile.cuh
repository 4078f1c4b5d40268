// Warp-level steps of the tensor-core attention kernels (attention_prefill.cu, attention_decode.cu),
// in the mma.sync m16n8k16 fragment layouts: a warp owns 16 query rows and a slice of DW head dims;
// a thread holds rows g8 = lane / 4 and g8 + 8, and the accumulator pairs of columns 2 * (lane % 4).
// K and V tiles are bf16 rows of HD values in shared memory (tile_chunk's swizzle), NK keys each.
#pragma once

#include "backend/cuda/attention_kernels.cuh"

namespace sparkserve {

constexpr float kLog2e = 1.4426950408889634f;

// 2^x by the hardware's approximation with subnormal results flushed to zero (exp2f adds a
// rescaling around it for them: three more instructions per probability). A flushed probability is
// below 2^-126 of the row's largest, which is 1: it changes no f32 sum it enters.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The warp's Q slice [16 rows, d0 .. d0 + DW) as A fragments split into bf16 hi / lo.
// q_off: the element offset of the thread's two rows.
template <int DW>
__device__ __forceinline__ void load_q_fragments(uint32_t (&qh)[DW / 16][4], uint32_t (&ql)[DW / 16][4], const float* q,
                                                 const int64_t (&q_off)[2], int d0, int lane) {
#pragma unroll
  for (int kk = 0; kk < DW / 16; ++kk)
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      const int64_t col = d0 + kk * 16 + (lane % 4) * 2 + (f / 2) * 8;
      const float2 x = *reinterpret_cast<const float2*>(q + q_off[f % 2] + col);
      split_pack(x.x, x.y, qh[kk][f], ql[kk][f]);
    }
}

// Block-wide tile fills of the prefill kernels. ChunkAt(row, chunk) says where 16-byte chunk `chunk`
// of a tile row sits (in chunks): tile_chunk<HD> for the ldmatrix kernels, the 128-byte swizzle of
// the wgmma kernel.

// The pool rows of keys [key0, key0 + NK) of kv head `head` (-1 for keys >= len; table: the span's
// block table, L.table(s), looked up once per kernel), written by threads
// 0 .. NK-1 into rows[NK] (shared): one block-table lookup per key and tile, which the tile's 16-byte
// copies then share (a lookup per copy, with its 64-bit division, cost more issue slots than the
// tensor-core work of the tile). Visible to the block after the caller's next __syncthreads.
// kByCopier: key j's row at (j % 8) * (NK / 8) + j / 8 instead of j, so that a thread copying keys
// k0, k0 + 8, ... (the wgmma kernel's bf16 copies) reads its NK / 8 rows with vector loads.
template <int NK, bool kByCopier = false, class Row>
__device__ __forceinline__ void kv_tile_rows(Row* rows, const int32_t* table, int64_t key0, int64_t len,
                                             int64_t block_size, int64_t kvh, int64_t head) {
  if (threadIdx.x < NK) {
    // Positions and block sizes fit 32 bits (DeviceLayout's int32 fields): a 32-bit division, inline
    // (a 64-bit one is a call, whose saved registers spill in the mma.sync kernel).
    const int64_t j = key0 + threadIdx.x;
    const uint32_t pos = static_cast<uint32_t>(j), bs = static_cast<uint32_t>(block_size);
    const uint32_t blk = pos / bs;
    const int slot = kByCopier ? (threadIdx.x % 8) * (NK / 8) + threadIdx.x / 8 : threadIdx.x;
    rows[slot] = static_cast<Row>(
        j < len ? (static_cast<int64_t>(table[blk]) * block_size + (pos - blk * bs)) * kvh + head : -1);
  }
}

// The keys of a kv_tile_rows table into a bf16 tile (rows -1: zeros). bf16 pools: asynchronous
// 16-byte copies (the caller commits and waits); fp8 pools: codes loaded, widened to bf16 and stored,
// with the rows' scales in `scales` (0 past the end). Either way the tile is complete for every
// thread after the caller's next wait + __syncthreads.
template <int HD, int NK, int kThreads, bool kFp8, class ChunkAt, class Row>
__device__ __forceinline__ void load_kv_tile(uint16_t* tile, float* scales, const void* pool, const float* pool_scale,
                                             const Row* rows, ChunkAt chunk_at) {
  if constexpr (!kFp8) {
    constexpr int C = HD / 8;
#pragma unroll 1
    for (int idx = threadIdx.x; idx < NK * C; idx += kThreads) {
      const int key = idx / C, c = idx % C;
      const int64_t row = rows[key];
      const uint16_t* src = static_cast<const uint16_t*>(pool);
      if (row >= 0) src += row * HD + c * 8;
      cp_async16(tile + chunk_at(key, c) * 8, src, row >= 0 ? 16 : 0);
    }
  } else {
    constexpr int C16 = HD / 16;  // 16-code chunks per row
#pragma unroll 1
    for (int idx = threadIdx.x; idx < NK * C16; idx += kThreads) {
      const int key = idx / C16, c = idx % C16;
      const int64_t row = rows[key];
      uint4 raw = make_uint4(0, 0, 0, 0);
      if (row >= 0) raw = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(pool) + row * HD + c * 16);
      uint4 lo, hi;
      e4m3x8_to_bf16(raw.x, raw.y, reinterpret_cast<uint32_t(&)[4]>(lo));
      e4m3x8_to_bf16(raw.z, raw.w, reinterpret_cast<uint32_t(&)[4]>(hi));
      *reinterpret_cast<uint4*>(tile + chunk_at(key, 2 * c) * 8) = lo;
      *reinterpret_cast<uint4*>(tile + chunk_at(key, 2 * c + 1) * 8) = hi;
    }
    for (int key = threadIdx.x; key < NK; key += kThreads) scales[key] = rows[key] >= 0 ? pool_scale[rows[key]] : 0.0f;
  }
}

// Rows i0 .. i0 + NR of a span's (token, query head) rows of kv head h (row i: token i / group, query
// head h * group + i % group) split into bf16 hi / lo tiles; rows past the span (i >= rows) repeat
// its last row (never stored). rb: the span's first token row.
template <int HD, int NR, int kThreads, class ChunkAt>
__device__ __forceinline__ void load_q_split(uint16_t* q_hi, uint16_t* q_lo, const AttentionArgs& a, int64_t rb,
                                             int h, int i0, int rows, ChunkAt chunk_at) {
  constexpr int C = HD / 8;
  const int G = a.group;
  for (int idx = threadIdx.x; idx < NR * C; idx += kThreads) {
    const int r = idx / C, c = idx % C;
    const int i = min(i0 + r, rows - 1);
    const float* src = a.q + ((rb + i / G) * a.nh + h * G + i % G) * HD + c * 8;
    const float4 x0 = *reinterpret_cast<const float4*>(src), x1 = *reinterpret_cast<const float4*>(src + 4);
    uint4 hi, lo;
    split_pack(x0.x, x0.y, hi.x, lo.x);
    split_pack(x0.z, x0.w, hi.y, lo.y);
    split_pack(x1.x, x1.y, hi.z, lo.z);
    split_pack(x1.z, x1.w, hi.w, lo.w);
    *reinterpret_cast<uint4*>(q_hi + chunk_at(r, c) * 8) = hi;
    *reinterpret_cast<uint4*>(q_lo + chunk_at(r, c) * 8) = lo;
  }
}

// P (a softmax_tile result) for keys 16 kk .. 16 kk + 16 as A fragments split into bf16 hi / lo;
// v_sc (fp8 pools): each key's V scale folded into its probability, or null.
template <int NK>
__device__ __forceinline__ void p_fragments(const float (&p)[NK / 8][4], const float* v_sc, int kk, int lane,
                                            uint32_t (&ph)[4], uint32_t (&pl)[4]) {
  const int q4 = lane % 4;
  float x[2][4];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      x[hf][e] = p[2 * kk + hf][e];
      if (v_sc) x[hf][e] *= v_sc[kk * 16 + hf * 8 + q4 * 2 + (e & 1)];
    }
  split_pack(x[0][0], x[0][1], ph[0], pl[0]);
  split_pack(x[0][2], x[0][3], ph[1], pl[1]);
  split_pack(x[1][0], x[1][1], ph[2], pl[2]);
  split_pack(x[1][2], x[1][3], ph[3], pl[3]);
}

// The single-bf16 forms of load_q_split and p_fragments (the wgmma prefill kernel's operands on
// bf16 / fp8 pools): each value rounded once to bf16 (round to nearest even), no lo half.
template <int HD, int NR, int kThreads, class ChunkAt>
__device__ __forceinline__ void load_q_bf16(uint16_t* q_tile, const AttentionArgs& a, int64_t rb, int h, int i0,
                                            int rows, ChunkAt chunk_at) {
  constexpr int C = HD / 8;
  const int G = a.group;
  for (int idx = threadIdx.x; idx < NR * C; idx += kThreads) {
    const int r = idx / C, c = idx % C;
    const int i = min(i0 + r, rows - 1);
    const float* src = a.q + ((rb + i / G) * a.nh + h * G + i % G) * HD + c * 8;
    const float4 x0 = *reinterpret_cast<const float4*>(src), x1 = *reinterpret_cast<const float4*>(src + 4);
    uint4 b;
    b.x = bf16x2_rn(x0.x, x0.y);
    b.y = bf16x2_rn(x0.z, x0.w);
    b.z = bf16x2_rn(x1.x, x1.y);
    b.w = bf16x2_rn(x1.z, x1.w);
    *reinterpret_cast<uint4*>(q_tile + chunk_at(r, c) * 8) = b;
  }
}

template <int NK>
__device__ __forceinline__ void p_fragments_bf16(const float (&p)[NK / 8][4], const float* v_sc, int kk, int lane,
                                                 uint32_t (&pa)[4]) {
  const int q4 = lane % 4;
  float x[2][4];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      x[hf][e] = p[2 * kk + hf][e];
      if (v_sc) x[hf][e] *= v_sc[kk * 16 + hf * 8 + q4 * 2 + (e & 1)];
    }
  pa[0] = bf16x2_rn(x[0][0], x[0][1]);
  pa[1] = bf16x2_rn(x[0][2], x[0][3]);
  pa[2] = bf16x2_rn(x[1][0], x[1][1]);
  pa[3] = bf16x2_rn(x[1][2], x[1][3]);
}

// sacc = Q[:, d0 .. d0 + DW) K[0 .. NK, d0 .. d0 + DW)ᵀ, Q as hi + lo.
template <int HD, int DW, int NK>
__device__ __forceinline__ void qk_tile(float (&sacc)[NK / 8][4], const uint32_t (&qh)[DW / 16][4],
                                        const uint32_t (&ql)[DW / 16][4], const uint16_t* k_tile, int d0, int lane) {
#pragma unroll
  for (int j = 0; j < NK / 8; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < DW / 16; ++kk)
#pragma unroll
    for (int np = 0; np < NK / 16; ++np) {
      uint32_t b[4];
      const int chunk = (d0 + kk * 16) / 8 + (lane / 8) % 2;
      ldmatrix_x4(b, smem_addr(k_tile + tile_chunk<HD>(np * 16 + (lane / 16) * 8 + lane % 8, chunk) * 8));
      mma_bf16_16816(sacc[2 * np], ql[kk], b[0], b[1]);
      mma_bf16_16816(sacc[2 * np], qh[kk], b[0], b[1]);
      mma_bf16_16816(sacc[2 * np + 1], ql[kk], b[2], b[3]);
      mma_bf16_16816(sacc[2 * np + 1], qh[kk], b[2], b[3]);
    }
}

// Warps w = 0 .. W-1 each computed the scores' partial sum over their dims: every warp gets the
// sum in warp order (the same floats in every warp). sbuf: shared [W][NK / 8][32] float4, the
// caller's __syncthreads before the next write to it.
template <int W, int NK>
__device__ __forceinline__ void sum_score_partials(float (&sacc)[NK / 8][4], float4* sbuf, int wd, int lane) {
#pragma unroll
  for (int j = 0; j < NK / 8; ++j)
    sbuf[(wd * (NK / 8) + j) * 32 + lane] = make_float4(sacc[j][0], sacc[j][1], sacc[j][2], sacc[j][3]);
  __syncthreads();
#pragma unroll
  for (int j = 0; j < NK / 8; ++j) {
    float4 t = sbuf[j * 32 + lane];
#pragma unroll
    for (int w = 1; w < W; ++w) {
      const float4 u = sbuf[(w * (NK / 8) + j) * 32 + lane];
      t.x += u.x;
      t.y += u.y;
      t.z += u.z;
      t.w += u.w;
    }
    sacc[j][0] = t.x;
    sacc[j][1] = t.y;
    sacc[j][2] = t.z;
    sacc[j][3] = t.w;
  }
}

// One tile of the online softmax (base 2): raw scores of keys key0 .. key0 + NK become
// probabilities; with `masked`, a key at or past a row's limit gets none (callers pass false for
// tiles every row sees whole). m, l: the rows' running max and (this thread's partial) sum; o is
// rescaled with them. k_sc: the keys' fp8 scales, or null.
template <int NK, int NO>
__device__ __forceinline__ void softmax_tile(float (&sacc)[NK / 8][4], float (&m)[2], float (&l)[2], float (&o)[NO][4],
                                             float scale2, const float* k_sc, int64_t key0, bool masked,
                                             const int64_t (&limit)[2], int lane) {
  const int q4 = lane % 4;
  float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < NK / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int kc = j * 8 + q4 * 2 + (e & 1);
      float v = sacc[j][e] * scale2;
      if (k_sc) v *= k_sc[kc];
      if (masked && key0 + kc >= limit[e >> 1]) v = -INFINITY;
      sacc[j][e] = v;
      tmax[e >> 1] = fmaxf(tmax[e >> 1], v);
    }
  float m_use[2], corr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
    tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
    const float m_new = fmaxf(m[r], tmax[r]);
    m_use[r] = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet: p = 0, no NaN
    corr[r] = exp2_ftz(m[r] - m_use[r]);
    m[r] = m_new;
    l[r] *= corr[r];
  }
  // Once the running maxima settle most tiles change none of the warp's rows: o *= 1 is exact, so
  // skipping it is too (and saves NO * 4 multiplies a thread).
  if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
    for (int nt = 0; nt < NO; ++nt) {
      o[nt][0] *= corr[0];
      o[nt][1] *= corr[0];
      o[nt][2] *= corr[1];
      o[nt][3] *= corr[1];
    }
  }
#pragma unroll
  for (int j = 0; j < NK / 8; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = exp2_ftz(sacc[j][e] - m_use[e >> 1]);
      l[e >> 1] += p;
      sacc[j][e] = p;
    }
}

// o += P V[0 .. NK, d0 .. d0 + DW), P as hi + lo; v_sc (fp8 pools): each key's V scale folded into
// its probability, or null.
template <int HD, int DW, int NK>
__device__ __forceinline__ void pv_tile(float (&o)[DW / 8][4], const float (&p)[NK / 8][4], const uint16_t* v_tile,
                                        const float* v_sc, int d0, int lane) {
#pragma unroll
  for (int kk = 0; kk < NK / 16; ++kk) {
    uint32_t ph[4], pl[4];
    p_fragments<NK>(p, v_sc, kk, lane, ph, pl);
#pragma unroll
    for (int dp = 0; dp < DW / 16; ++dp) {
      uint32_t b[4];
      const int chunk = (d0 + dp * 16) / 8 + lane / 16;
      ldmatrix_x4_trans(b, smem_addr(v_tile + tile_chunk<HD>(kk * 16 + ((lane / 8) % 2) * 8 + lane % 8, chunk) * 8));
      mma_bf16_16816(o[2 * dp], pl, b[0], b[1]);
      mma_bf16_16816(o[2 * dp], ph, b[0], b[1]);
      mma_bf16_16816(o[2 * dp + 1], pl, b[2], b[3]);
      mma_bf16_16816(o[2 * dp + 1], ph, b[2], b[3]);
    }
  }
}

// The row sums l completed across the four threads of a row.
__device__ __forceinline__ void finish_row_sums(float (&l)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
}

// Row r's (r = 0, 1: g8, g8 + 8) output slice o / l, times sigmoid(gate) when gated (the
// expression sigmoid_mul applies to the stored value), written at element offset `off`.
template <int DW>
__device__ __forceinline__ void store_row(const AttentionArgs& a, const float (&o)[DW / 8][4], int r, float l,
                                          int64_t off, int d0, int lane) {
#pragma unroll
  for (int nt = 0; nt < DW / 8; ++nt) {
    const int64_t d = d0 + nt * 8 + (lane % 4) * 2;
    float2 y = make_float2(o[nt][2 * r] / l, o[nt][2 * r + 1] / l);
    if (a.gate) {
      const float2 g = *reinterpret_cast<const float2*>(a.gate + off + d);
      y.x *= sigmoid_f(g.x);
      y.y *= sigmoid_f(g.y);
    }
    *reinterpret_cast<float2*>(a.out + off + d) = y;
  }
}

}  // namespace sparkserve
