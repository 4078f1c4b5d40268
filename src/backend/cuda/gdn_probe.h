// For gpu_ops only (tests/gpu/gdn_decode_checks.cpp and gdn_decode_bench.cpp, compiled without nvcc):
// the fused GDN decode step (Backend::gdn_decode_step) through one named kernel of the CUDA
// backend, so the checks can test every kernel on every batch size (not only the one the dispatch
// picks there) and the benchmark can compare them.
#pragma once

#include "backend/ops.h"

namespace sparkserve {

enum class GdnStepPath : int {
  kDispatch = 0,     // what CudaBackend::gdn_decode_step picks
  kBlockPerHead,     // gdn_step_kernel<1>: one block of 256 threads per head
  kClusterOf2,       // gdn_step_kernel<2>: a cluster of 2 blocks of 128 threads per head
  kBlockPerHeadCs,   // gdn_step_kernel<1> with streaming (evict-first) state loads and stores
};

// False when `b` is not the CUDA backend or the geometry is outside the fused kernels' limits
// (nothing ran then). Arguments as Backend::gdn_decode_step.
bool gdn_decode_step_probe(Backend& b, GdnStepPath path, const Tensor& out, const Tensor& h, const Tensor& mixed,
                           const Tensor& z, const Linear& in_proj_a, const Linear& in_proj_b, const Tensor& conv_w,
                           const Tensor& A_log, const Tensor& dt_bias, const Tensor& norm_w, float eps,
                           const Tensor& conv_state_pool, const Tensor& state_pool, const BatchLayout& batch,
                           const GdnDims& d);

}  // namespace sparkserve
