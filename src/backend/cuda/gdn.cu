// Gated DeltaNet: causal conv with state, gating, and the delta rule. The delta rule runs token by
// token in both forms: gdn_chunked computes the same recurrence as gdn_recurrent (this first CUDA
// pass has no chunked/tensor-core prefill yet; it equals the HF chunked form up to fp32 rounding).
#include <algorithm>
#include <optional>

#include "backend/cuda/cuda_backend.h"

namespace sparkserve {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxConvKernel = 8;

// One thread per (span, channel): the window of the last K inputs lives in registers.
__global__ void gdn_conv_kernel(float* out, const float* x, const float* w, float* state_pool, DeviceLayout L,
                                int64_t C, int K) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<int64_t>(L.num_seqs) * C) return;
  const int s = static_cast<int>(i / C);
  const int64_t c = i % C;
  const int S = K - 1;
  float* state = state_pool + (static_cast<int64_t>(L.gdn_slot(s)) * C + c) * S;
  float win[kMaxConvKernel], wc[kMaxConvKernel];
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j) {
    win[j] = j < S ? state[j] : 0.0f;
    wc[j] = j < K ? w[c * K + j] : 0.0f;
  }
  const int64_t r0 = L.row_begin(s), n = L.num_tokens(s);
  for (int64_t t = 0; t < n; ++t) {
    // win[0..S) = previous inputs, win[S] = this one.
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j)
      if (j == S) win[j] = x[(r0 + t) * C + c];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < kMaxConvKernel; ++j)
      if (j < K) acc += wc[j] * win[j];
    out[(r0 + t) * C + c] = silu_f(acc);
#pragma unroll
    for (int j = 0; j < kMaxConvKernel - 1; ++j)
      if (j < S) win[j] = win[j + 1];
  }
#pragma unroll
  for (int j = 0; j < kMaxConvKernel; ++j)
    if (j < S) state[j] = win[j];
}

__global__ void gdn_gating_kernel(float* g, float* beta, const float* a, const float* b, const float* A_log,
                                  const float* dt_bias, int64_t T, int64_t Hv) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * Hv) return;
  const int64_t h = i % Hv;
  const float x = a[i] + dt_bias[h];
  const float softplus = x > 20.0f ? x : log1pf(expf(x));  // torch softplus, threshold 20
  g[i] = -expf(A_log[h]) * softplus;
  beta[i] = sigmoid_f(b[i]);
}

constexpr int kDeltaThreads = 64;

// Grid (span x value head, column blocks): each thread owns one column j of the head's state
// S [dk, dv] (kept in global memory, which the per-token loop keeps hot in L1/L2) and runs the CPU
// reference's steps in its order: S = e^g S; kv = S^T k; delta = beta (v - kv); S += k delta^T;
// o = S^T q.
__global__ void __launch_bounds__(kDeltaThreads) gdn_delta_kernel(
    float* out, const float* qkv, const float* g, const float* beta, float* state_pool, DeviceLayout L,
    int64_t Hv, int64_t Hk, int64_t dk, int64_t dv, int64_t conv_dim, float scale) {
  extern __shared__ float sh[];  // qn[dk], kn[dk]
  float* qn = sh;
  float* kn = sh + dk;
  __shared__ float inv[2];
  const int s = static_cast<int>(blockIdx.x / Hv);
  const int64_t h = blockIdx.x % Hv, kh = h / (Hv / Hk);
  const int64_t j = static_cast<int64_t>(blockIdx.y) * kDeltaThreads + threadIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float* S = state_pool + (static_cast<int64_t>(L.gdn_slot(s)) * Hv + h) * dk * dv;
  const int64_t r0 = L.row_begin(s), n = L.num_tokens(s);
  const int64_t key_dim = Hk * dk;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t row = r0 + t;
    const float* qs = qkv + row * conv_dim + kh * dk;
    const float* ks = qkv + row * conv_dim + key_dim + kh * dk;
    for (int64_t i = threadIdx.x; i < dk; i += kDeltaThreads) {
      qn[i] = qs[i];
      kn[i] = ks[i];
    }
    __syncthreads();
    // Warp 0 normalises q, warp 1 k (HF l2norm: x * rsqrt(sum x^2 + 1e-6)).
    {
      const float* src = warp == 0 ? qn : kn;
      float ss = 0.0f;
      for (int64_t i = lane; i < dk; i += 32) ss += src[i] * src[i];
      ss = warp_sum(ss);
      if (lane == 0) inv[warp] = 1.0f / sqrtf(ss + 1e-6f) * (warp == 0 ? scale : 1.0f);
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < dk; i += kDeltaThreads) {
      qn[i] *= inv[0];
      kn[i] *= inv[1];
    }
    __syncthreads();
    if (j < dv) {
      const float decay = expf(g[row * Hv + h]);
      const float bt = beta[row * Hv + h];
      const float v = qkv[row * conv_dim + 2 * key_dim + h * dv + j];
      float kv = 0.0f;
      for (int64_t i = 0; i < dk; ++i) {
        const float x = S[i * dv + j] * decay;
        S[i * dv + j] = x;
        kv += x * kn[i];
      }
      const float delta = (v - kv) * bt;
      float o = 0.0f;
      for (int64_t i = 0; i < dk; ++i) {
        const float x = S[i * dv + j] + kn[i] * delta;
        S[i * dv + j] = x;
        o += x * qn[i];
      }
      out[(row * Hv + h) * dv + j] = o;
    }
    __syncthreads();  // qn/kn are rewritten by the next token
  }
}

