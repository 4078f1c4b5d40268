// attention_segments on tensor cores: the vision tower's bidirectional attention within each image
// (frame), flash style (mma.sync m16n8k16 bf16, f32 accumulators, online softmax in f32).
//
// Precision: Q, K, V and the probabilities are f32 values split into bf16 hi + lo
// (mma_primitives.cuh), and each product is taken as hi·hi + hi·lo + lo·hi: scores and outputs are
// within ~1e-6 relative of f32 arithmetic (gpu_ops "vision" attention checks, bound 1e-4 as for
// every reordered f32 reduction), where plain bf16 operands would be off by ~1e-3. It costs three
// MMAs per product; the tower's attention is ~2.1 TFLOP for one 1024x1024 image on the 122B shapes
// (6.3 TFLOP of MMAs with the splits).
//
// Two launches: a pre-pass splits Q, K and V once into bf16 hi / lo arrays laid out [head, row,
// HDP] (HDP: the head size rounded up to the instantiated width, a multiple of 8, zero padded), so
// that key tiles are contiguous 16-byte copies; then one block of 4 warps per (64 query rows of one
// segment, head), 16 rows per warp, streams the segment's keys through shared memory in tiles of
// 32, two stages deep (the next tile's copy overlaps this tile's MMAs). A width that is an odd
// number of 8s (the tower's 72) takes its last 8 head dims as an m16n8k8 step in Q Kᵀ and one
// output n-tile in P V, rather than padding to 80 (10% more MMAs). Shared rows are an odd number
// of 16-byte units long (padded by 8 bf16 where needed) so the 8 rows one ldmatrix reads fall in
// distinct banks.
#include <cmath>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/mma_primitives.cuh"

