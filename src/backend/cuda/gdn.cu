// Gated DeltaNet: causal conv with state, gating, and the delta rule. The delta rule runs token by
// token in both forms: gdn_chunked computes the same recurrence as gdn_recurrent (this first CUDA
// pass has no chunked/tensor-core prefill yet; it equals the HF chunked form up to fp32 rounding).
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

}  // namespace

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
