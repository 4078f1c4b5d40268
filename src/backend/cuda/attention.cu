// Gated full attention pieces: query/gate split, partial rotate-half RoPE, paged KV writes in the
// pool's dtype (KvPool), and the choice of attention kernel:
//   - bf16 / fp8 pools with head_dim 32, 64, 128 or 256: the tensor-core kernels, split-K decode
//     (attention_decode.cu) when every span has at most kDecodeMaxTokens tokens, flash prefill
//     (attention_prefill.cu) otherwise;
//   - f32 pools (exact fp32, the reference mode) and other head dims: the SIMT kernel below, one
//     block per (query row, head), four warps splitting the keys with an online softmax.
#include "backend/cuda/attention_common.cuh"
#include "backend/cuda/attention_kernels.cuh"

namespace sparkserve {
namespace {

constexpr int kThreads = 256;

__global__ void split_query_gate_kernel(float* q, float* gate, const float* qg, int64_t rows, int64_t hd) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * hd) return;
  const int64_t r = i / hd, c = i % hd;
  q[i] = qg[r * 2 * hd + c];
  gate[i] = qg[r * 2 * hd + hd + c];
}

__global__ void rope_kernel(float* x, const int32_t* pos, const float* inv_freq, int64_t T, int64_t heads,
                            int64_t hd, int64_t half) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * heads * half) return;
  const int64_t t = i / (heads * half), h = (i / half) % heads, f = i % half;
  const float angle = static_cast<float>(pos[t]) * inv_freq[f];
  const float c = cosf(angle), s = sinf(angle);
  float* v = x + (t * heads + h) * hd;
  const float x1 = v[f], x2 = v[f + half];
  v[f] = x1 * c - x2 * s;
  v[f + half] = x2 * c + x1 * s;
}

// kv_cache_write: one block per (row, kv head), the K and V rows rounded to the pool's dtype.
__global__ void __launch_bounds__(kThreads) kv_write_kernel(KvView kv, KvType type, const float* k, const float* v,
                                                            DeviceLayout L) {
  __shared__ float red[kThreads / 32];
  const int64_t r = blockIdx.x, h = blockIdx.y, hd = kv.hd;
  const int s = L.span_of_row(static_cast<int>(r));
  if (s < 0) return;
  const int64_t pos = L.start_pos(s) + (r - L.row_begin(s));
  const int64_t row = kv_row_index(L, s, pos, kv.block_size, kv.kvh, h);
  store_kv_row<kThreads>(kv.k, kv.k_scale, type, row, k + (r * kv.kvh + h) * hd, hd, red, threadIdx.x);
  store_kv_row<kThreads>(kv.v, kv.v_scale, type, row, v + (r * kv.kvh + h) * hd, hd, red, threadIdx.x);
}

// attention_prep: one warp per (row, head) over nh query heads then kvh key heads (a block per
// vector spent most of its time in its barriers: ~6,000 blocks of 128 threads for a few hundred
// tokens). The head's vector is normalised (zero-centred RMSNorm, sum of squares in double as
// norm.cu) into shared memory, rotated there as rope_kernel does, and written out; key heads also
// go to the KV pools with their value rows (kv_write_kernel's rounding).
constexpr int kPrepWarps = 4;

