// Accounting of the KV cache's blocks: which are free, and how many holders each used block has
// (a sequence's block table, a prefix-cache entry). The storage is KvCache (kv_blocks.h).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace sparkserve {

class KvBlockPool {
 public:
  explicit KvBlockPool(int32_t num_blocks);

  // A free block with one holder, or nullopt when none is left.
  std::optional<int32_t> allocate();
  // One more holder of a used block.
  void retain(int32_t block);
  // One holder less; the last one returns the block to the free list. CHECKs the block is used.
  void release(int32_t block);

  int32_t num_blocks() const { return static_cast<int32_t>(refs_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t holders(int32_t block) const { return refs_[static_cast<size_t>(block)]; }

 private:
  std::vector<int32_t> free_;  // LIFO: recently freed blocks are reused first
  std::vector<int32_t> refs_;
};

}  // namespace sparkserve