// The decode chain after the conv, one block per (span, value head), every span one token:
// gating (g, beta) -> L2-norm q, k -> delta step -> gated RMSNorm of the head's dv outputs.
// Thread (j, p) owns column j of the state S [dk, dv] on rows i = p, p + P, ... (held in registers
// between the two passes, so S is read and written once); the P partial sums of S^T k and S^T q
// are added in shared memory in p order.
constexpr int kDecodeSplit = 4;     // P
constexpr int kDecodeMaxRows = 32;  // dk <= P * 32
constexpr int kDecodeMaxThreads = 512;  // P * dv (128 registers per thread for the rows)

// a and b: either computed here as the dot products h[row] . W[h] (wa, wb non-null: plain f32/bf16
// [Hv, H] weights; one block does its head's two rows, every thread a strided part, warp sums added
// in warp order) or read from a, b ([T, Hv], the projections run as linear ops).
__global__ void __launch_bounds__(kDecodeMaxThreads) gdn_decode_kernel(
    float* out, const float* qkv, const float* z, const float* a, const float* b, const float* hid,
    const void* wa, const void* wb, bool w_bf16, int64_t H, const float* A_log, const float* dt_bias,
    const float* norm_w, float eps, float* state_pool, DeviceLayout L, int64_t Hv, int64_t Hk, int64_t dk,
    int64_t dv, int64_t conv_dim, float scale) {
  extern __shared__ float sh[];  // qn[dk], kn[dk], part[P][dv]
  float* qn = sh;
  float* kn = sh + dk;
  float* part = sh + 2 * dk;
  __shared__ float inv[2];
  __shared__ double ssq[32];
  __shared__ float red_a[32], red_b[32];
  const int s = static_cast<int>(blockIdx.x / Hv);
  const int64_t h = blockIdx.x % Hv, kh = h / (Hv / Hk);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, nwarps = blockDim.x / 32;
  const int64_t j = tid % dv;
  const int p = static_cast<int>(tid / dv);
  const int64_t row = L.row_begin(s);
  const int64_t key_dim = Hk * dk;
  const float* qs = qkv + row * conv_dim + kh * dk;
  const float* ks = qkv + row * conv_dim + key_dim + kh * dk;
  for (int64_t i = tid; i < dk; i += blockDim.x) {
    qn[i] = qs[i];
    kn[i] = ks[i];
  }
  const int64_t gi = row * Hv + h;
  if (wa) {
    float pa = 0.0f, pb = 0.0f;
    const float* hr = hid + row * H;
    // Eight strided elements' loads issued before their products: a plain loop waits for each
    // iteration's loads in turn (6 DRAM round trips at H = 3072).
    constexpr int kAb = 8;
    for (int64_t base = tid; base < H; base += kAb * static_cast<int64_t>(blockDim.x)) {
      float xv[kAb], av[kAb], bv[kAb];
#pragma unroll
      for (int u = 0; u < kAb; ++u) {
        const int64_t i = base + static_cast<int64_t>(u) * blockDim.x;
        const bool in = i < H;
        xv[u] = in ? hr[i] : 0.0f;
        av[u] = in ? load_weight(wa, w_bf16, h * H + i) : 0.0f;
        bv[u] = in ? load_weight(wb, w_bf16, h * H + i) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kAb; ++u) {
        pa += xv[u] * av[u];
        pb += xv[u] * bv[u];
      }
    }
    pa = warp_sum(pa);
    pb = warp_sum(pb);
    if (lane == 0) {
      red_a[warp] = pa;
      red_b[warp] = pb;
    }
  }
  __syncthreads();
  float a_val, b_val;
  if (wa) {
    a_val = 0.0f;
    b_val = 0.0f;
    for (int w = 0; w < nwarps; ++w) {
      a_val += red_a[w];
      b_val += red_b[w];
    }
  } else {
    a_val = a[gi];
    b_val = b[gi];
  }
  if (warp < 2) {  // warp 0 normalises q, warp 1 k (HF l2norm: x * rsqrt(sum x^2 + 1e-6))
    const float* src = warp == 0 ? qn : kn;
    float ss = 0.0f;
    for (int64_t i = lane; i < dk; i += 32) ss += src[i] * src[i];
    ss = warp_sum(ss);
    if (lane == 0) inv[warp] = 1.0f / sqrtf(ss + 1e-6f) * (warp == 0 ? scale : 1.0f);
  }
  __syncthreads();
  for (int64_t i = tid; i < dk; i += blockDim.x) {
    qn[i] *= inv[0];
    kn[i] *= inv[1];
  }
  // Gating as gdn_gating_kernel computes it.
  const float x = a_val + dt_bias[h];
  const float softplus = x > 20.0f ? x : log1pf(expf(x));
  const float decay = expf(-expf(A_log[h]) * softplus);
  const float bt = sigmoid_f(b_val);
  __syncthreads();

  float* S = state_pool + (static_cast<int64_t>(L.gdn_slot(s)) * Hv + h) * dk * dv;
  float reg[kDecodeMaxRows];
  float kv = 0.0f;
#pragma unroll
  for (int m = 0; m < kDecodeMaxRows; ++m) {
    const int64_t i = p + static_cast<int64_t>(m) * kDecodeSplit;
    if (i < dk) {
      reg[m] = S[i * dv + j] * decay;
      kv += reg[m] * kn[i];
    }
  }
  part[p * dv + j] = kv;
  __syncthreads();
  kv = 0.0f;
  for (int r = 0; r < kDecodeSplit; ++r) kv += part[r * dv + j];
  const float v = qkv[row * conv_dim + 2 * key_dim + h * dv + j];
  const float delta = (v - kv) * bt;
  float o = 0.0f;
#pragma unroll
  for (int m = 0; m < kDecodeMaxRows; ++m) {
    const int64_t i = p + static_cast<int64_t>(m) * kDecodeSplit;
    if (i < dk) {
      const float y = reg[m] + kn[i] * delta;
      S[i * dv + j] = y;
      o += y * qn[i];
    }
  }
  __syncthreads();  // every thread has read part[] for kv
  part[p * dv + j] = o;
  __syncthreads();
  o = 0.0f;
  for (int r = 0; r < kDecodeSplit; ++r) o += part[r * dv + j];
  // Gated RMSNorm over the head's dv outputs (sum of squares in double, as norm.cu).
  double sq = p == 0 ? static_cast<double>(o) * o : 0.0;
  sq = warp_sum_d(sq);
  if (lane == 0) ssq[warp] = sq;
  __syncthreads();
  double tot = 0;
  for (int w = 0; w < nwarps; ++w) tot += ssq[w];
  const float rs = static_cast<float>(1.0 / sqrt(tot / static_cast<double>(dv) + eps));
  if (p == 0) {
    const int64_t oi = row * Hv * dv + h * dv + j;
    out[oi] = o * rs * norm_w[j] * silu_f(z[oi]);
  }
}

}  // namespace

