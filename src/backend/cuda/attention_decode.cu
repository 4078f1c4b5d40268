// Attention for decode steps (every span 1..kDecodeMaxTokens tokens: decode, speculative verify)
// over the paged KV pool, on tensor cores (mma.sync m16n8k16 bf16; precision in
// attention_common.cuh), split over the keys so that one sequence's long context keeps every SM
// busy.
//
// One block per (span, 16 query rows, kv head, key split). The rows are the span's (token, query
// head) pairs of the kv head (GQA: each K/V row is read once for all its query heads; 16 rows fit
// a group of 16, or 8 with padding). The block's HD/64 warps split the head dimension: each computes
// the scores' partial sums over its 64 dims, the partials are added in shared memory in a fixed
// order (every warp then holds the same scores and softmax), and each warp accumulates its 64 dims
// of P·V. K/V tiles of 32 keys stream through a cp.async pipeline three tiles deep where shared
// memory allows (two on sm_120); fp8 codes are widened to bf16 in shared memory first.
//
// Splits: a sequence of len positions is cut into chunks of decode_chunk(len) keys (at least
// kMinChunk, about len / n_want for n_want = the blocks the device holds at once over spans x kv
// heads). Each split
// writes its unnormalised output with its row max and sum, and attention_combine_kernel merges the
// splits in index order (deterministic). The chunking depends only on the span's length and on
// the batch's span count, never on the layout's host-side bounds, so a recorded decode step
// computes exactly what the same step run op by op computes. A span of one chunk is written
// directly.
#include "backend/cuda/attention_tile.cuh"
#include "backend/cuda/gemv_common.cuh"

