// Embedding lookup, elementwise activations and gates, row gathers, argmax.
#include "backend/cuda/cuda_backend.h"

namespace sparkserve {
namespace {

constexpr int kThreads = 256;

__global__ void embedding_kernel(float* out, const int32_t* ids, const void* table, bool bf16, int64_t T,
                                 int64_t H) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * H) return;
  const int64_t t = i / H, c = i % H;
  out[i] = load_weight(table, bf16, static_cast<int64_t>(ids[t]) * H + c);
}

__global__ void silu_mul_kernel(float* out, const float* gu, int64_t T, int64_t I) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * I) return;
  const int64_t t = i / I, c = i % I;
  out[i] = silu_f(gu[t * 2 * I + c]) * gu[t * 2 * I + I + c];
}

__global__ void add_kernel(float* out, const float* a, const float* b, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

__global__ void sigmoid_mul_kernel(float* x, const float* gate, int64_t n) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] *= sigmoid_f(gate[i]);
}

__global__ void add_sigmoid_scaled_kernel(float* out, const float* y, const float* g, int64_t T, int64_t H) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * H) return;
  out[i] += sigmoid_f(g[i / H]) * y[i];
}

__global__ void gather_rows_kernel(float* out, const float* x, const int64_t* rows, int64_t R, int64_t D) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= R * D) return;
  out[i] = x[rows[i / D] * D + i % D];
}

__global__ void gather_rows_at_kernel(float* out, const float* x, const int32_t* rows, int64_t T, int64_t R, int64_t D) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= R * D) return;
  const int64_t r = rows[i / D];
  out[i] = r >= 0 && r < T ? x[r * D + i % D] : __int_as_float(0x7fc00000);
}

// One block per row over its first `vocab` columns: the greatest value, lowest index among equal
// maxima, NaN skipped (as the CPU's argmax); and the first NaN / +Inf index. A 64-bit key per
// thread orders (value, index) in one integer compare: the value's bits made monotonic in the high
// word, the inverted index in the low word.
__device__ __forceinline__ uint64_t argmax_key(float v, int32_t i) {
  uint32_t b = __float_as_uint(v);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);  // order-preserving map of floats to unsigned
  return (static_cast<uint64_t>(b) << 32) | static_cast<uint32_t>(0x7fffffff - i);
}

__global__ void argmax_kernel(RowArgmax* out, const float* logits, int64_t V, int64_t vocab, const int32_t* excluded,
                              int num_excluded) {
  const float* row = logits + blockIdx.x * V;
  __shared__ int32_t ex[kArgmaxMaxExcluded];  // a few stop ids, compared with every column
  for (int j = threadIdx.x; j < num_excluded; j += blockDim.x) ex[j] = excluded[j];
  __syncthreads();
  uint64_t best = 0;  // below every key of a real column
  int32_t bad = 0x7fffffff;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = row[i];
    if (isnan(v) || v == INFINITY) bad = min(bad, static_cast<int32_t>(i));
    bool out_of_play = isnan(v);
    for (int j = 0; j < num_excluded; ++j) out_of_play = out_of_play || ex[j] == static_cast<int32_t>(i);
    if (!out_of_play) {
      const uint64_t k = argmax_key(v, static_cast<int32_t>(i));
      if (k > best) best = k;
    }
  }
  __shared__ uint64_t sk[kThreads];
  __shared__ int32_t sb[kThreads];
  sk[threadIdx.x] = best;
  sb[threadIdx.x] = bad;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      sk[threadIdx.x] = max(sk[threadIdx.x], sk[threadIdx.x + s]);
      sb[threadIdx.x] = min(sb[threadIdx.x], sb[threadIdx.x + s]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    RowArgmax r;
    r.id = sk[0] == 0 ? 0 : 0x7fffffff - static_cast<int32_t>(sk[0] & 0xffffffffu);
    r.nonfinite = sb[0] == 0x7fffffff ? -1 : sb[0];
    out[blockIdx.x] = r;
  }
}

}  // namespace

