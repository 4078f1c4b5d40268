// Flash attention for prefill on Hopper's warpgroup MMA (sm_90a, head_dim 256; the other targets and
// head dims take attention_prefill.cu's mma.sync kernel). Same rows, masking, online softmax,
// precision (Q and P as bf16 hi + lo, K and V exact bf16) and output as that kernel; what changes is
// who reads the operands: S = Q·Kᵀ is m64n64k16 with Q (hi, lo) and K both read by the tensor cores
// from shared memory (K-major, 128-byte swizzle), and O += P·V is m64n256k16 with P from registers
// (the S accumulators turned into A fragments in place) and V read N-major (transposed) from shared
// memory. No Q or K fragments go through registers, and the 64 x 256 f32 output of a warpgroup sits
// in its accumulators.
//
// CTA: 2 warpgroups, 128 (token, query head) rows of one span and kv head (64 per warpgroup), keys
// in tiles of 64: V's copy overlaps S and the softmax, the next K's copy overlaps P·V. A launch of
// fewer CTAs than SMs (a few hundred new tokens after a long cached prefix: an agent turn) also
// splits the keys over CTAs (prefill_splits); each split writes its unnormalised rows with their
// max and sum, and prefill_combine_kernel merges them in split order.
// Shared memory: Q hi + lo 128 KB, K 32 KB, V 32 KB, fp8 row scales 512 B (+1 KB alignment).
#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/wgmma_primitives.cuh"

namespace sparkserve {
namespace {

constexpr int HD = 256;
constexpr int kThreads = 256;               // 2 warpgroups
constexpr int kRows = 128;                  // query rows per CTA
constexpr int kQBytes = kRows * HD * 2;     // one of Q hi / lo

// NK keys per tile; kMode 0: one K and one V buffer (two CTA barriers per tile); 1: K and V
// double-buffered (the next tile's copies issued a whole tile ahead, one CTA barrier per tile);
// 2: double-buffered ping-pong (warpgroup 0 copies K, warpgroup 1 V, completing on mbarriers; the
// warpgroups take turns issuing S, no CTA barrier in the loop).
template <int NK, int kMode>
struct TileCfg {
  static constexpr int kBufs = kMode ? 2 : 1;
  static constexpr int kKvBytes = NK * HD * 2;  // one K or V tile
  static constexpr int kSmem = 2 * kQBytes + 2 * kBufs * kKvBytes + 2 * kBufs * NK * 4 + 1024;
};

template <int NR>
struct SwChunk {
  __device__ int operator()(int row, int chunk) const { return sw128_chunk<NR>(row, chunk); }
};

// A bf16 K or V tile of NK keys (pool rows `rows`, -1: zeros) in the 128-byte swizzle, by cp.async
// from NT threads (t: this thread's index among them): thread t copies 16-byte chunk c = t % 32 of
// keys t / 32 + (NT / 32) j + 8 i, whose destinations are 1 KB apart in i (the swizzle depends on
// key % 8 only), so a copy is a row lookup, an address and the cp.async (load_kv_tile's general loop
// spends ~45 instructions on each).
template <int NK, int NT>
__device__ __forceinline__ void copy_tile_bf16(uint16_t* tile, const uint16_t* pool, const int32_t* rows, int t) {
  static_assert(HD == 256 && NK % 8 == 0 && (NT == 128 || NT == 256), "32 chunks per key row, 4 or 8 keys per pass");
  const int c = t % 32;
#pragma unroll
  for (int j = 0; j < 256 / NT; ++j) {
    const int k0 = t / 32 + (NT / 32) * j;
    uint16_t* dst = tile + sw128_chunk<NK>(k0, c) * 8;
    const uint16_t* src = pool + c * 8;
#pragma unroll
    for (int i = 0; i < NK / 8; ++i) {
      const int32_t row = rows[k0 + 8 * i];
      cp_async16(dst + i * 64 * 8, src + static_cast<int64_t>(max(row, 0)) * HD, row >= 0 ? 16 : 0);
    }
  }
}

#ifdef SPARKSERVE_HAS_WGMMA
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// An arrival on `bar` once every cp.async this thread issued so far has landed.
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
#endif

#ifdef SPARKSERVE_HAS_WGMMA
// sacc += Q·Kᵀ for the warpgroup's 64 rows and the tile's NK keys, Q as lo then hi.
template <int NK>
__device__ __forceinline__ void qk_wgmma(float (&sacc)[NK / 8][4], const uint8_t* qh_base, const uint8_t* ql_base,
                                         const uint8_t* k_base) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    const int off = (kk % 4) * 32;  // the k16 slice within the 64-column block kk / 4
    const uint64_t dk = sw128_desc(k_base + (kk / 4) * NK * 128 + off);
    const uint64_t dl = sw128_desc(ql_base + (kk / 4) * kRows * 128 + off);
    const uint64_t dh = sw128_desc(qh_base + (kk / 4) * kRows * 128 + off);
    if constexpr (NK == 64) {
      wgmma_m64n64k16_ss_bf16(sacc, dl, dk);
      wgmma_m64n64k16_ss_bf16(sacc, dh, dk);
    } else if constexpr (NK == 96) {
      wgmma_m64n96k16_ss_bf16(sacc, dl, dk);
      wgmma_m64n96k16_ss_bf16(sacc, dh, dk);
    } else {
      static_assert(NK == 48, "key tiles of 48, 64 or 96");
      wgmma_m64n48k16_ss_bf16(sacc, dl, dk);
      wgmma_m64n48k16_ss_bf16(sacc, dh, dk);
    }
  }
}