namespace sparkserve {
namespace {

constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kRows = 16 * kWarps;  // query rows per block
constexpr int kKeys = 32;           // keys per tile
constexpr float kLog2e = 1.4426950408889634f;

template <int HDP>
constexpr int kStride = (HDP / 8) % 2 == 0 ? HDP + 8 : HDP;  // bf16 per shared row

template <int HDP>
constexpr int smem_bytes() {
  return 2 /*stages*/ * 4 /*kh kl vh vl*/ * kKeys * kStride<HDP> * 2;
}

// x: [N, H, hd] f32 -> hi, lo: [H, N, HDP] bf16 (dims >= hd zero). One thread per pair of dims.
__global__ void split_rows_kernel(const float* x, uint32_t* hi, uint32_t* lo, int64_t N, int64_t H, int64_t hd,
                                  int64_t HDP) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t pairs = HDP / 2;
  if (i >= H * N * pairs) return;
  const int64_t c = i % pairs, n = (i / pairs) % N, h = i / (pairs * N);
  const int64_t d = 2 * c;
  const float* src = x + (n * H + h) * hd;
  const float x0 = d < hd ? src[d] : 0.0f, x1 = d + 1 < hd ? src[d + 1] : 0.0f;
  split_pack(x0, x1, hi[i], lo[i]);
}

struct SplitQkv {
  const uint16_t *qh, *ql, *kh, *kl, *vh, *vl;  // [H, N, HDP]
};

// Tile `tile` (tiles of segment rows [b, b + L)) of kh, kl, vh, vl into one stage: keys past L read
// as zeros.
template <int HDP>
__device__ __forceinline__ void load_kv_tile(uint16_t* stage, const SplitQkv& s, int64_t head_off, int64_t b,
                                             int64_t L, int64_t key0) {
  constexpr int C = HDP / 8;  // 16-byte chunks per row
  const uint16_t* src[4] = {s.kh, s.kl, s.vh, s.vl};
#pragma unroll
  for (int a = 0; a < 4; ++a) {
    uint16_t* dst = stage + a * kKeys * kStride<HDP>;
    for (int idx = threadIdx.x; idx < kKeys * C; idx += kThreads) {
      const int key = idx / C, c = idx % C;
      const bool ok = key0 + key < L;
      const uint16_t* g = src[a] + head_off + (ok ? (b + key0 + key) * HDP + c * 8 : 0);
      cp_async16(dst + key * kStride<HDP> + c * 8, g, ok ? 16 : 0);
    }
  }
}

// mma of split operands: d += ah·bh + ah·bl + al·bh (small terms first).
__device__ __forceinline__ void mma3(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                     const uint32_t (&bh)[2], const uint32_t (&bl)[2]) {
  mma_bf16_16816(d, al, bh[0], bh[1]);
  mma_bf16_16816(d, ah, bl[0], bl[1]);
  mma_bf16_16816(d, ah, bh[0], bh[1]);
}

// The same with an m16n8k8 step (the last 8 head dims of a width that is an odd number of 8s).
__device__ __forceinline__ void mma3_k8(float (&d)[4], const uint32_t (&ah)[2], const uint32_t (&al)[2], uint32_t bh,
                                        uint32_t bl) {
  mma_bf16_1688(d, al, bh);
  mma_bf16_1688(d, ah, bl);
  mma_bf16_1688(d, ah, bh);
}

// tiles: per block x, (segment begin, segment length, first query row in the segment).
// Up to HDP 80, four blocks per SM (<= 128 registers a thread): 16 warps to hide the MMA latency, and
// the tower's 1024 blocks (64 row tiles x 16 heads) fill 132 SMs in two full waves (at three per SM:
// 2.6 waves).
template <int HDP>
__global__ void __launch_bounds__(kThreads, HDP <= 80 ? 4 : 1) attention_segments_tc_kernel(float* out, SplitQkv s, const int4* tiles,
                                                                          int64_t N, int64_t H, int64_t hd,
                                                                          float scale2) {
  extern __shared__ __align__(16) uint16_t smem[];
  constexpr int KS = HDP / 16;             // k16 steps over the head dims
  constexpr bool kTail = HDP % 16 != 0;    // then one k8 step
  constexpr int NO = HDP / 8;              // output n-tiles
  constexpr int NS = kKeys / 8;            // score n-tiles per key tile
  static_assert(HDP % 8 == 0 && NS == 4, "one ldmatrix_x4 covers the k8 step of a key tile");
  const int4 t = tiles[blockIdx.x];
  const int64_t b = t.x, L = t.y, h = blockIdx.y;
  const int64_t head_off = h * N * HDP;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
  const int64_t row[2] = {t.z + warp * 16 + g, t.z + warp * 16 + g + 8};  // in the segment

  // This thread's Q A-fragments, hi and lo, for every k-step.
  uint32_t qh[KS][4], ql[KS][4];
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      const int64_t r = row[f % 2];
      const int64_t off = head_off + (b + r) * HDP + kk * 16 + (f / 2) * 8 + 2 * t4;
      const bool ok = r < L;
      qh[kk][f] = ok ? *reinterpret_cast<const uint32_t*>(s.qh + off) : 0u;
      ql[kk][f] = ok ? *reinterpret_cast<const uint32_t*>(s.ql + off) : 0u;
    }
  uint32_t qth[2] = {0u, 0u}, qtl[2] = {0u, 0u};  // the k8 step's A fragments (rows g, g + 8)
  if constexpr (kTail)
#pragma unroll
    for (int f = 0; f < 2; ++f) {
      const int64_t off = head_off + (b + row[f]) * HDP + KS * 16 + 2 * t4;
      if (row[f] < L) {
        qth[f] = *reinterpret_cast<const uint32_t*>(s.qh + off);
        qtl[f] = *reinterpret_cast<const uint32_t*>(s.ql + off);
      }
    }

  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