__global__ void __launch_bounds__(kPrepWarps * 32) attention_prep_kernel(
    float* q, float* gate, const float* qg, float* k, const float* v, const float* q_norm_w, const float* k_norm_w,
    float eps, const int32_t* pos, const float* inv_freq, int64_t half, KvView kv, KvType type, DeviceLayout L,
    int64_t nh, int64_t T) {
  extern __shared__ float xs_all[];  // [kPrepWarps][hd]
  const int lane = threadIdx.x % 32;
  const int64_t kvh = kv.kvh, hd = kv.hd, heads = nh + kvh;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kPrepWarps + threadIdx.x / 32;
  if (item >= T * heads) return;  // warp-uniform; nothing below synchronises more than the warp
  const int64_t row = item / heads, hh = item % heads;
  float* xs = xs_all + (threadIdx.x / 32) * hd;
  const bool is_q = hh < nh;
  const int64_t kh = hh - nh;
  const float* src = is_q ? qg + (row * nh + hh) * 2 * hd : k + (row * kvh + kh) * hd;
  const float* w = is_q ? q_norm_w : k_norm_w;
  double ss = 0;
  for (int64_t c = lane; c < hd; c += 32) {
    const float x = src[c];
    xs[c] = x;
    ss += static_cast<double>(x) * x;
    if (is_q) gate[(row * nh + hh) * hd + c] = src[hd + c];
  }
  ss = warp_sum_d(ss);
  const float r = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(hd) + eps));
  for (int64_t c = lane; c < hd; c += 32) xs[c] = xs[c] * r * (1.0f + w[c]);
  __syncwarp();
  const float t = static_cast<float>(pos[row]);
  float* dst = is_q ? q + (row * nh + hh) * hd : k + (row * kvh + kh) * hd;
  for (int64_t c = lane; c < hd; c += 32) {
    float y = xs[c];
    if (c < 2 * half) {
      const int64_t f = c < half ? c : c - half;
      const float angle = t * inv_freq[f];
      const float cs = cosf(angle), sn = sinf(angle);
      const float x1 = xs[f], x2 = xs[f + half];
      y = c < half ? x1 * cs - x2 * sn : x2 * cs + x1 * sn;
    }
    dst[c] = y;  // the pool write below reads back only this lane's own elements
  }
  if (is_q) return;
  const int s = L.span_of_row(static_cast<int>(row));
  if (s < 0) return;
  const int64_t p = L.start_pos(s) + (row - L.row_begin(s));
  const int64_t pool_row = kv_row_index(L, s, p, kv.block_size, kvh, kh);
  store_kv_row<32>(kv.k, kv.k_scale, type, pool_row, dst, hd, nullptr, lane);
  store_kv_row<32>(kv.v, kv.v_scale, type, pool_row, v + (row * kvh + kh) * hd, hd, nullptr, lane);
}

constexpr int kAttnWarps = 4;
constexpr int kMaxDimsPerLane = 8;  // head_dim <= 256

// Element c of pool row `row` as f32 (fp8: the code's value; the caller applies the row scale).
template <KvType kType>
__device__ __forceinline__ float kv_elem(const void* pool, int64_t row, int64_t hd, int64_t c) {
  if constexpr (kType == KvType::kF32) return static_cast<const float*>(pool)[row * hd + c];
  if constexpr (kType == KvType::kBf16) return bf16_bits_to_f32(static_cast<const uint16_t*>(pool)[row * hd + c]);
  return fp8_to_f32(static_cast<const uint8_t*>(pool)[row * hd + c]);
}

template <KvType kType>
__global__ void __launch_bounds__(kAttnWarps * 32) attention_simt_kernel(float* out, const float* q, KvView kv,
                                                                         const float* gate, DeviceLayout L, int64_t nh,
                                                                         float scale) {
  const int64_t row = blockIdx.x, h = blockIdx.y, hd = kv.hd, kvh = kv.kvh;
  const int s = L.span_of_row(static_cast<int>(row));
  if (s < 0) return;
  const int64_t len = L.start_pos(s) + (row - L.row_begin(s)) + 1;  // causal
  const int64_t kv_head = h / (nh / kvh);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* qv = q + (row * nh + h) * hd;
  float qr[kMaxDimsPerLane], acc[kMaxDimsPerLane];
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    const int64_t c = lane + 32 * i;
    qr[i] = c < hd ? qv[c] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = warp; j < len; j += kAttnWarps) {
    const int64_t r = kv_row_index(L, s, j, kv.block_size, kvh, kv_head);
    float d = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int64_t c = lane + 32 * i;
      if (c < hd) d += qr[i] * kv_elem<kType>(kv.k, r, hd, c);
    }
    float score = warp_sum(d) * scale;
    float vs = 1.0f;
    if constexpr (kType == KvType::kFp8) {
      score *= kv.k_scale[r];
      vs = kv.v_scale[r];
    }
    const float m_new = fmaxf(m, score);
    const float corr = expf(m - m_new), p = expf(score - m_new);
    l = l * corr + p;
    const float pv = p * vs;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int64_t c = lane + 32 * i;
      if (c < hd) acc[i] = acc[i] * corr + pv * kv_elem<kType>(kv.v, r, hd, c);
    }
    m = m_new;
  }
  __shared__ float sm[kAttnWarps], sl[kAttnWarps];
  __shared__ float sacc[kAttnWarps][32 * kMaxDimsPerLane];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) sacc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm[w]);
  float Lsum = 0.0f;
  float f[kAttnWarps];
  for (int w = 0; w < kAttnWarps; ++w) {
    f[w] = sl[w] > 0.0f ? expf(sm[w] - M) : 0.0f;
    Lsum += sl[w] * f[w];
  }
  for (int64_t c = threadIdx.x; c < hd; c += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) o += sacc[w][c] * f[w];
    const int64_t oi = (row * nh + h) * hd + c;
    // With a gate: the output gate in the same expression sigmoid_mul applies to the stored value.
    out[oi] = gate ? (o / Lsum) * sigmoid_f(gate[oi]) : o / Lsum;
  }
}