// o += P·V for the tile's NK keys, P as lo then hi (fp8: each probability times its row's V scale).
template <int NK>
__device__ __forceinline__ void pv_wgmma(float (&o)[HD / 8][4], const float (&sacc)[NK / 8][4], const float* v_sc,
                                         const uint8_t* v_base, int lane) {
  uint32_t ph[NK / 16][4], pl[NK / 16][4];
#pragma unroll
  for (int kk = 0; kk < NK / 16; ++kk) p_fragments<NK>(sacc, v_sc, kk, lane, ph[kk], pl[kk]);
  wgmma_fence_operand(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < NK / 16; ++kk) {
    const uint64_t dv = sw128_desc(v_base + kk * 16 * 128, NK * 128);
    wgmma_m64n256k16_rs_bf16_tn(o, pl[kk], dv);
    wgmma_m64n256k16_rs_bf16_tn(o, ph[kk], dv);
  }
  wgmma_commit();
}
#endif

// part_o / part_ml null: the output written directly; else (key splits, blockIdx.z of gridDim.z)
// the split's unnormalised output rows [split][T * nh][HD] and their (max, sum) [split][T * nh][2].
template <bool kFp8, int NK, int kMode>
__global__ void __launch_bounds__(kThreads, 1) attention_prefill_wgmma_kernel(AttentionArgs a, float* part_o,
                                                                              float* part_ml) {
#ifdef SPARKSERVE_HAS_WGMMA
  using C = TileCfg<NK, kMode>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint16_t* q_hi = reinterpret_cast<uint16_t*>(smem);
  uint16_t* q_lo = reinterpret_cast<uint16_t*>(smem + kQBytes);
  // Buffer b of K at kv + b * kKvBytes, of V at kv + (kBufs + b) * kKvBytes; scales likewise.
  uint8_t* kv = smem + 2 * kQBytes;
  float* scales = reinterpret_cast<float*>(kv + 2 * C::kBufs * C::kKvBytes);
  auto k_buf = [&](int b) { return reinterpret_cast<uint16_t*>(kv + b * C::kKvBytes); };
  auto v_buf = [&](int b) { return reinterpret_cast<uint16_t*>(kv + (C::kBufs + b) * C::kKvBytes); };
  auto k_scl = [&](int b) { return scales + b * NK; };
  auto v_scl = [&](int b) { return scales + (C::kBufs + b) * NK; };

  const DeviceLayout& L = a.L;
  const int G = a.group, h = blockIdx.y;
  // Work item -> (span, tile); within a span the last tiles (which see the most keys) go first.
  int w = blockIdx.x, s = 0, tiles = 0;
  for (; s < L.num_seqs; ++s) {
    tiles = (L.num_tokens(s) * G + kRows - 1) / kRows;
    if (w < tiles) break;
    w -= tiles;
  }
  if (s >= L.num_seqs) return;
  const int tile = tiles - 1 - w;
  const int rows = L.num_tokens(s) * G;
  const int64_t start = L.start_pos(s), rb = L.row_begin(s);
  const int i0 = tile * kRows;
  const int64_t kv_len = start + (min(i0 + kRows, rows) - 1) / G + 1;  // keys the CTA's last row sees
  const int64_t bs = a.kv.block_size, kvh = a.kv.kvh;
  const int32_t* table = L.table(s);

  load_q_split<HD, kRows, kThreads>(q_hi, q_lo, a, rb, h, i0, rows, SwChunk<kRows>{});

  const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32, g8 = lane / 4;
  const int w0 = i0 + wg * 64;  // the warpgroup's first row
  const int64_t wg_first = start + min(w0, rows - 1) / G + 1;        // keys its first row sees
  int64_t limit[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) limit[e] = start + min(w0 + warp * 16 + g8 + 8 * e, rows - 1) / G + 1;
  float o[HD / 8][4];
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float scale2 = a.scale * kLog2e;
  // The warpgroup's Q rows within each 64-column block (K-major operand A).
  const uint8_t* qh_base = reinterpret_cast<const uint8_t*>(q_hi) + wg * 64 * 128;
  const uint8_t* ql_base = reinterpret_cast<const uint8_t*>(q_lo) + wg * 64 * 128;

  // This split's key tiles [t_begin, t_end) of the tiles the CTA needs (all of them unsplit).
  const int n_tiles = static_cast<int>((kv_len + NK - 1) / NK);
  const int per_split = (n_tiles + gridDim.z - 1) / gridDim.z;
  const int t_begin = blockIdx.z * per_split, t_end = min(t_begin + per_split, n_tiles);
  // Pool rows of the keys of tile kt in key_rows[kt % 2], written (by NK threads) a barrier before
  // the copies that read them.
  __shared__ int32_t key_rows[2][NK];  // pool rows < 2^31 (kv_view checks)
  auto tile_rows = [&](int kt) {
    kv_tile_rows<NK>(key_rows[kt % 2], table, static_cast<int64_t>(kt) * NK, kv_len, bs, kvh, h);
  };
  auto copy_k = [&](int kt, int b) {
    if constexpr (kFp8)
      load_kv_tile<HD, NK, kThreads, true>(k_buf(b), k_scl(b), a.kv.k, a.kv.k_scale, key_rows[kt % 2], SwChunk<NK>{});
    else
      copy_tile_bf16<NK, kThreads>(k_buf(b), static_cast<const uint16_t*>(a.kv.k), key_rows[kt % 2], threadIdx.x);
  };
  auto copy_v = [&](int kt, int b) {
    if constexpr (kFp8)
      load_kv_tile<HD, NK, kThreads, true>(v_buf(b), v_scl(b), a.kv.v, a.kv.v_scale, key_rows[kt % 2], SwChunk<NK>{});
    else
      copy_tile_bf16<NK, kThreads>(v_buf(b), static_cast<const uint16_t*>(a.kv.v), key_rows[kt % 2], threadIdx.x);
  };
  // S for the tile's keys, then its softmax (a warpgroup whose rows see none of the tile's keys runs
  // S too, fully masked: an exact no-op that keeps every wgmma on a uniform path, which ptxas needs
  // to leave them asynchronous). `during` runs while the MMAs do.
  auto scores = [&](float (&sacc)[NK / 8][4], int kt, int b, auto during) {
    const int64_t key0 = static_cast<int64_t>(kt) * NK;
#pragma unroll
    for (int j = 0; j < NK / 8; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.0f;
    wgmma_fence_operand(sacc);
    wgmma_fence();
    qk_wgmma<NK>(sacc, qh_base, ql_base, reinterpret_cast<const uint8_t*>(k_buf(b)));
    wgmma_commit();
    during();
    wgmma_wait<0>();
    wgmma_fence_operand(sacc);
    softmax_tile<NK, HD / 8>(sacc, m, l, o, scale2, kFp8 ? k_scl(b) : nullptr, key0, key0 + NK > wg_first, limit,
                             lane);
  };

  if constexpr (kMode == 0) {
    // One K and one V buffer: V's copy overlaps S and the softmax, the next K's copy overlaps P·V.
    tile_rows(t_begin);
    __syncthreads();
    if (t_begin < t_end) copy_k(t_begin, 0);
    cp_async_commit();
    for (int kt = t_begin; kt < t_end; ++kt) {
      cp_async_wait_all();
      fence_proxy_async();
      __syncthreads();  // K tile kt in place (and Q on the first pass); every warpgroup is done with V
      float sacc[NK / 8][4];
      scores(sacc, kt, 0, [&] {
        copy_v(kt, 0);
        cp_async_commit();
        // Tile kt + 1's rows go to the other table (its last reader was tile kt - 1's V copy).
        if (kt + 1 < t_end) tile_rows(kt + 1);
      });
      cp_async_wait_all();
      fence_proxy_async();
      __syncthreads();  // V tile kt in place; every warpgroup is done with K
      pv_wgmma<NK>(o, sacc, kFp8 ? v_scl(0) : nullptr, reinterpret_cast<const uint8_t*>(v_buf(0)), lane);
      if (kt + 1 < t_end) copy_k(kt + 1, 0);
      cp_async_commit();
      wgmma_wait<0>();
      wgmma_fence_operand(o);
    }
  } else if constexpr (kMode == 1) {
    // K and V of tile kt in buffers kt % 2; tile kt + 1's copies are issued behind tile kt's S.
    tile_rows(t_begin);
    if (t_begin + 1 < t_end) tile_rows(t_begin + 1);
    __syncthreads();
    if (t_begin < t_end) copy_k(t_begin, t_begin % 2), copy_v(t_begin, t_begin % 2);
    cp_async_commit();
    for (int kt = t_begin; kt < t_end; ++kt) {
      const int b = kt % 2;
      cp_async_wait_all();
      fence_proxy_async();
      // Tile kt in place (and Q on the first pass); every warpgroup is done with tile kt - 1's
      // buffers, and every copy of tile kt (the last reader of key_rows[b]) has been issued.
      __syncthreads();
      float sacc[NK / 8][4];
      scores(sacc, kt, b, [&] {
        if (kt + 1 < t_end) copy_k(kt + 1, b ^ 1), copy_v(kt + 1, b ^ 1);
        cp_async_commit();
        if (kt + 2 < t_end) tile_rows(kt + 2);
      });
      pv_wgmma<NK>(o, sacc, kFp8 ? v_scl(b) : nullptr, reinterpret_cast<const uint8_t*>(v_buf(b)), lane);
      wgmma_wait<0>();
      wgmma_fence_operand(o);
    }
  } else {
    static_assert(!kFp8 && kMode == 2, "ping-pong: bf16 pools");
    // Warpgroup 0 copies the K tiles, warpgroup 1 the V tiles, each completing on the buffer's full
    // mbarrier (cp.async arrive); the buffer's empty mbarrier says the other warpgroup is done with it
    // (K: warpgroup 1's S, V: warpgroup 0's P·V). Row tables in 3 slots per warpgroup: tile kt + 2's
    // are looked up at the start of iteration kt, published by the warpgroup's named barrier right
    // before its copies (a slot's previous reader, tile kt - 1's copies, is two barriers back).
    __shared__ uint64_t bars[8];  // K full [2], V full [2], K empty [2], V empty [2]
    __shared__ int32_t rows3[2][3][NK];
    const uint32_t kfull = static_cast<uint32_t>(__cvta_generic_to_shared(bars)), vfull = kfull + 16,
                   kempty = kfull + 32, vempty = kfull + 48;
    const int lt = threadIdx.x % 128;
    if (threadIdx.x == 0)
      for (int i = 0; i < 8; ++i) mbar_init(kfull + 8 * i, 128);
    auto rows_of = [&](int kt) {
      if (lt < NK) {
        const int64_t j = static_cast<int64_t>(kt) * NK + lt;
        const uint32_t pos = static_cast<uint32_t>(j), ubs = static_cast<uint32_t>(bs), blk = pos / ubs;
        rows3[wg][kt % 3][lt] = static_cast<int32_t>(
            j < kv_len ? (static_cast<int64_t>(table[blk]) * bs + (pos - blk * ubs)) * kvh + h : -1);
      }
    };
    auto issue = [&](int kt) {  // this warpgroup's tile of kt: K (warpgroup 0) or V (1)
      const int b = kt % 2;
      copy_tile_bf16<NK, 128>(wg == 0 ? k_buf(b) : v_buf(b), static_cast<const uint16_t*>(wg == 0 ? a.kv.k : a.kv.v),
                              rows3[wg][kt % 3], lt);
      cp_async_mbar_arrive_noinc((wg == 0 ? kfull : vfull) + 8 * b);
    };
    if (t_begin < t_end) rows_of(t_begin);
    if (t_begin + 1 < t_end) rows_of(t_begin + 1);
    fence_proxy_async();  // Q's shared stores, for the tensor cores
    __syncthreads();      // Q, the mbarriers' init, the first row tables
    if (t_begin < t_end) issue(t_begin);
    if (t_begin + 1 < t_end) issue(t_begin + 1);
    for (int kt = t_begin; kt < t_end; ++kt) {
      const int b = kt % 2;
      const uint32_t par = ((kt - t_begin) >> 1) & 1;
      if (kt + 2 < t_end) rows_of(kt + 2);
      mbar_wait(kfull + 8 * b, par);
      fence_proxy_async();
      // Turns: warpgroup 0 issues S of tile kt, then warpgroup 1, so one's softmax runs under the
      // other's MMAs (named barriers 3 and 4: "warpgroup w may issue").
      if (wg == 1 || kt != t_begin) named_bar_sync(3 + wg, 256);
      float sacc[NK / 8][4];
#pragma unroll
      for (int j = 0; j < NK / 8; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.0f;
      wgmma_fence_operand(sacc);
      wgmma_fence();
      qk_wgmma<NK>(sacc, qh_base, ql_base, reinterpret_cast<const uint8_t*>(k_buf(b)));
      wgmma_commit();
      if (wg == 0 || kt + 1 < t_end) named_bar_arrive(4 - wg, 256);
      wgmma_wait<0>();
      wgmma_fence_operand(sacc);
      if (wg == 1) mbar_arrive(kempty + 8 * b);
      const int64_t key0 = static_cast<int64_t>(kt) * NK;
      softmax_tile<NK, HD / 8>(sacc, m, l, o, scale2, nullptr, key0, key0 + NK > wg_first, limit, lane);
      mbar_wait(vfull + 8 * b, par);
      fence_proxy_async();
      pv_wgmma<NK>(o, sacc, nullptr, reinterpret_cast<const uint8_t*>(v_buf(b)), lane);
      if (wg == 0 && kt + 2 < t_end) {
        mbar_wait(kempty + 8 * b, par);
        named_bar_sync(1, 128);
        issue(kt + 2);
      }
      wgmma_wait<0>();
      wgmma_fence_operand(o);
      if (wg == 0) mbar_arrive(vempty + 8 * b);
      if (wg == 1 && kt + 2 < t_end) {
        mbar_wait(vempty + 8 * b, par);
        named_bar_sync(2, 128);
        issue(kt + 2);
      }
    }
  }

  finish_row_sums(l);
  const int64_t batch_rows = static_cast<int64_t>(L.total_rows) * a.nh;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = w0 + warp * 16 + g8 + 8 * r;
    if (i >= rows) continue;
    const int64_t row = (rb + i / G) * a.nh + h * G + i % G;
    if (!part_o) {
      store_row<HD>(a, o, r, l[r], row * HD, 0, lane);
      continue;
    }
    const int64_t slot = blockIdx.z * batch_rows + row;
#pragma unroll
    for (int nt = 0; nt < HD / 8; ++nt)
      *reinterpret_cast<float2*>(part_o + slot * HD + nt * 8 + (lane % 4) * 2) = make_float2(o[nt][2 * r], o[nt][2 * r + 1]);
    if (lane % 4 == 0) *reinterpret_cast<float2*>(part_ml + slot * 2) = make_float2(m[r], l[r]);
  }
#else
  __trap();  // not built for sm_90a: attention_prefill_wgmma_available() keeps launches away
#endif
}

// One warp per (token, query head) row of the batch merges the row's key splits in split order
// (deterministic): weights exp2(m_c - M) (a split in which the row saw no key has m_c = -inf and
// weight 0; split 0 holds key 0, which every row sees), O = sum_c O_c w_c / sum_c l_c w_c, times
// sigmoid(gate) when gated.
constexpr int kCombineWarps = 8;
__global__ void __launch_bounds__(kCombineWarps * 32) prefill_combine_kernel(AttentionArgs a, int n_split,
                                                                             const float* part_o,
                                                                             const float* part_ml) {
  const int64_t batch_rows = static_cast<int64_t>(a.L.total_rows) * a.nh;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kCombineWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= batch_rows) return;
  float M = -INFINITY;
  for (int c = 0; c < n_split; ++c) M = fmaxf(M, part_ml[(c * batch_rows + row) * 2]);
  float lsum = 0.0f, acc[HD / 32] = {};
  for (int c = 0; c < n_split; ++c) {
    const int64_t slot = c * batch_rows + row;
    const float mc = part_ml[slot * 2];
    if (mc == -INFINITY) continue;
    const float w = exp2f(mc - M);
    lsum += part_ml[slot * 2 + 1] * w;
#pragma unroll
    for (int q = 0; q < HD / 128; ++q) {
      const float4 x = *reinterpret_cast<const float4*>(part_o + slot * HD + q * 128 + lane * 4);
      acc[4 * q] += x.x * w;
      acc[4 * q + 1] += x.y * w;
      acc[4 * q + 2] += x.z * w;
      acc[4 * q + 3] += x.w * w;
    }
  }
#pragma unroll
  for (int q = 0; q < HD / 128; ++q)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t off = row * HD + q * 128 + lane * 4 + e;
      float y = acc[4 * q + e] / lsum;
      if (a.gate) y *= sigmoid_f(a.gate[off]);
      a.out[off] = y;
    }
}