  constexpr int kStage = 4 * kKeys * kStride<HDP>;
  const int64_t n_tiles = (L + kKeys - 1) / kKeys;
  load_kv_tile<HDP>(smem, s, head_off, b, L, 0);
  cp_async_commit();
  for (int64_t it = 0; it < n_tiles; ++it) {
    uint16_t* cur = smem + (it % 2) * kStage;
    if (it + 1 < n_tiles) load_kv_tile<HDP>(smem + ((it + 1) % 2) * kStage, s, head_off, b, L, (it + 1) * kKeys);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint16_t* kh = cur;
    const uint16_t* kl = kh + kKeys * kStride<HDP>;
    const uint16_t* vh = kl + kKeys * kStride<HDP>;
    const uint16_t* vl = vh + kKeys * kStride<HDP>;

    // S = Q Kᵀ over this tile's keys.
    float sc[NS][4];
#pragma unroll
    for (int j = 0; j < NS; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk)
#pragma unroll
      for (int np = 0; np < NS / 2; ++np) {
        const int key = np * 16 + (lane / 16) * 8 + lane % 8;
        const int col = kk * 16 + ((lane / 8) % 2) * 8;
        uint32_t bh[4], bl[4];
        ldmatrix_x4(bh, smem_addr(kh + key * kStride<HDP> + col));
        ldmatrix_x4(bl, smem_addr(kl + key * kStride<HDP> + col));
        mma3(sc[2 * np], qh[kk], ql[kk], {bh[0], bh[1]}, {bl[0], bl[1]});
        mma3(sc[2 * np + 1], qh[kk], ql[kk], {bh[2], bh[3]}, {bl[2], bl[3]});
      }
    if constexpr (kTail) {  // lanes 8j..8j+7 address n-tile j's 8 keys: one B register per n-tile
      uint32_t bh[4], bl[4];
      ldmatrix_x4(bh, smem_addr(kh + lane * kStride<HDP> + KS * 16));
      ldmatrix_x4(bl, smem_addr(kl + lane * kStride<HDP> + KS * 16));
#pragma unroll
      for (int j = 0; j < NS; ++j) mma3_k8(sc[j], qth, qtl, bh[j], bl[j]);
    }

    // Online softmax (base 2, scale folded in); keys past the segment get no probability.
    const int64_t key0 = it * kKeys;
    const bool full = key0 + kKeys <= L;
    float tmax[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t key = key0 + j * 8 + 2 * t4 + (e & 1);
        const float v = full || key < L ? sc[j][e] * scale2 : -INFINITY;
        sc[j][e] = v;
        tmax[e >> 1] = fmaxf(tmax[e >> 1], v);
      }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 1));
      tmax[r] = fmaxf(tmax[r], __shfl_xor_sync(0xffffffffu, tmax[r], 2));
      const float m_new = fmaxf(m[r], tmax[r]);  // finite: every tile has at least one key < L
      const float corr = exp2f(m[r] - m_new);
      m[r] = m_new;
      l[r] *= corr;
#pragma unroll
      for (int n = 0; n < NO; ++n) {
        o[n][2 * r] *= corr;
        o[n][2 * r + 1] *= corr;
      }
    }
#pragma unroll
    for (int j = 0; j < NS; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float p = exp2f(sc[j][e] - m[e >> 1]);
        l[e >> 1] += p;
        sc[j][e] = p;
      }

    // O += P V: the score accumulators of two n-tiles form one A fragment (16 keys).
#pragma unroll
    for (int kk = 0; kk < NS / 2; ++kk) {
      uint32_t ph[4], pl[4];
      split_pack(sc[2 * kk][0], sc[2 * kk][1], ph[0], pl[0]);
      split_pack(sc[2 * kk][2], sc[2 * kk][3], ph[1], pl[1]);
      split_pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1], ph[2], pl[2]);
      split_pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3], ph[3], pl[3]);
#pragma unroll
      for (int dp = 0; dp < NO / 2; ++dp) {
        const int key = kk * 16 + ((lane / 8) % 2) * 8 + lane % 8;
        const int col = dp * 16 + (lane / 16) * 8;
        uint32_t bh[4], bl[4];
        ldmatrix_x4_trans(bh, smem_addr(vh + key * kStride<HDP> + col));
        ldmatrix_x4_trans(bl, smem_addr(vl + key * kStride<HDP> + col));
        mma3(o[2 * dp], ph, pl, {bh[0], bh[1]}, {bl[0], bl[1]});
        mma3(o[2 * dp + 1], ph, pl, {bh[2], bh[3]}, {bl[2], bl[3]});
      }
      if constexpr (NO % 2 != 0) {  // the last n-tile alone (lanes 16-31 repeat lanes 0-15's rows)
        const int key = kk * 16 + ((lane / 8) % 2) * 8 + lane % 8;
        uint32_t bh[4], bl[4];
        ldmatrix_x4_trans(bh, smem_addr(vh + key * kStride<HDP> + (NO - 1) * 8));
        ldmatrix_x4_trans(bl, smem_addr(vl + key * kStride<HDP> + (NO - 1) * 8));
        mma3(o[NO - 1], ph, pl, {bh[0], bh[1]}, {bl[0], bl[1]});
      }
    }
    __syncthreads();  // everyone is done with `cur` before the next iteration refills it
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (row[r] >= L) continue;
    float* dst = out + ((b + row[r]) * H + h) * hd;
