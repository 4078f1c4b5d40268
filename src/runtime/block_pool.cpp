#include "runtime/block_pool.h"

#include "core/check.h"

namespace sparkserve {

KvBlockPool::KvBlockPool(int32_t num_blocks) : blocks_(static_cast<size_t>(num_blocks)) {
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

void KvBlockPool::forget_hash(Block& b) {
  if (!b.hashed) return;
  auto it = by_hash_.find(b.hash);
  if (it != by_hash_.end() && &blocks_[static_cast<size_t>(it->second)] == &b) by_hash_.erase(it);
  b.hashed = false;
}

std::optional<int32_t> KvBlockPool::allocate() {
  int32_t id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else if (!lru_.empty()) {
    id = lru_.front();
    lru_.pop_front();
    forget_hash(blocks_[static_cast<size_t>(id)]);
  } else {
    return std::nullopt;
  }
  Block& b = blocks_[static_cast<size_t>(id)];
  CHECK(b.refs == 0 && !b.hashed);
  b.refs = 1;
  ++held_by_sequences_;
  return id;
}

void KvBlockPool::count_sequence_hold(const Block& before, const Block& after) {
  held_by_sequences_ += (after.refs > after.cache_refs) - (before.refs > before.cache_refs);
}

void KvBlockPool::retain(int32_t block, bool cache) {
  CHECK(block >= 0 && block < num_blocks());
  Block& b = blocks_[static_cast<size_t>(block)];
  CHECK_MSG(b.refs > 0 || b.hashed, "retain of a free block");
  if (b.refs == 0) lru_.erase(b.lru);
  const Block before = b;
  ++b.refs;
  b.cache_refs += cache;
  count_sequence_hold(before, b);
}

void KvBlockPool::release(int32_t block, bool cache) {
  CHECK(block >= 0 && block < num_blocks());
  Block& b = blocks_[static_cast<size_t>(block)];
  CHECK(b.refs > 0 && (!cache || b.cache_refs > 0));
  const Block before = b;
  --b.refs;
  b.cache_refs -= cache;
  count_sequence_hold(before, b);
  if (b.refs > 0) return;
  if (b.hashed) {
    lru_.push_back(block);
    b.lru = std::prev(lru_.end());
  } else {
    free_.push_back(block);
  }
}

void KvBlockPool::register_hash(int32_t block, const PrefixHash& h) {
  Block& b = blocks_[static_cast<size_t>(block)];
  CHECK(b.refs > 0);
  if (b.hashed || by_hash_.count(h)) return;
  b.hashed = true;
  b.hash = h;
  by_hash_.emplace(h, block);
}

int32_t KvBlockPool::lookup(const PrefixHash& h) const {
  auto it = by_hash_.find(h);
  return it == by_hash_.end() ? -1 : it->second;
}

}  // namespace sparkserve
