#include "runtime/kv_blocks.h"

#include "core/check.h"

namespace sparkserve {

KvCache::KvCache(Backend& backend, int num_layers, int32_t num_blocks, int64_t block_size,
                 int64_t kv_heads, int64_t head_dim)
    : backend_(&backend), block_size_(block_size), num_blocks_(num_blocks) {
  for (int l = 0; l < num_layers; ++l) {
    k_.emplace_back(&backend, DType::kF32, std::vector<int64_t>{num_blocks, block_size, kv_heads, head_dim});
    v_.emplace_back(&backend, DType::kF32, std::vector<int64_t>{num_blocks, block_size, kv_heads, head_dim});
  }
}

void KvCache::copy_block(int32_t src, int32_t dst) {
  CHECK(src >= 0 && src < num_blocks_ && dst >= 0 && dst < num_blocks_ && src != dst);
  for (size_t l = 0; l < k_.size(); ++l) {
    backend_->copy(k_[l].tensor().rows(dst, 1), k_[l].tensor().rows(src, 1));
    backend_->copy(v_[l].tensor().rows(dst, 1), v_[l].tensor().rows(src, 1));
  }
}

}  // namespace sparkserve
