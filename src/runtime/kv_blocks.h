// Paged KV cache storage for the full-attention layers: one pool per layer
// [num_blocks, block_size, kv_heads, head_dim], indexed by block id. Which block belongs to whom is
// not decided here (the engine's KvBlockPool, or DirectState for a tool running sequences itself).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/ops.h"

namespace sparkserve {

class KvCache {
 public:
  // Pools are f32 on `backend` (the CPU reference keeps the cache in fp32).
  KvCache(Backend& backend, int num_layers, int32_t num_blocks, int64_t block_size,
          int64_t kv_heads, int64_t head_dim);

  const Tensor& k_pool(int layer) const { return k_[static_cast<size_t>(layer)].tensor(); }
  const Tensor& v_pool(int layer) const { return v_[static_cast<size_t>(layer)].tensor(); }
  int num_layers() const { return static_cast<int>(k_.size()); }
  int64_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return num_blocks_; }

  // Copies block src's keys and values (every position, every layer) into block dst.
  void copy_block(int32_t src, int32_t dst);

 private:
  Backend* backend_;
  int64_t block_size_;
  int32_t num_blocks_;
  std::vector<Buffer> k_, v_;
};

}  // namespace sparkserve
