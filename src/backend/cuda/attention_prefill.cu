// Flash attention for prefill (spans of many tokens) over the paged KV pool, on tensor cores
// (mma.sync m16n8k16 bf16; precision in attention_common.cuh). This kernel serves every target;
// on sm_90a at head_dim 256 (the Qwen3.5 models) attention_prefill_wgmma.cu's warpgroup-MMA
// kernel takes the work instead (prefill_takes_wgmma).
//
// One block of 4 warps per (64 query rows of one span, kv head). The rows are the span's (token,
// query head) pairs with the group's query heads of a token side by side (GQA packing: each K/V
// tile is loaded once for every query head of its kv head), 16 rows per warp. Keys stream through
// shared memory in tiles of 32 (V's load overlaps Q·Kᵀ, the next K's load overlaps P·V), so memory
// is O(tile) whatever the length. Causal with the span's prefix offset: the row of token t sees
// positions [0, start_pos + t]. Online softmax in f32 (exp2 with the scale folded in); the sigmoid
// output gate is applied as the output is written, as sigmoid_mul would apply it to the stored value.
// Shared memory: (2·64 + 2·32) rows of HD bf16 = 96 KB at HD 256 (fits sm_120's 99 KB).
#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/gemv_common.cuh"

namespace sparkserve {
namespace {

constexpr int kPfWarps = 4, kPfThreads = kPfWarps * 32;
constexpr int kPfRows = 16 * kPfWarps;  // query rows per block
constexpr int kPfKeys = 32;             // keys per tile

template <int HD>
constexpr int64_t prefill_smem_bytes() {
  return (2 * kPfRows + 2 * kPfKeys) * HD * 2 + 2 * kPfKeys * 4;  // Q hi/lo, K, V (bf16); fp8 row scales
}

template <int HD>
struct PfChunk {
  __device__ int operator()(int row, int chunk) const { return tile_chunk<HD>(row, chunk); }
};

template <int HD, bool kFp8>
__device__ __forceinline__ void load_pf_tile(uint16_t* tile, float* scales, const void* pool, const float* pool_scale,
                                             const int64_t* rows) {
  load_kv_tile<HD, kPfKeys, kPfThreads, kFp8>(tile, scales, pool, pool_scale, rows, PfChunk<HD>{});
}

template <int HD, bool kFp8>
__global__ void __launch_bounds__(kPfThreads) attention_prefill_kernel(AttentionArgs a) {
  extern __shared__ __align__(16) uint8_t smem[];
  uint16_t* q_hi = reinterpret_cast<uint16_t*>(smem);
  uint16_t* q_lo = q_hi + kPfRows * HD;
  uint16_t* k_tile = q_lo + kPfRows * HD;
  uint16_t* v_tile = k_tile + kPfKeys * HD;
  float* k_sc = reinterpret_cast<float*>(v_tile + kPfKeys * HD);
  float* v_sc = k_sc + kPfKeys;

  const DeviceLayout& L = a.L;
  const int G = a.group, h = blockIdx.y;
  // Work item -> (span, tile); within a span the last tiles (which see the most keys) go first.
  int w = blockIdx.x, s = 0, tiles = 0;
  for (; s < L.num_seqs; ++s) {
    tiles = (L.num_tokens(s) * G + kPfRows - 1) / kPfRows;
    if (w < tiles) break;
    w -= tiles;
  }
  if (s >= L.num_seqs) return;
  const int tile = tiles - 1 - w;
  const int rows = L.num_tokens(s) * G;  // the span's (token, query head) rows of this kv head
  const int64_t start = L.start_pos(s), rb = L.row_begin(s);
  const int i0 = tile * kPfRows, i_last = min(i0 + kPfRows, rows) - 1;
  const int64_t kv_len = start + i_last / G + 1;     // keys the tile's last row sees
  const int64_t first_limit = start + i0 / G + 1;    // keys its first row sees
  const int64_t bs = a.kv.block_size, kvh = a.kv.kvh;
  const int32_t* table = L.table(s);

  // Q rows split into bf16 hi / lo (rows past the span repeat its last row; never stored).
  load_q_split<HD, kPfRows, kPfThreads>(q_hi, q_lo, a, rb, h, i0, rows, PfChunk<HD>{});

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g8 = lane / 4;
  int64_t limit[2];  // keys visible to the thread's two rows (warp*16 + g8, + 8)
#pragma unroll
  for (int e = 0; e < 2; ++e) limit[e] = start + min(i0 + warp * 16 + g8 + 8 * e, rows - 1) / G + 1;
  float o[HD / 8][4];
#pragma unroll
  for (int nt = 0; nt < HD / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float scale2 = a.scale * kLog2e;

  const int n_tiles = static_cast<int>((kv_len + kPfKeys - 1) / kPfKeys);
  // Pool rows of tile kt's keys in key_rows[kt % 2]; tile kt + 1's are looked up between the two
  // barriers of tile kt.
  __shared__ int64_t key_rows[2][kPfKeys];
  kv_tile_rows<kPfKeys>(key_rows[0], table, 0, kv_len, bs, kvh, h);
  __syncthreads();
  load_pf_tile<HD, kFp8>(k_tile, k_sc, a.kv.k, a.kv.k_scale, key_rows[0]);
  cp_async_commit();
  for (int kt = 0; kt < n_tiles; ++kt) {
    const int64_t key0 = static_cast<int64_t>(kt) * kPfKeys;
    cp_async_wait_all();
    __syncthreads();  // K tile kt in place (and Q on the first pass); every warp is done with V
    load_pf_tile<HD, kFp8>(v_tile, v_sc, a.kv.v, a.kv.v_scale, key_rows[kt % 2]);
    cp_async_commit();

    // S = Q Kᵀ for the warp's 16 rows, Q as hi + lo.
    float sacc[kPfKeys / 8][4];
#pragma unroll
    for (int j = 0; j < kPfKeys / 8; ++j) sacc[j][0] = sacc[j][1] = sacc[j][2] = sacc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      uint32_t ah[4], al[4];
      ldmatrix_x4(ah, smem_addr(q_hi + tile_chunk<HD>(warp * 16 + lane % 16, kk * 2 + lane / 16) * 8));
      ldmatrix_x4(al, smem_addr(q_lo + tile_chunk<HD>(warp * 16 + lane % 16, kk * 2 + lane / 16) * 8));
#pragma unroll
      for (int np = 0; np < kPfKeys / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, smem_addr(k_tile + tile_chunk<HD>(np * 16 + (lane / 16) * 8 + lane % 8, kk * 2 + (lane / 8) % 2) * 8));
        mma_bf16_16816(sacc[2 * np], al, b[0], b[1]);
        mma_bf16_16816(sacc[2 * np], ah, b[0], b[1]);
        mma_bf16_16816(sacc[2 * np + 1], al, b[2], b[3]);
        mma_bf16_16816(sacc[2 * np + 1], ah, b[2], b[3]);
      }
    }

    softmax_tile<kPfKeys, HD / 8>(sacc, m, l, o, scale2, kFp8 ? k_sc : nullptr, key0, key0 + kPfKeys > first_limit,
                                  limit, lane);

    if (kt + 1 < n_tiles) kv_tile_rows<kPfKeys>(key_rows[(kt + 1) % 2], table, key0 + kPfKeys, kv_len, bs, kvh, h);
    cp_async_wait_all();
    __syncthreads();  // V tile kt in place; every warp is done with K
    if (kt + 1 < n_tiles) load_pf_tile<HD, kFp8>(k_tile, k_sc, a.kv.k, a.kv.k_scale, key_rows[(kt + 1) % 2]);
    cp_async_commit();

    // O += P V, P as hi + lo (fp8: each probability times its row's V scale).
    pv_tile<HD, HD, kPfKeys>(o, sacc, v_tile, kFp8 ? v_sc : nullptr, 0, lane);
  }