void CudaBackend::embedding(const Tensor& out, const Tensor& ids, const Linear& table) {
  const int64_t T = ids.numel(), H = table.in_features;
  CHECK(out.numel() == T * H && ids.dtype == DType::kI32);
  if (T == 0) return;
  embedding_kernel<<<blocks_for(T * H, kThreads), kThreads, 0, stream_>>>(
      out.ptr<float>(), ids.ptr<const int32_t>(), table.weight.data, weight_is_bf16(table), T, H);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::silu_mul(const Tensor& out, const Tensor& gate_up) {
  const int64_t T = gate_up.dim(0), I = gate_up.dim(1) / 2;
  CHECK(out.numel() == T * I);
  if (T * I == 0) return;
  silu_mul_kernel<<<blocks_for(T * I, kThreads), kThreads, 0, stream_>>>(out.ptr<float>(),
                                                                         gate_up.ptr<const float>(), T, I);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  CHECK(out.numel() == a.numel() && a.numel() == b.numel());
  const int64_t n = out.numel();
  if (n == 0) return;
  add_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(out.ptr<float>(), a.ptr<const float>(),
                                                                b.ptr<const float>(), n);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::sigmoid_mul(const Tensor& x, const Tensor& gate) {
  CHECK(x.numel() == gate.numel());
  const int64_t n = x.numel();
  if (n == 0) return;
  sigmoid_mul_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream_>>>(x.ptr<float>(), gate.ptr<const float>(), n);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::add_sigmoid_scaled(const Tensor& out, const Tensor& y, const Tensor& gate_logit) {
  const int64_t T = out.dim(0), H = out.dim(1);
  CHECK(y.numel() == T * H && gate_logit.numel() == T);
  if (T * H == 0) return;
  add_sigmoid_scaled_kernel<<<blocks_for(T * H, kThreads), kThreads, 0, stream_>>>(
      out.ptr<float>(), y.ptr<const float>(), gate_logit.ptr<const float>(), T, H);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::gather_rows(const Tensor& out, const Tensor& x, const std::vector<int64_t>& rows) {
  const int64_t D = x.numel() / x.dim(0), R = static_cast<int64_t>(rows.size());
  CHECK(out.numel() == R * D);
  for (int64_t r : rows) CHECK(r >= 0 && r < x.dim(0));
  if (R * D == 0) return;
  Scratch idx = upload_scratch(rows.data(), rows.size() * sizeof(int64_t));
  gather_rows_kernel<<<blocks_for(R * D, kThreads), kThreads, 0, stream_>>>(
      out.ptr<float>(), x.ptr<const float>(), idx.as<const int64_t>(), R, D);
  CUDA_CHECK_LAUNCH();
}

void CudaBackend::gather_rows_at(const Tensor& out, const Tensor& x, const Tensor& rows) {
  const int64_t T = x.dim(0), D = x.numel() / T, R = rows.numel();
  CHECK(rows.dtype == DType::kI32 && out.numel() == R * D);
  if (R * D == 0) return;
  gather_rows_at_kernel<<<blocks_for(R * D, kThreads), kThreads, 0, stream_>>>(out.ptr<float>(), x.ptr<const float>(),
                                                                              rows.ptr<const int32_t>(), T, R, D);
  CUDA_CHECK_LAUNCH();
}

std::vector<RowArgmax> CudaBackend::argmax(const Tensor& logits, int64_t vocab, const std::vector<int32_t>& excluded) {
  const int64_t R = logits.dim(0), V = logits.dim(1);
  CHECK(vocab >= 1 && vocab <= V);
  CHECK(excluded.size() <= kArgmaxMaxExcluded);
  std::vector<RowArgmax> out(static_cast<size_t>(R));
  if (R == 0) return out;
  Scratch dev(this, out.size() * sizeof(RowArgmax));
  // No excluded ids (the common greedy step): no upload, the kernel reads none.
  Scratch ex = excluded.empty() ? Scratch() : upload_scratch(excluded.data(), excluded.size() * sizeof(int32_t));
  argmax_kernel<<<static_cast<unsigned>(R), kThreads, 0, stream_>>>(
      dev.as<RowArgmax>(), logits.ptr<const float>(), V, vocab, ex.as<const int32_t>(), static_cast<int>(excluded.size()));
  CUDA_CHECK_LAUNCH();
  CUDA_CHECK(cudaMemcpyAsync(out.data(), dev.ptr, out.size() * sizeof(RowArgmax), cudaMemcpyDeviceToHost, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  return out;
}

}  // namespace sparkserve
