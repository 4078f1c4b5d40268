// y = x W^T on CUDA: the decode GEMVs (gemv_dense.h) for few tokens and quantized weights, the
// quantized GEMV (quant_linear.cu) for what they do not take, else the SIMT matmuls (simt_matmul.h).
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/gemv_dense.h"
#include "backend/cuda/simt_matmul.h"

namespace sparkserve {

void CudaBackend::linear(const Tensor& out, const Tensor& x, const Linear& w) {
  const int64_t K = w.in_features, N = w.out_features, T = K == 0 ? 0 : x.numel() / K;
  CHECK(x.numel() == T * K && out.numel() == T * N);
  // Decode-sized T (and quantized weights at any T): gemv_dense.cu's fused GEMVs.
  if (decode_linear(*this, out.ptr<float>(), x.ptr<const float>(), T, w)) return;
  if (is_quantized(w.format)) {
    quant_matmul(out.ptr<float>(), x.ptr<const float>(), T, 1, nullptr, w);
    return;
  }
  launch_matmul(stream_, out.ptr<float>(), x.ptr<const float>(), T, K, N, w.weight.data, weight_is_bf16(w), 0);
}

}  // namespace sparkserve