#pragma unroll
    for (int n = 0; n < NO; ++n) {
      const int64_t d = n * 8 + 2 * t4;
      if (d < hd) dst[d] = o[n][2 * r] / l[r];
      if (d + 1 < hd) dst[d + 1] = o[n][2 * r + 1] / l[r];
    }
  }
}

template <int HDP>
void launch(cudaStream_t stream, float* out, const SplitQkv& s, const int4* tiles, int64_t n_tiles, int64_t N,
            int64_t H, int64_t hd, float scale2) {
  constexpr int bytes = smem_bytes<HDP>();
  if constexpr (bytes > 48 * 1024) {
    static const bool set = [] {
      CUDA_CHECK(cudaFuncSetAttribute(attention_segments_tc_kernel<HDP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      bytes));
      return true;
    }();
    (void)set;
  }
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(H));
  attention_segments_tc_kernel<HDP><<<grid, kThreads, bytes, stream>>>(out, s, tiles, N, H, hd, scale2);
  CUDA_CHECK_LAUNCH();
}

// The instantiated tile widths; a head size is padded up to the next one.
int padded_head_dim(int64_t hd) {
  for (int w : {16, 32, 64, 72, 80, 128})
    if (hd <= w) return w;
  return 0;
}

}  // namespace

void CudaBackend::attention_segments(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                                     const std::vector<int64_t>& segment_lengths, float scale) {
  // q, k, v: [N, H, hd] f32 -> out: [N, H, hd] f32
  const int64_t N = q.dim(0), H = q.dim(1), hd = q.dim(2);
  CHECK(k.numel() == q.numel() && v.numel() == q.numel() && out.numel() == q.numel());
  const int HDP = padded_head_dim(hd);
  CHECK_MSG(HDP > 0, "attention_segments: head size above 128");
  if (N == 0) return;
  CHECK_MSG(N < (int64_t{1} << 31), "attention_segments: too many rows");
  std::vector<int4> tiles;
  int64_t row = 0;
  for (int64_t len : segment_lengths) {
    CHECK(len > 0 && row + len <= N);
    for (int64_t r = 0; r < len; r += kRows)
      tiles.push_back(make_int4(static_cast<int>(row), static_cast<int>(len), static_cast<int>(r), 0));
    row += len;
  }
  CHECK_MSG(row == N, "segment lengths must sum to the number of rows");

  Buffer tile_buf(this, DType::kI32, {static_cast<int64_t>(tiles.size()) * 4});
  upload(tile_buf, tiles.data());
  // Q, K, V as bf16 hi / lo: six [H, N, HDP] arrays.
  Buffer split(this, DType::kBF16, {6, H, N, HDP});
  const int64_t each = H * N * HDP;
  auto* base = split.tensor().ptr<uint16_t>();
  const Tensor* src[3] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) {
    split_rows_kernel<<<blocks_for(each / 2, 256), 256, 0, stream_>>>(
        src[i]->ptr<const float>(), reinterpret_cast<uint32_t*>(base + (2 * i) * each),
        reinterpret_cast<uint32_t*>(base + (2 * i + 1) * each), N, H, hd, HDP);
    CUDA_CHECK_LAUNCH();
  }
  const SplitQkv s{base, base + each, base + 2 * each, base + 3 * each, base + 4 * each, base + 5 * each};
  const auto* t = tile_buf.tensor().ptr<const int4>();
  const int64_t n = static_cast<int64_t>(tiles.size());
  const float scale2 = scale * kLog2e;
  float* o = out.ptr<float>();
  switch (HDP) {
    case 16: launch<16>(stream_, o, s, t, n, N, H, hd, scale2); break;
    case 32: launch<32>(stream_, o, s, t, n, N, H, hd, scale2); break;
    case 64: launch<64>(stream_, o, s, t, n, N, H, hd, scale2); break;
    case 72: launch<72>(stream_, o, s, t, n, N, H, hd, scale2); break;
    case 80: launch<80>(stream_, o, s, t, n, N, H, hd, scale2); break;
    default: launch<128>(stream_, o, s, t, n, N, H, hd, scale2); break;
  }
}

}  // namespace sparkserve