namespace {
bool plain_weight(const Linear& w) {
  return (w.format == WeightFormat::kBf16 || w.format == WeightFormat::kF32) && w.activation == ActivationQuant::kNone;
}
}  // namespace

void CudaBackend::gdn_decode_step(const Tensor& out, const Tensor& h, const Tensor& mixed, const Tensor& z,
                                  const Linear& in_proj_a, const Linear& in_proj_b, const Tensor& conv_w,
                                  const Tensor& A_log, const Tensor& dt_bias, const Tensor& norm_w, float eps,
                                  const Tensor& conv_state_pool, const Tensor& state_pool, const BatchLayout& batch,
                                  const GdnDims& d) {
  const int64_t Hv = d.num_v_heads, dk = d.k_head_dim, dv = d.v_head_dim, C = d.conv_dim(), K = d.conv_kernel;
  if (dv > kDecodeMaxThreads / kDecodeSplit || dv < 16 || dv % 8 != 0 || dk > kDecodeSplit * kDecodeMaxRows || K < 1 ||
      K > kMaxConvKernel) {
    // Geometry outside the fused kernel's limits: the op chain.
    Backend::gdn_decode_step(out, h, mixed, z, in_proj_a, in_proj_b, conv_w, A_log, dt_bias, norm_w, eps,
                             conv_state_pool, state_pool, batch, d);
    return;
  }
  const int64_t T = batch.total_rows, H = h.numel() / std::max<int64_t>(T, 1);
  CHECK(h.numel() == T * H && mixed.numel() == T * C && z.numel() == T * Hv * dv && out.numel() == z.numel());
  CHECK(in_proj_a.out_features == Hv && in_proj_b.out_features == Hv && in_proj_a.in_features == H &&
        in_proj_b.in_features == H && A_log.numel() == Hv && dt_bias.numel() == Hv);
  CHECK(norm_w.numel() == dv && conv_w.dim(0) == C && conv_w.dim(1) == K);
  CHECK(conv_state_pool.dim(1) == C && conv_state_pool.dim(2) == K - 1);
  CHECK(state_pool.dim(1) == Hv && state_pool.dim(2) == dk && state_pool.dim(3) == dv && Hv % d.num_k_heads == 0);
  for (const SeqSpan& s : batch.seqs) {
    CHECK_MSG(s.num_tokens == 1, "gdn_decode_step takes single-token spans");
    CHECK(s.gdn_slot >= 0 && s.gdn_slot < state_pool.dim(0) && s.gdn_slot < conv_state_pool.dim(0));
  }
  if (batch.seqs.empty()) return;
  // a and b inside the kernel when both weights are plain f32/bf16 of one kind; else as linear ops.
  const bool fuse_ab = plain_weight(in_proj_a) && plain_weight(in_proj_b) && in_proj_a.format == in_proj_b.format;
  std::optional<Scratch> ab;
  const float* ab_dev = nullptr;  // b rows then a rows
  if (!fuse_ab) {
    ab.emplace(this, static_cast<size_t>(2 * T * Hv) * sizeof(float));
    const Tensor b_t(ab->as<float>(), DType::kF32, {T, Hv}, Device::kCuda);
    const Tensor a_t(ab->as<float>() + T * Hv, DType::kF32, {T, Hv}, Device::kCuda);
    linear(b_t, h, in_proj_b);
    linear(a_t, h, in_proj_a);
    ab_dev = ab->as<const float>();
  }
  DeviceLayout L = device_layout(batch);
  // The conv output stays in stream-ordered scratch between the two kernels.
  Scratch qkv(this, static_cast<size_t>(T * C) * sizeof(float));
  const int64_t n = static_cast<int64_t>(batch.seqs.size()) * C;
  gdn_conv_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(
      qkv.as<float>(), mixed.ptr<const float>(), conv_w.ptr<const float>(), conv_state_pool.ptr<float>(), L, C,
      static_cast<int>(K));
  CUDA_CHECK_LAUNCH();
  const unsigned threads = static_cast<unsigned>(kDecodeSplit * dv);
  const size_t shmem = static_cast<size_t>(2 * dk + kDecodeSplit * dv) * sizeof(float);
  gdn_decode_kernel<<<static_cast<unsigned>(batch.seqs.size() * Hv), threads, shmem, stream_>>>(
      out.ptr<float>(), qkv.as<const float>(), z.ptr<const float>(),
      fuse_ab ? nullptr : ab_dev + T * Hv, ab_dev, h.ptr<const float>(),
      fuse_ab ? in_proj_a.weight.data : nullptr, fuse_ab ? in_proj_b.weight.data : nullptr,
      in_proj_a.format == WeightFormat::kBf16, H, A_log.ptr<const float>(), dt_bias.ptr<const float>(),
      norm_w.ptr<const float>(), eps, state_pool.ptr<float>(), L, Hv, d.num_k_heads, dk, dv, C,
      1.0f / sqrtf(static_cast<float>(dk)));
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::gdn_conv(const Tensor& out, const Tensor& mixed, const Tensor& weight,
                           const Tensor& conv_state_pool, const BatchLayout& batch) {
  const int64_t C = weight.dim(0), K = weight.dim(1);
  CHECK(mixed.numel() == batch.total_rows * C && out.numel() == mixed.numel());
  CHECK(conv_state_pool.dim(1) == C && conv_state_pool.dim(2) == K - 1);
  CHECK_MSG(K >= 1 && K <= kMaxConvKernel, "CUDA gdn_conv supports kernel sizes 1..8");
  for (const SeqSpan& s : batch.seqs) CHECK(s.gdn_slot >= 0 && s.gdn_slot < conv_state_pool.dim(0));
  const int64_t n = static_cast<int64_t>(batch.seqs.size()) * C;
  if (n == 0) return;
  DeviceLayout L = device_layout(batch);
  gdn_conv_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(out.ptr<float>(), mixed.ptr<const float>(),
                                                                    weight.ptr<const float>(),
                                                                    conv_state_pool.ptr<float>(), L, C,
                                                                    static_cast<int>(K));
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::gdn_gating(const Tensor& g, const Tensor& beta, const Tensor& a, const Tensor& b,
                             const Tensor& A_log, const Tensor& dt_bias) {
  const int64_t Hv = A_log.numel(), T = a.numel() / Hv;
  CHECK(b.numel() == a.numel() && g.numel() == a.numel() && beta.numel() == a.numel());
  if (T * Hv == 0) return;
  gdn_gating_kernel<<<blocks_for(T * Hv, kThreads), kThreads, 0, stream_>>>(
      g.ptr<float>(), beta.ptr<float>(), a.ptr<const float>(), b.ptr<const float>(), A_log.ptr<const float>(),
      dt_bias.ptr<const float>(), T, Hv);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::gdn_recurrent(const Tensor& out, const Tensor& qkv, const Tensor& g, const Tensor& beta,
                                const Tensor& state_pool, const BatchLayout& batch, const GdnDims& d) {
  const int64_t Hv = d.num_v_heads, dk = d.k_head_dim, dv = d.v_head_dim;
  CHECK(qkv.dim(1) == d.conv_dim() && state_pool.dim(1) == Hv && state_pool.dim(2) == dk &&
        state_pool.dim(3) == dv && Hv % d.num_k_heads == 0);
  for (const SeqSpan& s : batch.seqs) CHECK(s.gdn_slot >= 0 && s.gdn_slot < state_pool.dim(0));
  if (batch.seqs.empty()) return;
  DeviceLayout L = device_layout(batch);
  const dim3 grid(static_cast<unsigned>(batch.seqs.size() * Hv), blocks_for(dv, kDeltaThreads));
  const size_t shmem = static_cast<size_t>(2 * dk) * sizeof(float);
  CHECK_MSG(shmem <= 48 * 1024, "CUDA gdn: k_head_dim too large");
  gdn_delta_kernel<<<grid, kDeltaThreads, shmem, stream_>>>(
      out.ptr<float>(), qkv.ptr<const float>(), g.ptr<const float>(), beta.ptr<const float>(),
      state_pool.ptr<float>(), L, Hv, d.num_k_heads, dk, dv, d.conv_dim(), 1.0f / sqrtf(static_cast<float>(dk)));
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::gdn_chunked(const Tensor& out, const Tensor& qkv, const Tensor& g, const Tensor& beta,
                              const Tensor& state_pool, const BatchLayout& batch, const GdnDims& d) {
  gdn_recurrent(out, qkv, g, beta, state_pool, batch, d);
}

}  // namespace sparkserve