// Key splits per CTA: enough that a launch of few CTAs (a short chunk after a long prefix: an agent
// turn) fills the device. Time ~ waves x (tiles per split + ~2 tiles of per-CTA work: the Q load and
// the partial write-out), over n = 1 .. kMaxSplits; a launch of a wave or more stays unsplit.
constexpr int kMaxSplits = 16;
int prefill_splits(int64_t ctas, int64_t max_len, int sms, int nk) {
  if (ctas >= sms) return 1;
  const double tiles = static_cast<double>((max_len + nk - 1) / nk);
  int best = 1;
  double best_t = tiles + 2.0;
  for (int n = 2; n <= kMaxSplits && n <= tiles; ++n) {
    const double waves = static_cast<double>((ctas * n + sms - 1) / sms);
    const double t = waves * (tiles / n + 2.0);
    if (t < best_t) best = n, best_t = t;
  }
  return best;
}

// The opt-in shared memory of one block (less the kernel's static key-row table).
int64_t smem_optin() {
  static const int64_t v = [] {
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return static_cast<int64_t>(optin) - 2 * 96 * 4;
  }();
  return v;
}

// A/B (gpu_ops): 0 = 64-key tiles, one K and one V buffer; 1 = 48-key tiles double-buffered;
// 2 = 96-key tiles, one buffer each; 3 = 48-key ping-pong (bf16; fp8 takes 1).
int g_variant = 0;

}  // namespace

