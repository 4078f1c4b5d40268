// Paged KV cache storage for the full-attention layers: one pool per layer
// [num_blocks, block_size, kv_heads, head_dim] in f32, bf16 or fp8 with per-row scales (KvPool,
// backend/ops.h), indexed by block id. Which block belongs to whom is
// not decided here (the engine's KvBlockPool, or DirectState for a tool running sequences itself).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/ops.h"

namespace sparkserve {

// Bytes one token's K and V take in one layer's pools of `dtype` (f32, bf16 or fp8 with its f32
// scale per kv head).
int64_t kv_bytes_per_token(DType dtype, int64_t kv_heads, int64_t head_dim);

class KvCache {
 public:
  // Pools of `dtype` (kF32, kBF16 or kF8E4M3) on `backend`.
  KvCache(Backend& backend, int num_layers, int32_t num_blocks, int64_t block_size,
          int64_t kv_heads, int64_t head_dim, DType dtype = DType::kF32);

  const KvPool& pool(int layer) const { return pools_[static_cast<size_t>(layer)]; }
  DType dtype() const { return dtype_; }
  int num_layers() const { return static_cast<int>(pools_.size()); }
  int64_t block_size() const { return block_size_; }
  int32_t num_blocks() const { return num_blocks_; }

  // Appends the copies that make block dst's keys and values (every position, every layer, fp8
  // scales too) block src's (for Backend::copy_batch).
  void add_block_copies(int32_t src, int32_t dst, std::vector<TensorCopy>& out) const;

 private:
  Backend* backend_;
  int64_t block_size_;
  int32_t num_blocks_;
  DType dtype_;
  std::vector<Buffer> buffers_;  // per layer: k, v (and k_scale, v_scale for fp8)
  std::vector<KvPool> pools_;
};

}  // namespace sparkserve