namespace sparkserve {
namespace {

constexpr int kDcKeys = 32;                  // keys per tile
constexpr int kDcRows = 16;                  // query rows per block
constexpr int64_t kMinChunk = 128;           // keys per split at least (a multiple of kDcKeys)
constexpr int kMaxSplits = 256;

template <int HD>
__host__ __device__ constexpr int decode_warps() { return HD >= 128 ? HD / 64 : 1; }

__host__ __device__ inline int64_t decode_chunk(int64_t len, int n_want) {
  int64_t c = (len + n_want - 1) / n_want;
  c = c < kMinChunk ? kMinChunk : c;
  return (c + kDcKeys - 1) / kDcKeys * kDcKeys;
}

template <int HD, bool kFp8, int kStages>
constexpr int64_t decode_smem_bytes() {
  constexpr int64_t tile = int64_t{kDcKeys} * HD * 2;  // one bf16 K or V tile
  // Per stage K + V (fp8: codes and the rows' scales); fp8 tiles are widened into one bf16 K, V.
  constexpr int64_t stages = kFp8 ? kStages * (tile + 2 * kDcKeys * 4) : kStages * 2 * tile;
  constexpr int64_t widened = kFp8 ? 2 * tile : 0;
  constexpr int64_t partial = decode_warps<HD>() > 1 ? 2 * decode_warps<HD>() * kDcKeys * 4 * 4 * 4 : 0;
  return stages + widened + partial;
}

// Issues the copies of keys [key0, key0 + kDcKeys) (zeros from kend on) of kv head `head`: bf16
// rows straight into the swizzled tiles; fp8 codes row by row into the staging buffers, and the
// rows' scales after them (dst_sc: [K, V][kDcKeys] f32).
template <int HD, bool kFp8, int kThreads>
__device__ __forceinline__ void issue_tile(uint8_t* dst_k, uint8_t* dst_v, float* dst_sc, const KvView& kv,
                                           const DeviceLayout& L, int s, int64_t key0, int64_t kend, int64_t head) {
  constexpr int kBytes = kFp8 ? 1 : 2;
  constexpr int C = HD * kBytes / 16;  // 16-byte chunks per row
  for (int idx = threadIdx.x; idx < kDcKeys * C; idx += kThreads) {
    const int key = idx / C, c = idx % C;
    const int64_t j = key0 + key;
    const bool ok = j < kend;
    const int64_t src = (ok ? kv_row_index(L, s, j, kv.block_size, kv.kvh, head) * HD * kBytes : 0) + c * 16;
    const int64_t dst = kFp8 ? (key * C + c) * 16 : tile_chunk<HD>(key, c) * 16;
    cp_async16(dst_k + dst, static_cast<const uint8_t*>(kv.k) + src, ok ? 16 : 0);
    cp_async16(dst_v + dst, static_cast<const uint8_t*>(kv.v) + src, ok ? 16 : 0);
  }
  if constexpr (kFp8) {
    for (int key = threadIdx.x; key < kDcKeys; key += kThreads) {
      const int64_t j = key0 + key;
      const bool ok = j < kend;
      const int64_t row = ok ? kv_row_index(L, s, j, kv.block_size, kv.kvh, head) : 0;
      cp_async4(dst_sc + key, kv.k_scale + row, ok ? 4 : 0);
      cp_async4(dst_sc + kDcKeys + key, kv.v_scale + row, ok ? 4 : 0);
    }
  }
}

template <int N>
__device__ __forceinline__ void cp_async_wait_pending() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <int HD, bool kFp8, int kStages>
__global__ void __launch_bounds__(decode_warps<HD>() * 32) attention_decode_kernel(AttentionArgs a, int row_tiles,
                                                                                   int n_want, float* part_o,
                                                                                   float* part_ml) {
  constexpr int W = decode_warps<HD>(), kThreads = W * 32, DW = HD / W;
  constexpr int64_t kTile = int64_t{kDcKeys} * HD * 2;
  extern __shared__ __align__(16) uint8_t smem[];
  const DeviceLayout& L = a.L;
  const int G = a.group, h = blockIdx.y, split = blockIdx.z;
  const int s = blockIdx.x / row_tiles, rt = blockIdx.x % row_tiles;
  if (s >= L.num_seqs) return;
  const int rows = L.num_tokens(s) * G, i0 = rt * kDcRows;
  if (i0 >= rows) return;
  const int64_t start = L.start_pos(s), rb = L.row_begin(s), span_len = start + L.num_tokens(s);
  const int64_t chunk = decode_chunk(span_len, n_want);
  const int active = static_cast<int>((span_len + chunk - 1) / chunk);
  if (split >= active) return;
  const int i_last = min(i0 + kDcRows, rows) - 1;
  const int64_t kv_len = start + i_last / G + 1;
  const int64_t kbeg = split * chunk, kend = min(kbeg + chunk, kv_len);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g8 = lane / 4, q4 = lane % 4;
  int64_t limit[2];  // keys visible to the thread's rows g8 and g8 + 8
  int64_t q_off[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = min(i0 + g8 + 8 * r, rows - 1);  // rows past the span repeat its last row; never stored
    limit[r] = start + i / G + 1;
    q_off[r] = ((rb + i / G) * a.nh + h * G + i % G) * HD;
  }
  uint32_t qh[DW / 16][4], ql[DW / 16][4];
  load_q_fragments<DW>(qh, ql, a.q, q_off, warp * DW, lane);

  // [kStages] x (K, V tiles | fp8: K, V codes then K, V row scales), then the widened fp8 K, V
  // tiles, then the score partials.
  constexpr int64_t kCodes = kFp8 ? kTile / 2 : kTile;  // one K or V tile as stored
  constexpr int64_t kStage = 2 * kCodes + (kFp8 ? 2 * kDcKeys * 4 : 0);
  uint8_t* stage = smem;
  uint16_t* wide = reinterpret_cast<uint16_t*>(smem + kStages * kStage);
  float* sbuf = reinterpret_cast<float*>(smem + kStages * kStage + (kFp8 ? 2 * kTile : 0));
  auto stage_scales = [&](uint8_t* st) { return reinterpret_cast<float*>(st + 2 * kCodes); };

  float o[DW / 8][4];
#pragma unroll
  for (int nt = 0; nt < DW / 8; ++nt) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  const float scale2 = a.scale * kLog2e;

  const int n_tiles = kend > kbeg ? static_cast<int>((kend - kbeg + kDcKeys - 1) / kDcKeys) : 0;
  // kStages - 1 tiles in flight ahead of the one being used (one commit group per tile, empty past
  // the end, so the wait count stays fixed).
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < n_tiles) {
      uint8_t* st = stage + t * kStage;
      issue_tile<HD, kFp8, kThreads>(st, st + kCodes, stage_scales(st), a.kv, L, s, kbeg + t * kDcKeys, kend, h);
    }
    cp_async_commit();
  }
  for (int it = 0; it < n_tiles; ++it) {
    const int64_t key0 = kbeg + static_cast<int64_t>(it) * kDcKeys;
    uint8_t* cur = stage + (it % kStages) * kStage;
    cp_async_wait_pending<kStages - 2>();
    __syncthreads();  // tile it landed; every warp is done with tile it - 1
    const uint16_t* k_tile = reinterpret_cast<const uint16_t*>(cur);
    const uint16_t* v_tile = reinterpret_cast<const uint16_t*>(cur + kCodes);
    const float* k_sc = stage_scales(cur);
    const float* v_sc = k_sc + kDcKeys;
    if constexpr (kFp8) {
      constexpr int C16 = HD / 16;
      for (int idx = threadIdx.x; idx < kDcKeys * C16; idx += kThreads) {
        const int key = idx / C16, c = idx % C16;
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          const uint4 raw = *reinterpret_cast<const uint4*>(cur + t * kCodes + idx * 16);
          uint16_t* dst = wide + t * kDcKeys * HD;
          e4m3x8_to_bf16(raw.x, raw.y, *reinterpret_cast<uint32_t(*)[4]>(dst + tile_chunk<HD>(key, 2 * c) * 8));
          e4m3x8_to_bf16(raw.z, raw.w, *reinterpret_cast<uint32_t(*)[4]>(dst + tile_chunk<HD>(key, 2 * c + 1) * 8));
        }
      }
      __syncthreads();  // widened tile complete
      k_tile = wide;
      v_tile = wide + kDcKeys * HD;
    }
    if (it + kStages - 1 < n_tiles) {
      uint8_t* nxt = stage + ((it + kStages - 1) % kStages) * kStage;
      issue_tile<HD, kFp8, kThreads>(nxt, nxt + kCodes, stage_scales(nxt), a.kv, L, s, key0 + (kStages - 1) * kDcKeys,
                                     kend, h);
    }
    cp_async_commit();