  finish_row_sums(l);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = i0 + warp * 16 + g8 + 8 * r;
    if (i < rows) store_row<HD>(a, o, r, l[r], ((rb + i / G) * a.nh + h * G + i % G) * HD, 0, lane);
  }
}

template <int HD, bool kFp8>
void launch(CudaBackend& be, const AttentionArgs& a) {
  static int64_t allowed = 0;
  constexpr int64_t bytes = prefill_smem_bytes<HD>();
  auto kernel = attention_prefill_kernel<HD, kFp8>;
  allow_smem(kernel, bytes, allowed);
  // Tiles of all spans: sum of ceil(n_s * G / 64) <= total_rows * G / 64 + spans.
  const int64_t work = (static_cast<int64_t>(a.L.total_rows) * a.group) / kPfRows + a.L.num_seqs;
  const dim3 grid(static_cast<unsigned>(work), static_cast<unsigned>(a.kv.kvh));
  kernel<<<grid, kPfThreads, bytes, be.stream()>>>(a);
  CUDA_CHECK_LAUNCH();
}

// -1: the kernel prefill_takes_wgmma picks; 0 / 1: the mma.sync / wgmma kernel (gpu_ops' A/B runs).
int g_prefill_forced = -1;

// The prefill kernel of a head dim: the wgmma kernel where it runs (sm_90a build on compute 9.0,
// head_dim 256), else the mma.sync kernel.
bool prefill_takes_wgmma(int64_t hd) {
  if (g_prefill_forced >= 0) return g_prefill_forced == 1 && hd == 256;
  return hd == 256 && attention_prefill_wgmma_available();
}

}  // namespace

// gpu_ops' hook (declared in tests/gpu/attention_kv_checks.cpp and attention_bench.cpp, built by the
// host compiler): the prefill kernel forced for the next calls (0 mma.sync, 1 wgmma, -1 automatic);
// false when the forced kernel cannot run here (then nothing changes).
bool attention_prefill_force(int kernel) {
  if (kernel == 1 && !attention_prefill_wgmma_available()) return false;
  g_prefill_forced = kernel;
  return true;
}

void launch_attention_prefill(CudaBackend& be, const AttentionArgs& a, bool fp8) {
  if (prefill_takes_wgmma(a.kv.hd)) return launch_attention_prefill_wgmma(be, a, fp8);
  CHECK_MSG(smem_budget() >= prefill_smem_bytes<256>(), "CUDA attention: the device's shared memory is too small");
  with_head_dim(a.kv.hd, fp8, [&](auto hd, auto is_fp8) { launch<decltype(hd)::value, decltype(is_fp8)::value>(be, a); });
}

}  // namespace sparkserve
