// Paged KV cache for the full-attention layers: one pool per layer
// [num_blocks, block_size, kv_heads, head_dim], a block table per sequence (shared by all layers),
// and a free-list allocator of block ids.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "backend/ops.h"
#include "core/status.h"

namespace sparkserve {

class KvBlockAllocator {
 public:
  explicit KvBlockAllocator(int32_t num_blocks);
  std::optional<int32_t> allocate();
  void release(int32_t block);  // CHECKs that the block is currently allocated
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_blocks() const { return static_cast<int32_t>(in_use_.size()); }

 private:
  std::vector<int32_t> free_;  // LIFO: recently freed blocks are reused first
  std::vector<bool> in_use_;
};

class KvCache {
 public:
  // Pools are f32 on `backend` (the CPU reference keeps the cache in fp32).
  KvCache(Backend& backend, int num_layers, int32_t num_blocks, int64_t block_size,
          int64_t kv_heads, int64_t head_dim);

  const Tensor& k_pool(int layer) const { return k_[static_cast<size_t>(layer)].tensor(); }
  const Tensor& v_pool(int layer) const { return v_[static_cast<size_t>(layer)].tensor(); }
  int64_t block_size() const { return block_size_; }
  KvBlockAllocator& allocator() { return alloc_; }

  // Grows `table` until it covers `num_tokens` positions. On failure (pool exhausted) the table is
  // left as it was and the error says how many blocks were needed.
  Status reserve(std::vector<int32_t>& table, int64_t num_tokens);
  // Returns every block of `table` to the free list and clears it.
  void release(std::vector<int32_t>& table);

 private:
  int64_t block_size_;
  KvBlockAllocator alloc_;
  std::vector<Buffer> k_, v_;
};

}  // namespace sparkserve
