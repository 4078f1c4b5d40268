// Embedding lookup, elementwise activations and gates, row gathers.
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

}  // namespace sparkserve
