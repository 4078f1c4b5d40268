// Flash attention for prefill on Hopper's warpgroup MMA (sm_90a, head_dim 256; the other targets and
// head dims take attention_prefill.cu's mma.sync kernel). Same rows, masking, online softmax and
// output as that kernel; S = Q·Kᵀ is m64n96k16 with Q and K both read by the tensor cores from shared
// memory (K-major, 128-byte swizzle), and O += P·V is m64n256k16 with P from registers (the S
// accumulators turned into A fragments in place) and V read N-major (transposed) from shared memory.
// No Q or K fragments go through registers, and the 64 x 256 f32 output of a warpgroup sits in its
// accumulators.
//
// Precision: Q and P are single bf16 operands (round to nearest even; fp8 pools: P times the key's V
// scale, then rounded), K and V exact bf16 (the pool's values), products accumulated in f32, the
// softmax (max, exponentials, row sums) in f32 on the unrounded scores. This is what production
// attention kernels on bf16 KV caches compute (FlashAttention's bf16 path: bf16 Q·Kᵀ, bf16-rounded P
// times V, f32 accumulation); against the CPU backend's f32 arithmetic on the same K/V values it adds
// one bf16 rounding (relative <= 2^-8) of each Q and P value: ~4e-3 of max|out| on gpu_ops' random
// inputs (attention_kv_checks.cpp derives the bound). The mma.sync kernels (other targets, decode)
// keep Q and P as bf16 hi + lo pairs (~1e-5); f32 pools take the SIMT kernel (exact f32).
//
// CTA: 2 warpgroups, 128 (token, query head) rows of one span and kv head (64 per warpgroup), keys
// in tiles of 96: V's copy overlaps S and the softmax, the next K's copy overlaps P·V. 96-key tiles
// because S reads Q and K from shared memory for every k16 step: at 64 keys that is the whole
// shared-memory bandwidth at the tensor cores' rate, at 96 five sixths. A launch of fewer CTAs than
// SMs (a few hundred new tokens after a long cached prefix: an agent turn) also splits the keys over
// CTAs (prefill_splits); each split writes its unnormalised rows with their max and sum, and
// prefill_combine_kernel merges them in split order. With Q's lo half gone (64 KB free), 128-key tiles,
// P·V deferred behind the next tile's S (V double-buffered, the softmax under P·V) and K
// double-buffered (its copy a whole tile ahead) were measured and tied or lost (docs/performance.md,
// attnbf).
// Shared memory: Q 64 KB, K 48 KB, V 48 KB, fp8 row scales 768 B, +1 KB alignment, and a 768-byte
// table of the tile's pool rows.
#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/wgmma_primitives.cuh"

namespace sparkserve {
namespace {

constexpr int HD = 256;
constexpr int kThreads = 256;            // 2 warpgroups
constexpr int kRows = 128;               // query rows per CTA
constexpr int kQBytes = kRows * HD * 2;  // Q as bf16

constexpr int kKeys = 96;                // keys per tile
constexpr int kKvBytes = kKeys * HD * 2;  // one K or V tile
constexpr int kSmem = kQBytes + 2 * kKvBytes + 2 * kKeys * 4 + 1024;  // Q, K, V, fp8 row scales, alignment
constexpr int kStaticSmem = 2 * kKeys * 4;  // key_rows

template <int NR>
struct SwChunk {
  __device__ int operator()(int row, int chunk) const { return sw128_chunk<NR>(row, chunk); }
};

#ifdef SPARKSERVE_HAS_WGMMA  // (only the sm_90a pass has the kernel that uses them)
// A bf16 K or V tile of NK keys (pool rows `rows`, -1: zeros) in the 128-byte swizzle, by cp.async:
// thread t copies 16-byte chunk c = t % 32 of keys t / 32 + 8 i, whose destinations are 1 KB apart
// (the swizzle depends on key % 8 only), so a copy is an address and the cp.async (load_kv_tile's
// general loop spent ~45 instructions on each, and the warps sat in it).
template <int NK>
__device__ __forceinline__ void copy_tile_bf16(uint16_t* tile, const uint16_t* pool, const int32_t* rows) {
  static_assert(kThreads == 256 && HD == 256 && NK % 32 == 0, "32 chunks per key row, 8 keys per pass");
  const int c = threadIdx.x % 32, k0 = threadIdx.x / 32;
  uint16_t* dst = tile + sw128_chunk<NK>(k0, c) * 8;
  const uint16_t* src = pool + c * 8;
  // The thread's rows (kv_tile_rows<NK, true>: keys k0 + 8 i side by side), by 16-byte loads: one
  // shared load per row was a dependent chain in front of each copy, where the warps' stalls sat.
  int32_t r[NK / 8];
#pragma unroll
  for (int v = 0; v < NK / 32; ++v)
    *reinterpret_cast<int4*>(r + 4 * v) = reinterpret_cast<const int4*>(rows + k0 * (NK / 8))[v];
#pragma unroll
  for (int i = 0; i < NK / 8; ++i)
    cp_async16(dst + i * 64 * 8, src + static_cast<int64_t>(max(r[i], 0)) * HD, r[i] >= 0 ? 16 : 0);
}

// sacc += Q Kᵀ over the 16 k16 steps of head_dim, Q and K tiles through their descriptors.
template <int NK, int kQRows>
__device__ __forceinline__ void qk_wgmma(float (&sacc)[NK / 8][4], uint64_t q_desc, uint64_t k_desc) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    const int off = (kk % 4) * 32;  // the k16 slice within the 64-column block kk / 4
    const uint64_t dq = q_desc + (((kk / 4) * kQRows * 128 + off) >> 4);
    const uint64_t dk = k_desc + (((kk / 4) * NK * 128 + off) >> 4);
    static_assert(NK == 96, "m64n96k16");
    wgmma_m64n96k16_ss_bf16(sacc, dq, dk);
  }
}
#endif