    // The warp's share of S = Q Kᵀ (its DW dims); the warps' shares added in warp order.
    float sacc[kDcKeys / 8][4];
    qk_tile<HD, DW, kDcKeys>(sacc, qh, ql, k_tile, warp * DW, lane);
    if constexpr (W > 1)
      sum_score_partials<W, kDcKeys>(sacc, reinterpret_cast<float4*>(sbuf) + (it % 2) * W * (kDcKeys / 8) * 32, warp,
                                     lane);
    softmax_tile<kDcKeys, DW / 8>(sacc, m, l, o, scale2, kFp8 ? k_sc : nullptr, key0, true, limit, lane);
    pv_tile<HD, DW, kDcKeys>(o, sacc, v_tile, kFp8 ? v_sc : nullptr, warp * DW, lane);
  }

  finish_row_sums(l);
  const int64_t pu = (static_cast<int64_t>(blockIdx.x) * gridDim.y + h) * gridDim.z + split;  // partial slot
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int ri = g8 + 8 * r;
    if (i0 + ri >= rows) continue;
    if (active == 1) {
      store_row<DW>(a, o, r, l[r], q_off[r], warp * DW, lane);
      continue;
    }
#pragma unroll
    for (int nt = 0; nt < DW / 8; ++nt)
      *reinterpret_cast<float2*>(part_o + (pu * kDcRows + ri) * HD + warp * DW + nt * 8 + q4 * 2) =
          make_float2(o[nt][2 * r], o[nt][2 * r + 1]);
    if (warp == 0 && q4 == 0) *reinterpret_cast<float2*>(part_ml + (pu * kDcRows + ri) * 2) = make_float2(m[r], l[r]);
  }
}

// One block per (span, row tile, kv head, row) merges the row's splits: weights exp2(m_c - M), the
// sum L by a fixed-shape tree, and O = sum_c O_c w_c / L, the splits dealt to kGroups thread groups
// by index (c = g, g + kGroups, ...) and the groups' sums added in group order: every sum has a
// fixed order, so the result does not depend on scheduling.
constexpr int kCombineThreads = 256;

template <int HD>
__global__ void __launch_bounds__(kCombineThreads) attention_combine_kernel(AttentionArgs a, int row_tiles, int n_want,
                                                                            int n_grid, const float* part_o,
                                                                            const float* part_ml) {
  constexpr int kGroupThreads = HD / 4;  // a float4 of dims each
  constexpr int kGroups = kCombineThreads / kGroupThreads;
  __shared__ float wt[kMaxSplits], red[kCombineThreads];
  __shared__ __align__(16) float sums[kGroups][HD];
  const DeviceLayout& L = a.L;
  const int G = a.group, h = blockIdx.y, ri = blockIdx.z, t = threadIdx.x;
  const int s = blockIdx.x / row_tiles, rt = blockIdx.x % row_tiles;
  if (s >= L.num_seqs) return;
  const int rows = L.num_tokens(s) * G, i = rt * kDcRows + ri;
  if (i >= rows) return;
  const int64_t span_len = L.start_pos(s) + L.num_tokens(s);
  const int64_t chunk = decode_chunk(span_len, n_want);
  const int active = static_cast<int>((span_len + chunk - 1) / chunk);
  if (active == 1) return;  // written by the split itself
  const int64_t base = (static_cast<int64_t>(blockIdx.x) * gridDim.y + h) * n_grid;
  auto slot = [&](int c) { return (base + c) * kDcRows + ri; };
  const float mc = t < active ? part_ml[slot(t) * 2] : -INFINITY;
  red[t] = mc;
  __syncthreads();
  for (int w = kCombineThreads / 2; w > 0; w >>= 1) {
    if (t < w) red[t] = fmaxf(red[t], red[t + w]);
    __syncthreads();
  }
  const float M = red[0];
  __syncthreads();
  const float w_c = t < active && mc != -INFINITY ? exp2f(mc - M) : 0.0f;
  if (t < active) wt[t] = w_c;
  red[t] = t < active ? part_ml[slot(t) * 2 + 1] * w_c : 0.0f;
  __syncthreads();
  for (int w = kCombineThreads / 2; w > 0; w >>= 1) {
    if (t < w) red[t] += red[t + w];
    __syncthreads();
  }
  const float Lsum = red[0];
  const int g = t / kGroupThreads, d = (t % kGroupThreads) * 4;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 4
  for (int c = g; c < active; c += kGroups) {
    const float4 o = *reinterpret_cast<const float4*>(part_o + slot(c) * HD + d);
    const float w = wt[c];
    acc.x += o.x * w;
    acc.y += o.y * w;
    acc.z += o.z * w;
    acc.w += o.w * w;
  }
  *reinterpret_cast<float4*>(&sums[g][d]) = acc;
  __syncthreads();
  const int64_t off = ((L.row_begin(s) + i / G) * a.nh + h * G + i % G) * HD;
  for (int dd = t; dd < HD; dd += kCombineThreads) {
    float y = 0.0f;
    for (int gg = 0; gg < kGroups; ++gg) y += sums[gg][dd];
    y /= Lsum;
    if (a.gate) y *= sigmoid_f(a.gate[off + dd]);
    a.out[off + dd] = y;
  }
}