bool attention_prefill_wgmma_available() {
  static const bool ok =
      sm90a_kernel_runs(reinterpret_cast<const void*>(attention_prefill_wgmma_kernel<false, 64, false>)) &&
      TileCfg<64, 0>::kSmem <= smem_budget();
  return ok;
}

bool attention_prefill_wgmma_variant(int v) {
  if (v == 1 && TileCfg<48, 1>::kSmem > smem_optin()) return false;
  if (v == 2 && TileCfg<96, 0>::kSmem > smem_optin()) return false;
  if (v == 3 && TileCfg<48, 2>::kSmem + 8 * 8 + 2 * 3 * 48 * 4 > smem_optin() + 2 * 96 * 4) return false;
  g_variant = v;
  return true;
}

namespace {
template <bool kFp8, int NK, int kMode>
void launch(CudaBackend& be, const AttentionArgs& a) {
  static int64_t allowed = 0;
  constexpr int kSmem = TileCfg<NK, kMode>::kSmem;
  auto kernel = attention_prefill_wgmma_kernel<kFp8, NK, kMode>;
  allow_smem(kernel, kSmem, allowed);
  // Tiles of all spans: sum of ceil(n_s * G / 128) <= total_rows * G / 128 + spans.
  const int64_t work = (static_cast<int64_t>(a.L.total_rows) * a.group) / kRows + a.L.num_seqs;
  const int n_split = prefill_splits(work * a.kv.kvh, a.L.max_len, be.sm_count(), NK);
  const dim3 grid(static_cast<unsigned>(work), static_cast<unsigned>(a.kv.kvh), static_cast<unsigned>(n_split));
  if (n_split == 1) {
    kernel<<<grid, kThreads, kSmem, be.stream()>>>(a, nullptr, nullptr);
    CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t batch_rows = static_cast<int64_t>(a.L.total_rows) * a.nh;
  CudaBackend::Scratch part(&be, static_cast<size_t>(n_split * batch_rows) * (HD + 2) * sizeof(float));
  float* part_o = part.as<float>();
  float* part_ml = part_o + n_split * batch_rows * HD;
  kernel<<<grid, kThreads, kSmem, be.stream()>>>(a, part_o, part_ml);
  CUDA_CHECK_LAUNCH();
  const unsigned cblocks = static_cast<unsigned>((batch_rows + kCombineWarps - 1) / kCombineWarps);
  prefill_combine_kernel<<<cblocks, kCombineWarps * 32, 0, be.stream()>>>(a, n_split, part_o, part_ml);
  CUDA_CHECK_LAUNCH();
}
}  // namespace

void launch_attention_prefill_wgmma(CudaBackend& be, const AttentionArgs& a, bool fp8) {
  CHECK(a.kv.hd == HD);
  if (g_variant == 1) return fp8 ? launch<true, 48, 1>(be, a) : launch<false, 48, 1>(be, a);
  if (g_variant == 2) return fp8 ? launch<true, 96, 0>(be, a) : launch<false, 96, 0>(be, a);
  if (g_variant == 3) return fp8 ? launch<true, 48, 1>(be, a) : launch<false, 48, 2>(be, a);
  fp8 ? launch<true, 64, 0>(be, a) : launch<false, 64, 0>(be, a);
}

}  // namespace sparkserve