// The CTA's span, row tile and the keys its rows see.
struct CtaWork {
  int s, rows, i0;
  int64_t start, rb, kv_len;
};
__device__ __forceinline__ bool cta_work(const DeviceLayout& L, int G, CtaWork& c) {
  // Work item -> (span, tile); within a span the last tiles (which see the most keys) go first.
  int w = blockIdx.x, s = 0, tiles = 0;
  for (; s < L.num_seqs; ++s) {
    tiles = (L.num_tokens(s) * G + kRows - 1) / kRows;
    if (w < tiles) break;
    w -= tiles;
  }
  if (s >= L.num_seqs) return false;
  c.s = s;
  c.rows = L.num_tokens(s) * G;
  c.i0 = (tiles - 1 - w) * kRows;
  c.start = L.start_pos(s);
  c.rb = L.row_begin(s);
  c.kv_len = c.start + (min(c.i0 + kRows, c.rows) - 1) / G + 1;  // keys the CTA's last row sees
  return true;
}

// The CTA's output rows (r = 0, 1 of the thread): o / l (gated) into a.out, or with key splits the
// split's unnormalised rows and (max, sum) into part_o / part_ml.
__device__ __forceinline__ void write_rows(const AttentionArgs& a, const float (&o)[HD / 8][4], const float (&m)[2],
                                           float (&l)[2], int w0, int warp, int g8, int lane, int rows, int64_t rb,
                                           int G, int h, float* part_o, float* part_ml) {
  finish_row_sums(l);
  const int64_t batch_rows = static_cast<int64_t>(a.L.total_rows) * a.nh;
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
}

