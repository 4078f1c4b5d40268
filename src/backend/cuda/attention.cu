// Gated full attention pieces: query/gate split, partial rotate-half RoPE, paged KV writes and
// causal GQA attention over the pages (prefill and decode alike: one block per (query row, head),
// four warps splitting the keys with an online softmax, merged at the end).
#include "backend/cuda/cuda_backend.h"

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

__device__ __forceinline__ int64_t kv_offset(const DeviceLayout& L, int s, int64_t pos, int64_t block_size,
                                             int64_t kvh, int64_t head, int64_t hd) {
  const int32_t block = L.table(s)[pos / block_size];
  return ((static_cast<int64_t>(block) * block_size + pos % block_size) * kvh + head) * hd;
}

__global__ void kv_write_kernel(float* k_pool, float* v_pool, const float* k, const float* v, DeviceLayout L,
                                int64_t block_size, int64_t kvh, int64_t hd) {
  const int64_t row_elems = kvh * hd;
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= L.total_rows * row_elems) return;
  const int64_t r = i / row_elems, e = i % row_elems;
  const int s = L.span_of_row(static_cast<int>(r));
  if (s < 0) return;
  const int64_t pos = L.start_pos(s) + (r - L.row_begin(s));
  const int64_t dst = kv_offset(L, s, pos, block_size, kvh, 0, hd) + e;
  k_pool[dst] = k[i];
  v_pool[dst] = v[i];
}

// attention_prep: one block per (row, head) over nh query heads then kvh key heads. The head's
// vector is normalised (zero-centred RMSNorm, sum of squares in double as norm.cu) into shared
// memory, rotated there as rope_kernel does, and written out; key heads also go to the KV pools
// with their value rows (kv_write_kernel's addressing).
constexpr int kPrepThreads = 128;

__global__ void __launch_bounds__(kPrepThreads) attention_prep_kernel(
    float* q, float* gate, const float* qg, float* k, const float* v, const float* q_norm_w, const float* k_norm_w,
    float eps, const int32_t* pos, const float* inv_freq, int64_t half, float* k_pool, float* v_pool,
    DeviceLayout L, int64_t block_size, int64_t nh, int64_t kvh, int64_t hd) {
  extern __shared__ float xs[];  // [hd]
  __shared__ double part[kPrepThreads / 32];
  const int64_t row = blockIdx.x, hh = blockIdx.y;
  const bool is_q = hh < nh;
  const int64_t kh = hh - nh;
  const float* src = is_q ? qg + (row * nh + hh) * 2 * hd : k + (row * kvh + kh) * hd;
  const float* w = is_q ? q_norm_w : k_norm_w;
  double ss = 0;
  for (int64_t c = threadIdx.x; c < hd; c += kPrepThreads) {
    const float x = src[c];
    xs[c] = x;
    ss += static_cast<double>(x) * x;
    if (is_q) gate[(row * nh + hh) * hd + c] = src[hd + c];
  }
  ss = warp_sum_d(ss);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = ss;
  __syncthreads();
  double tot = 0;
  for (int i = 0; i < kPrepThreads / 32; ++i) tot += part[i];
  const float r = static_cast<float>(1.0 / sqrt(tot / static_cast<double>(hd) + eps));
  for (int64_t c = threadIdx.x; c < hd; c += kPrepThreads) xs[c] = xs[c] * r * (1.0f + w[c]);
  __syncthreads();
  const float t = static_cast<float>(pos[row]);
  float* dst = is_q ? q + (row * nh + hh) * hd : k + (row * kvh + kh) * hd;
  for (int64_t c = threadIdx.x; c < hd; c += kPrepThreads) {
    float y = xs[c];
    if (c < 2 * half) {
      const int64_t f = c < half ? c : c - half;
      const float angle = t * inv_freq[f];
      const float cs = cosf(angle), sn = sinf(angle);
      const float x1 = xs[f], x2 = xs[f + half];
      y = c < half ? x1 * cs - x2 * sn : x2 * cs + x1 * sn;
    }
    dst[c] = y;  // the pool copy below reads back only this thread's own elements
  }
  if (is_q) return;
  const int s = L.span_of_row(static_cast<int>(row));
  if (s < 0) return;
  const int64_t p = L.start_pos(s) + (row - L.row_begin(s));
  const int64_t off = ((static_cast<int64_t>(L.table(s)[p / block_size]) * block_size + p % block_size) * kvh + kh) * hd;
  for (int64_t c = threadIdx.x; c < hd; c += kPrepThreads) {
    k_pool[off + c] = dst[c];
    v_pool[off + c] = v[(row * kvh + kh) * hd + c];
  }
}

constexpr int kAttnWarps = 4;
constexpr int kMaxDimsPerLane = 8;  // head_dim <= 256