KvType kv_type(const KvPool& p) {
  switch (p.dtype()) {
    case DType::kF32: return KvType::kF32;
    case DType::kBF16: return KvType::kBf16;
    case DType::kF8E4M3: return KvType::kFp8;
    default: CHECK_MSG(false, "KV pool dtype must be f32, bf16 or fp8");
  }
  return KvType::kF32;
}

// The pool's shapes checked, as the kernels see it.
KvView kv_view(const KvPool& p) {
  CHECK(p.k.rank() == 4 && p.v.shape == p.k.shape && p.v.dtype == p.k.dtype);
  if (kv_type(p) == KvType::kFp8) {
    const std::vector<int64_t> rows = {p.k.dim(0), p.k.dim(1), p.k.dim(2)};
    CHECK(p.k_scale.dtype == DType::kF32 && p.k_scale.shape == rows && p.v_scale.shape == rows);
  }
  // The prefill kernels keep a tile's pool row indices as int32 (2^31 rows of even 32 bf16 values
  // would be 128 GB of one pool).
  CHECK(p.k.dim(0) * p.k.dim(1) * p.k.dim(2) < (int64_t{1} << 31));
  KvView v;
  v.k = p.k.data;
  v.v = p.v.data;
  v.k_scale = p.k_scale.ptr<float>();
  v.v_scale = p.v_scale.ptr<float>();
  v.block_size = p.k.dim(1);
  v.kvh = p.k.dim(2);
  v.hd = p.k.dim(3);
  return v;
}

// Every span's block table covers its positions and names blocks of the pool.
void check_tables(const BatchLayout& batch, const KvPool& p) {
  const int64_t bs = p.k.dim(1);
  for (const SeqSpan& s : batch.seqs) {
    CHECK((s.start_pos + s.num_tokens + bs - 1) / bs <= s.num_blocks);
    for (int64_t b = 0; b < s.num_blocks; ++b) CHECK(s.block_table[b] >= 0 && s.block_table[b] < p.k.dim(0));
  }
}
}  // namespace

