#include "runtime/kv_blocks.h"

#include "core/check.h"

namespace sparkserve {

int64_t kv_bytes_per_token(DType dtype, int64_t kv_heads, int64_t head_dim) {
  const int64_t scale = dtype == DType::kF8E4M3 ? 4 : 0;
  return 2 * kv_heads * (head_dim * static_cast<int64_t>(dtype_size(dtype)) + scale);
}

KvCache::KvCache(Backend& backend, int num_layers, int32_t num_blocks, int64_t block_size,
                 int64_t kv_heads, int64_t head_dim, DType dtype)
    : backend_(&backend), block_size_(block_size), num_blocks_(num_blocks), dtype_(dtype) {
  CHECK_MSG(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF8E4M3,
            "KV cache dtype must be f32, bf16 or fp8");
  const std::vector<int64_t> shape = {num_blocks, block_size, kv_heads, head_dim};
  buffers_.reserve(static_cast<size_t>(num_layers) * 4);
  for (int l = 0; l < num_layers; ++l) {
    KvPool p;
    p.k = buffers_.emplace_back(&backend, dtype, shape).tensor();
    p.v = buffers_.emplace_back(&backend, dtype, shape).tensor();
    if (dtype == DType::kF8E4M3) {
      const std::vector<int64_t> rows = {num_blocks, block_size, kv_heads};
      p.k_scale = buffers_.emplace_back(&backend, DType::kF32, rows).tensor();
      p.v_scale = buffers_.emplace_back(&backend, DType::kF32, rows).tensor();
    }
    pools_.push_back(p);
  }
}

void KvCache::add_block_copies(int32_t src, int32_t dst, std::vector<TensorCopy>& out) const {
  CHECK(src >= 0 && src < num_blocks_ && dst >= 0 && dst < num_blocks_ && src != dst);
  for (const KvPool& p : pools_)
    for (const Tensor* t : {&p.k, &p.v, &p.k_scale, &p.v_scale})
      if (t->data) out.push_back({t->rows(dst, 1), t->rows(src, 1)});
}

}  // namespace sparkserve
