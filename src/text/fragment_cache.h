// A bounded, thread-safe LRU map from text fragments to their token ids, shared by every thread
// that tokenizes with one Tokenizer. A chat request re-sends its whole conversation, and every
// message but the newest was tokenized for the previous request; the server tokenizes on whichever
// worker thread picks the request up, so a per-thread cache would miss whenever the turn lands on
// another thread (an agent's 8K-token system prompt: ~2.5 ms to encode again).
//
// Exact by construction: the tokenizer splits the text at added tokens first and encodes each
// fragment on its own (as HF tokenizers does), so a fragment's ids depend on its text alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sparkserve {

class FragmentCache {
 public:
  using Id = int32_t;
  // max_bytes bounds the text plus ids (4 bytes each) held; a fragment costing more than half of it
  // is never kept.
  explicit FragmentCache(size_t max_bytes) : max_bytes_(max_bytes) {}
  FragmentCache(const FragmentCache&) = delete;
  FragmentCache& operator=(const FragmentCache&) = delete;

  // Appends the ids of `text` to `out` (and marks it most recently used) when it is cached.
  bool append(std::string_view text, std::vector<Id>& out);
  // Remembers `ids` as the ids of `text`, evicting the least recently used fragments beyond the bound.
  void put(std::string_view text, std::vector<Id> ids);

  size_t bytes() const;
  size_t size() const;
  size_t max_bytes() const { return max_bytes_; }

 private:
  struct Entry {
    std::string text;
    std::vector<Id> ids;
    size_t cost() const { return text.size() + ids.size() * sizeof(Id); }
  };
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first; list nodes never move, so keys may view them
  std::unordered_map<std::string_view, std::list<Entry>::iterator> index_;
  size_t bytes_ = 0;
  const size_t max_bytes_;
};

}  // namespace sparkserve
