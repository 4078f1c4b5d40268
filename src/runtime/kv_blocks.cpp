#include "runtime/kv_blocks.h"

#include <string>

namespace sparkserve {

KvBlockAllocator::KvBlockAllocator(int32_t num_blocks) : in_use_(static_cast<size_t>(num_blocks), false) {
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

std::optional<int32_t> KvBlockAllocator::allocate() {
  if (free_.empty()) return std::nullopt;
  int32_t b = free_.back();
  free_.pop_back();
  in_use_[static_cast<size_t>(b)] = true;
  return b;
}

void KvBlockAllocator::release(int32_t block) {
  CHECK(block >= 0 && block < num_blocks() && in_use_[static_cast<size_t>(block)]);
  in_use_[static_cast<size_t>(block)] = false;
  free_.push_back(block);
}

KvCache::KvCache(Backend& backend, int num_layers, int32_t num_blocks, int64_t block_size,
                 int64_t kv_heads, int64_t head_dim)
    : block_size_(block_size), alloc_(num_blocks) {
  for (int l = 0; l < num_layers; ++l) {
    k_.emplace_back(&backend, DType::kF32, std::vector<int64_t>{num_blocks, block_size, kv_heads, head_dim});
    v_.emplace_back(&backend, DType::kF32, std::vector<int64_t>{num_blocks, block_size, kv_heads, head_dim});
  }
}

Status KvCache::reserve(std::vector<int32_t>& table, int64_t num_tokens) {
  const int64_t needed = (num_tokens + block_size_ - 1) / block_size_;
  const size_t before = table.size();
  while (static_cast<int64_t>(table.size()) < needed) {
    auto b = alloc_.allocate();
    if (!b) {
      while (table.size() > before) {
        alloc_.release(table.back());
        table.pop_back();
      }
      return make_error("KV cache full: " + std::to_string(num_tokens) + " tokens need " +
                        std::to_string(needed) + " blocks of " + std::to_string(block_size_) +
                        ", only " + std::to_string(alloc_.num_free() + static_cast<int64_t>(before)) +
                        " available to this sequence");
    }
    table.push_back(*b);
  }
  return Status::Ok();
}

void KvCache::release(std::vector<int32_t>& table) {
  for (int32_t b : table) alloc_.release(b);
  table.clear();
}

}  // namespace sparkserve