__global__ void __launch_bounds__(kAttnWarps * 32) attention_kernel(float* out, const float* q, const float* k_pool,
                                                                    const float* v_pool, const float* gate,
                                                                    DeviceLayout L,
                                                                    int64_t nh, int64_t kvh, int64_t hd,
                                                                    int64_t block_size, float scale) {
  const int64_t row = blockIdx.x, h = blockIdx.y;
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
    const int64_t off = kv_offset(L, s, j, block_size, kvh, kv_head, hd);
    float d = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int64_t c = lane + 32 * i;
      if (c < hd) d += qr[i] * k_pool[off + c];
    }
    const float score = warp_sum(d) * scale;
    const float m_new = fmaxf(m, score);
    const float corr = expf(m - m_new), p = expf(score - m_new);
    l = l * corr + p;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int64_t c = lane + 32 * i;
      if (c < hd) acc[i] = acc[i] * corr + p * v_pool[off + c];
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
                                 const Tensor& positions, int64_t rotary_dim, double theta, const Tensor& k_pool,
                                 const Tensor& v_pool, const BatchLayout& batch) {
  const int64_t T = q.dim(0), nh = q.dim(1), hd = q.dim(2), kvh = k.dim(1), half = rotary_dim / 2;
  const int64_t bs = k_pool.dim(1);
  CHECK(qg.numel() == 2 * q.numel() && gate.numel() == q.numel() && k.numel() == T * kvh * hd &&
        v.numel() == k.numel() && k.dim(2) == hd);
  CHECK(q_norm_w.numel() == hd && k_norm_w.numel() == hd && positions.numel() == T);
  CHECK(rotary_dim % 2 == 0 && rotary_dim <= hd);
  CHECK(k_pool.dim(2) == kvh && k_pool.dim(3) == hd && T == batch.total_rows);
  for (const SeqSpan& s : batch.seqs) {
    CHECK((s.start_pos + s.num_tokens + bs - 1) / bs <= s.num_blocks);
    for (int64_t b = 0; b < s.num_blocks; ++b) CHECK(s.block_table[b] >= 0 && s.block_table[b] < k_pool.dim(0));
  }
  if (T == 0) return;
  DeviceLayout L = device_layout(batch);
  const float* inv_freq = rope_inv_freq(rotary_dim, theta);
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(nh + kvh));
  const size_t shmem = static_cast<size_t>(hd) * sizeof(float);
  CHECK_MSG(shmem <= 48 * 1024, "CUDA attention_prep: head_dim too large");
  attention_prep_kernel<<<grid, kPrepThreads, shmem, stream_>>>(
      q.ptr<float>(), gate.ptr<float>(), qg.ptr<const float>(), k.ptr<float>(), v.ptr<const float>(),
      q_norm_w.ptr<const float>(), k_norm_w.ptr<const float>(), eps, positions.ptr<const int32_t>(), inv_freq, half,
      k_pool.ptr<float>(), v_pool.ptr<float>(), L, bs, nh, kvh, hd);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::kv_cache_write(const Tensor& k_pool, const Tensor& v_pool, const Tensor& k, const Tensor& v,
                                 const BatchLayout& batch) {
  const int64_t bs = k_pool.dim(1), kvh = k_pool.dim(2), hd = k_pool.dim(3), row = kvh * hd;
  CHECK(k.numel() == batch.total_rows * row && v.numel() == k.numel());
  for (const SeqSpan& s : batch.seqs) {
    CHECK((s.start_pos + s.num_tokens + bs - 1) / bs <= s.num_blocks);
    for (int64_t b = 0; b < s.num_blocks; ++b) CHECK(s.block_table[b] >= 0 && s.block_table[b] < k_pool.dim(0));
  }
  if (k.numel() == 0) return;
  DeviceLayout L = device_layout(batch);
  kv_write_kernel<<<blocks_for(k.numel(), kThreads), kThreads, 0, stream_>>>(
      k_pool.ptr<float>(), v_pool.ptr<float>(), k.ptr<const float>(), v.ptr<const float>(), L, bs, kvh, hd);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::attention(const Tensor& out, const Tensor& q, const Tensor& k_pool, const Tensor& v_pool,
                            const BatchLayout& batch, const AttentionDims& d) {
  launch_attention(out, q, nullptr, k_pool, v_pool, batch, d);
}

void CudaBackend::gated_attention(const Tensor& out, const Tensor& q, const Tensor& gate, const Tensor& k_pool,
                                  const Tensor& v_pool, const BatchLayout& batch, const AttentionDims& d) {
  CHECK(gate.numel() == q.numel());
  launch_attention(out, q, gate.ptr<const float>(), k_pool, v_pool, batch, d);
}

void CudaBackend::launch_attention(const Tensor& out, const Tensor& q, const float* gate, const Tensor& k_pool,
                                   const Tensor& v_pool, const BatchLayout& batch, const AttentionDims& d) {
  const int64_t nh = d.num_heads, hd = d.head_dim;
  CHECK(q.numel() == batch.total_rows * nh * hd && out.numel() == q.numel());
  CHECK(k_pool.dim(2) == d.num_kv_heads && k_pool.dim(3) == hd && nh % d.num_kv_heads == 0);
  CHECK_MSG(hd <= 32 * kMaxDimsPerLane, "CUDA attention supports head_dim <= 256");
  for (const SeqSpan& s : batch.seqs) CHECK((s.start_pos + s.num_tokens + k_pool.dim(1) - 1) / k_pool.dim(1) <= s.num_blocks);
  if (batch.total_rows == 0) return;
  DeviceLayout L = device_layout(batch);
  const dim3 grid(static_cast<unsigned>(batch.total_rows), static_cast<unsigned>(nh));
  attention_kernel<<<grid, kAttnWarps * 32, 0, stream_>>>(out.ptr<float>(), q.ptr<const float>(),
                                                          k_pool.ptr<const float>(), v_pool.ptr<const float>(), gate,
                                                          L, nh, d.num_kv_heads, hd, k_pool.dim(1), d.scale);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sparkserve