template <int HD, bool kFp8, int kStages>
void launch_stages(CudaBackend& be, const AttentionArgs& a) {
  static int64_t allowed = 0;
  constexpr int64_t bytes = decode_smem_bytes<HD, kFp8, kStages>();
  auto kernel = attention_decode_kernel<HD, kFp8, kStages>;
  allow_smem(kernel, bytes, allowed);
  const DeviceLayout& L = a.L;
  const int kvh = static_cast<int>(a.kv.kvh);
  const int row_tiles = (L.max_tokens * a.group + kDcRows - 1) / kDcRows;
  // Splits wanted: as many blocks as the device holds at once (one wave), over the batch's spans and
  // kv heads; fixed per batch shape. The grid needs no more than the longest possible span can use.
  static const int slots = [&] {
    int per_sm = 0;
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, decode_warps<HD>() * 32, bytes));
    return std::max(1, per_sm) * be.sm_count();
  }();
  const int n_want = std::clamp(slots / (L.num_seqs * kvh), 1, kMaxSplits);
  const int64_t most = (static_cast<int64_t>(L.max_len) + kMinChunk - 1) / kMinChunk;
  const int n_grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(n_want, most)));
  const dim3 grid(static_cast<unsigned>(L.num_seqs * row_tiles), static_cast<unsigned>(kvh),
                  static_cast<unsigned>(n_grid));
  if (n_grid == 1) {
    kernel<<<grid, decode_warps<HD>() * 32, bytes, be.stream()>>>(a, row_tiles, n_want, nullptr, nullptr);
    CUDA_CHECK_LAUNCH();
    return;
  }
  const size_t part_rows = static_cast<size_t>(grid.x) * grid.y * n_grid * kDcRows;
  CudaBackend::Scratch part(&be, part_rows * (HD + 2) * sizeof(float));
  float* part_o = part.as<float>();
  float* part_ml = part_o + part_rows * HD;
  kernel<<<grid, decode_warps<HD>() * 32, bytes, be.stream()>>>(a, row_tiles, n_want, part_o, part_ml);
  CUDA_CHECK_LAUNCH();
  const dim3 cgrid(grid.x, grid.y, kDcRows);
  attention_combine_kernel<HD><<<cgrid, kCombineThreads, 0, be.stream()>>>(a, row_tiles, n_want, n_grid, part_o, part_ml);
  CUDA_CHECK_LAUNCH();
}

// Three tiles in flight where shared memory allows (sm_90 / sm_100), two otherwise (sm_120).
template <int HD, bool kFp8>
void launch(CudaBackend& be, const AttentionArgs& a) {
  if (decode_smem_bytes<HD, kFp8, 3>() <= smem_budget()) {
    launch_stages<HD, kFp8, 3>(be, a);
  } else {
    launch_stages<HD, kFp8, 2>(be, a);
  }
}

}  // namespace

void launch_attention_decode(CudaBackend& be, const AttentionArgs& a, bool fp8) {
  with_head_dim(a.kv.hd, fp8, [&](auto hd, auto is_fp8) { launch<decltype(hd)::value, decltype(is_fp8)::value>(be, a); });
}

}  // namespace sparkserve