void CudaBackend::split_query_gate(const Tensor& q, const Tensor& gate, const Tensor& qg) {
  const int64_t T = q.dim(0), nh = q.dim(1), hd = q.dim(2);
  CHECK(qg.numel() == 2 * q.numel() && gate.numel() == q.numel());
  if (q.numel() == 0) return;
  split_query_gate_kernel<<<blocks_for(q.numel(), kThreads), kThreads, 0, stream_>>>(
      q.ptr<float>(), gate.ptr<float>(), qg.ptr<const float>(), T * nh, hd);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::rope(const Tensor& x, const Tensor& positions, int64_t rotary_dim, double theta) {
  const int64_t T = x.dim(0), heads = x.dim(1), hd = x.dim(2), half = rotary_dim / 2;
  CHECK(rotary_dim % 2 == 0 && rotary_dim <= hd && positions.numel() == T);
  if (T * heads * half == 0) return;
  const float* inv_freq = rope_inv_freq(rotary_dim, theta);
  rope_kernel<<<blocks_for(T * heads * half, kThreads), kThreads, 0, stream_>>>(
      x.ptr<float>(), positions.ptr<const int32_t>(), inv_freq, T, heads, hd, half);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::attention_prep(const Tensor& q, const Tensor& gate, const Tensor& qg, const Tensor& k,
                                 const Tensor& v, const Tensor& q_norm_w, const Tensor& k_norm_w, float eps,
                                 const Tensor& positions, int64_t rotary_dim, double theta, const KvPool& pool,
                                 const BatchLayout& batch) {
  const int64_t T = q.dim(0), nh = q.dim(1), hd = q.dim(2), kvh = k.dim(1), half = rotary_dim / 2;
  const KvView kv = kv_view(pool);
  CHECK(qg.numel() == 2 * q.numel() && gate.numel() == q.numel() && k.numel() == T * kvh * hd &&
        v.numel() == k.numel() && k.dim(2) == hd);
  CHECK(q_norm_w.numel() == hd && k_norm_w.numel() == hd && positions.numel() == T);
  CHECK(rotary_dim % 2 == 0 && rotary_dim <= hd);
  CHECK(kv.kvh == kvh && kv.hd == hd && T == batch.total_rows);
  check_tables(batch, pool);
  if (T == 0) return;
  DeviceLayout L = device_layout(batch);
  const float* inv_freq = rope_inv_freq(rotary_dim, theta);
  const int64_t items = T * (nh + kvh);
  const size_t shmem = static_cast<size_t>(hd) * kPrepWarps * sizeof(float);
  CHECK_MSG(shmem <= 40 * 1024, "CUDA attention_prep: head_dim too large");
  attention_prep_kernel<<<static_cast<unsigned>((items + kPrepWarps - 1) / kPrepWarps), kPrepWarps * 32, shmem,
                          stream_>>>(
      q.ptr<float>(), gate.ptr<float>(), qg.ptr<const float>(), k.ptr<float>(), v.ptr<const float>(),
      q_norm_w.ptr<const float>(), k_norm_w.ptr<const float>(), eps, positions.ptr<const int32_t>(), inv_freq, half,
      kv, kv_type(pool), L, nh, T);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::kv_cache_write(const KvPool& pool, const Tensor& k, const Tensor& v, const BatchLayout& batch) {
  const KvView kv = kv_view(pool);
  CHECK(k.numel() == batch.total_rows * kv.kvh * kv.hd && v.numel() == k.numel());
  check_tables(batch, pool);
  if (k.numel() == 0) return;
  DeviceLayout L = device_layout(batch);
  const dim3 grid(static_cast<unsigned>(batch.total_rows), static_cast<unsigned>(kv.kvh));
  kv_write_kernel<<<grid, kThreads, 0, stream_>>>(kv, kv_type(pool), k.ptr<const float>(), v.ptr<const float>(), L);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::attention(const Tensor& out, const Tensor& q, const KvPool& pool, const BatchLayout& batch,
                            const AttentionDims& d) {
  launch_attention(out, q, nullptr, pool, batch, d);
}

void CudaBackend::gated_attention(const Tensor& out, const Tensor& q, const Tensor& gate, const KvPool& pool,
                                  const BatchLayout& batch, const AttentionDims& d) {
  CHECK(gate.numel() == q.numel());
  launch_attention(out, q, gate.ptr<const float>(), pool, batch, d);
}

void CudaBackend::launch_attention(const Tensor& out, const Tensor& q, const float* gate, const KvPool& pool,
                                   const BatchLayout& batch, const AttentionDims& d) {
  const int64_t nh = d.num_heads, hd = d.head_dim;
  const KvView kv = kv_view(pool);
  CHECK(q.numel() == batch.total_rows * nh * hd && out.numel() == q.numel());
  CHECK(kv.kvh == d.num_kv_heads && kv.hd == hd && nh % d.num_kv_heads == 0);
  CHECK_MSG(hd <= 32 * kMaxDimsPerLane, "CUDA attention supports head_dim <= 256");
  check_tables(batch, pool);
  if (batch.total_rows == 0) return;
  DeviceLayout L = device_layout(batch);
  const KvType type = kv_type(pool);
  const AttentionArgs a{out.ptr<float>(), q.ptr<const float>(), gate, kv, L, static_cast<int>(nh),
                        static_cast<int>(nh / d.num_kv_heads), d.scale};
  if (type != KvType::kF32 && tensor_core_head_dim(hd)) {
    if (L.max_tokens <= kDecodeMaxTokens) {
      launch_attention_decode(*this, a, type == KvType::kFp8);
    } else {
      launch_attention_prefill(*this, a, type == KvType::kFp8);
    }
    return;
  }
  const dim3 grid(static_cast<unsigned>(batch.total_rows), static_cast<unsigned>(nh));
  switch (type) {
    case KvType::kF32:
      attention_simt_kernel<KvType::kF32><<<grid, kAttnWarps * 32, 0, stream_>>>(a.out, a.q, kv, gate, L, nh, d.scale);
      break;
    case KvType::kBf16:
      attention_simt_kernel<KvType::kBf16><<<grid, kAttnWarps * 32, 0, stream_>>>(a.out, a.q, kv, gate, L, nh, d.scale);
      break;
    case KvType::kFp8:
      attention_simt_kernel<KvType::kFp8><<<grid, kAttnWarps * 32, 0, stream_>>>(a.out, a.q, kv, gate, L, nh, d.scale);
      break;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace sparkserve
