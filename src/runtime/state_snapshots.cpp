#include "runtime/state_snapshots.h"

#include <algorithm>

#include "core/check.h"

namespace sparkserve {

SnapshotPool::SnapshotPool(int32_t capacity, int32_t first_row)
    : first_row_(first_row), entries_(static_cast<size_t>(capacity)) {
  for (int32_t i = capacity - 1; i >= 0; --i) free_.push_back(i);
}

std::optional<int32_t> SnapshotPool::add(const Snapshot& s, int32_t* evicted_tail) {
  *evicted_tail = -1;
  if (free_.empty()) {
    if (lru_.empty()) return std::nullopt;
    *evicted_tail = remove(lru_.front());
  }
  const int32_t id = free_.back();
  free_.pop_back();
  Entry& e = entries_[static_cast<size_t>(id)];
  e.snap = s;
  e.used = true;
  e.found = false;
  CHECK(by_key_.emplace(s.key, id).second);
  return id;
}

void SnapshotPool::publish(int32_t id) {
  Entry& e = entries_[static_cast<size_t>(id)];
  CHECK(e.used && !e.found);
  e.found = true;
  lru_.push_back(id);
  e.lru = std::prev(lru_.end());
  by_parent_[e.snap.parent].push_back(id);
}

int32_t SnapshotPool::remove(int32_t id) {
  Entry& e = entries_[static_cast<size_t>(id)];
  CHECK(e.used);
  if (e.found) {
    lru_.erase(e.lru);
    auto it = by_parent_.find(e.snap.parent);
    std::erase(it->second, id);
    if (it->second.empty()) by_parent_.erase(it);
  }
  by_key_.erase(e.snap.key);
  e.used = e.found = false;
  free_.push_back(id);
  return e.snap.tail_block;
}

const std::vector<int32_t>* SnapshotPool::with_parent(const PrefixHash& parent) const {
  auto it = by_parent_.find(parent);
  return it == by_parent_.end() ? nullptr : &it->second;
}

void SnapshotPool::touch(int32_t id) {
  Entry& e = entries_[static_cast<size_t>(id)];
  CHECK(e.found);
  lru_.splice(lru_.end(), lru_, e.lru);
}

}  // namespace sparkserve