// part_o / part_ml null: the output written directly; else (key splits, blockIdx.z of gridDim.z)
// the split's unnormalised output rows [split][T * nh][HD] and their (max, sum) [split][T * nh][2].
template <bool kFp8>
__global__ void __launch_bounds__(kThreads, 1) attention_prefill_wgmma_kernel(AttentionArgs a, float* part_o,
                                                                              float* part_ml) {
#ifdef SPARKSERVE_HAS_WGMMA
  constexpr int NK = kKeys;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  uint16_t* q_tile = reinterpret_cast<uint16_t*>(smem);
  uint16_t* k_tile = reinterpret_cast<uint16_t*>(smem + kQBytes);
  uint16_t* v_tile = reinterpret_cast<uint16_t*>(smem + kQBytes + kKvBytes);
  float* k_sc = reinterpret_cast<float*>(smem + kQBytes + 2 * kKvBytes);
  float* v_sc = k_sc + NK;

  const DeviceLayout& L = a.L;
  const int G = a.group, h = blockIdx.y;
  CtaWork c;
  if (!cta_work(L, G, c)) return;
  const int rows = c.rows, i0 = c.i0;
  const int64_t start = c.start, rb = c.rb, kv_len = c.kv_len;
  const int64_t bs = a.kv.block_size, kvh = a.kv.kvh;
  const int32_t* table = L.table(c.s);

  load_q_bf16<HD, kRows, kThreads>(q_tile, a, rb, h, i0, rows, SwChunk<kRows>{});

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
  // Descriptors of the warpgroup's Q rows (K-major operand A) and of the K and V tiles. A
  // descriptor's low 14 bits are the start address / 16 (shared addresses < 256 KB), so a step
  // through an operand is the add of a constant.
  const uint64_t q_desc = sw128_desc(reinterpret_cast<const uint8_t*>(q_tile) + wg * 64 * 128);
  const uint64_t k_desc = sw128_desc(k_tile), v_desc = sw128_desc(v_tile, NK * 128);

  // This split's key tiles [t_begin, t_end) of the tiles the CTA needs (all of them unsplit).
  const int n_tiles = static_cast<int>((kv_len + NK - 1) / NK);
  const int per_split = (n_tiles + gridDim.z - 1) / gridDim.z;
  const int t_begin = blockIdx.z * per_split, t_end = min(t_begin + per_split, n_tiles);
  // Pool rows of the keys of tile kt in key_rows[kt % 2]: tile kt + 1's are looked up between the
  // two barriers of tile kt (after every use of the slot's previous tile, before K(kt + 1)'s copy).
  __shared__ __align__(16) int32_t key_rows[2][NK];  // pool rows < 2^31 (kv_view checks)
  static_assert(sizeof(key_rows) == kStaticSmem, "the launcher's shared-memory sum");
  auto tile_rows = [&](int kt) {
    kv_tile_rows<NK, !kFp8>(key_rows[kt % 2], table, static_cast<int64_t>(kt) * NK, kv_len, bs, kvh, h);
  };
  auto copy_tile = [&](uint16_t* dst, float* sc, const void* pool, const float* pool_scale, int kt) {
    if constexpr (kFp8)
      load_kv_tile<HD, NK, kThreads, true>(dst, sc, pool, pool_scale, key_rows[kt % 2], SwChunk<NK>{});
    else
      copy_tile_bf16<NK>(dst, static_cast<const uint16_t*>(pool), key_rows[kt % 2]);
  };

  tile_rows(t_begin);
  __syncthreads();
  if (t_begin < t_end) copy_tile(k_tile, k_sc, a.kv.k, a.kv.k_scale, t_begin);
  cp_async_commit();
  for (int kt = t_begin; kt < t_end; ++kt) {
    const int64_t key0 = static_cast<int64_t>(kt) * NK;
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();  // K tile kt in place (and Q on the first pass); every warpgroup is done with V

    // S = Q Kᵀ for the warpgroup's 64 rows; V's copy is issued while it runs. (A warpgroup whose
    // rows see none of the tile's keys runs it too, fully masked: an exact no-op that keeps every
    // wgmma on a uniform path, which ptxas needs to leave them asynchronous.)
    float sacc[NK / 8][4];
#pragma unroll
    for (int j = 0; j < NK / 8; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.0f;
    wgmma_fence_operand(sacc);
    wgmma_fence();
    qk_wgmma<NK, kRows>(sacc, q_desc, k_desc);
    wgmma_commit();
    copy_tile(v_tile, v_sc, a.kv.v, a.kv.v_scale, kt);
    cp_async_commit();
    if (kt + 1 < t_end) tile_rows(kt + 1);
    wgmma_wait<0>();
    wgmma_fence_operand(sacc);
    softmax_tile<NK, HD / 8>(sacc, m, l, o, scale2, kFp8 ? k_sc : nullptr, key0, key0 + NK > wg_first, limit, lane);

    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();  // V tile kt in place; every warpgroup is done with K

    // O += P V, P rounded to bf16 (fp8: each probability times its row's V scale first); the next
    // K's copy is issued while it runs.
    uint32_t pa[NK / 16][4];
#pragma unroll
    for (int kk = 0; kk < NK / 16; ++kk) p_fragments_bf16<NK>(sacc, kFp8 ? v_sc : nullptr, kk, lane, pa[kk]);
    wgmma_fence_operand(o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < NK / 16; ++kk) wgmma_m64n256k16_rs_bf16_tn(o, pa[kk], v_desc + ((kk * 16 * 128) >> 4));
    wgmma_commit();
    if (kt + 1 < t_end) copy_tile(k_tile, k_sc, a.kv.k, a.kv.k_scale, kt + 1);
    cp_async_commit();
    wgmma_wait<0>();
    wgmma_fence_operand(o);
  }

  write_rows(a, o, m, l, w0, warp, g8, lane, rows, rb, G, h, part_o, part_ml);
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
int prefill_splits(int64_t ctas, int64_t max_len, int sms) {
  if (ctas >= sms) return 1;
  const double tiles = static_cast<double>((max_len + kKeys - 1) / kKeys);
  int best = 1;
  double best_t = tiles + 2.0;
  for (int n = 2; n <= kMaxSplits && n <= tiles; ++n) {
    const double waves = static_cast<double>((ctas * n + sms - 1) / sms);
    const double t = waves * (tiles / n + 2.0);
    if (t < best_t) best = n, best_t = t;
  }
  return best;
}

}  // namespace

bool attention_prefill_wgmma_available() {
  // The kernels need more than smem_budget()'s 200 KB: the device's opt-in limit itself (227 KB on
  // sm_90).
  static const bool ok = [] {
    if (!sm90a_kernel_runs(reinterpret_cast<const void*>(attention_prefill_wgmma_kernel<false>))) return false;
    int dev = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return kSmem + kStaticSmem <= optin;
  }();
  return ok;
}

namespace {
template <bool kFp8>
void launch(CudaBackend& be, const AttentionArgs& a) {
  static int64_t allowed = 0;
  auto kernel = attention_prefill_wgmma_kernel<kFp8>;
  allow_smem(kernel, kSmem, allowed);
  // Tiles of all spans: sum of ceil(n_s * G / 128) <= total_rows * G / 128 + spans.
  const int64_t work = (static_cast<int64_t>(a.L.total_rows) * a.group) / kRows + a.L.num_seqs;
  const int n_split = prefill_splits(work * a.kv.kvh, a.L.max_len, be.sm_count());
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
  fp8 ? launch<true>(be, a) : launch<false>(be, a);
}

}  // namespace sparkserve
