#include "text/fragment_cache.h"

namespace sparkserve {

bool FragmentCache::append(std::string_view text, std::vector<Id>& out) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = index_.find(text);
  if (it == index_.end()) return false;
  lru_.splice(lru_.begin(), lru_, it->second);
  out.insert(out.end(), it->second->ids.begin(), it->second->ids.end());
  return true;
}

void FragmentCache::put(std::string_view text, std::vector<Id> ids) {
  const size_t cost = text.size() + ids.size() * sizeof(Id);
  if (cost > max_bytes_ / 2) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (index_.count(text)) return;  // another thread encoded it meanwhile: the same ids
  while (!lru_.empty() && bytes_ + cost > max_bytes_) {
    bytes_ -= lru_.back().cost();
    index_.erase(lru_.back().text);
    lru_.pop_back();
  }
  lru_.push_front(Entry{std::string(text), std::move(ids)});
  index_.emplace(lru_.front().text, lru_.begin());
  bytes_ += cost;
}

size_t FragmentCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

size_t FragmentCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

}  // namespace sparkserve
