#include "runtime/block_pool.h"

#include "core/check.h"

namespace sparkserve {

KvBlockPool::KvBlockPool(int32_t num_blocks) : refs_(static_cast<size_t>(num_blocks), 0) {
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::optional<int32_t> KvBlockPool::allocate() {
  if (free_.empty()) return std::nullopt;
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void KvBlockPool::retain(int32_t block) {
  CHECK(block >= 0 && block < num_blocks() && refs_[static_cast<size_t>(block)] > 0);
  ++refs_[static_cast<size_t>(block)];
}

void KvBlockPool::release(int32_t block) {
  CHECK(block >= 0 && block < num_blocks() && refs_[static_cast<size_t>(block)] > 0);
  if (--refs_[static_cast<size_t>(block)] == 0) free_.push_back(block);
}

}  // namespace sparkserve
