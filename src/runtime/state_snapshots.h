// The prefix cache's GDN state snapshots: copies of one sequence's whole Gated DeltaNet state
// (conv window + recurrent state, every layer) at a token position, in a fixed pool of state rows
// after the live slots (GdnSlots rows num_slots + i). A snapshot at position n = q*block_size + r
// is found by its key extend(H(q), tokens [q*bs, n)) (prefix_hash.h) and needs, to be resumed,
// the KV of positions [0, n): full blocks 0..q-1 found by their own hashes, and positions
// [q*bs, n) in its tail block, which the snapshot holds (r > 0).
//
// Entries are taken in LRU order when the pool is full. An entry is "pending" from its creation
// until the copy that fills it has run (a snapshot taken after a forward), and only then found.
// For persistence to disk an entry is self-contained: key, position, the tail block's KV rows and
// the state row (see docs/serving-engine.md).
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "runtime/prefix_hash.h"

namespace sparkserve {

struct Snapshot {
  PrefixHash key;
  PrefixHash parent;         // H(q): the full blocks before it
  int64_t position = 0;      // tokens folded into the state
  int32_t tail_block = -1;   // holds positions [q*bs, position) when position % bs != 0
};

class SnapshotPool {
 public:
  SnapshotPool(int32_t capacity, int32_t first_row);

  int32_t capacity() const { return static_cast<int32_t>(entries_.size()); }
  int32_t size() const { return capacity() - static_cast<int32_t>(free_.size()); }
  int32_t row(int32_t id) const { return first_row_ + id; }
  const Snapshot& get(int32_t id) const { return entries_[static_cast<size_t>(id)].snap; }
  // Whether a snapshot (found or pending) holds this key.
  bool contains(const PrefixHash& key) const { return by_key_.count(key) > 0; }

  // A pending entry for `s`, or nullopt when the pool has no entries at all or every entry is
  // pending. When none is free the least recently used found one is evicted first; its tail block
  // (or -1) goes to *evicted_tail for the caller to release.
  std::optional<int32_t> add(const Snapshot& s, int32_t* evicted_tail);
  // The entry's copy has run: lookups find it from now on.
  void publish(int32_t id);
  // Removes an entry (pending or found); returns its tail block (or -1).
  int32_t remove(int32_t id);
  // Found entries whose parent is `parent` (their positions lie in one block).
  const std::vector<int32_t>* with_parent(const PrefixHash& parent) const;
  // Marks a use (lookup hit): evicted last.
  void touch(int32_t id);
  // Found entries, least recently used first.
  const std::list<int32_t>& lru_order() const { return lru_; }

 private:
  struct Entry {
    Snapshot snap;
    bool used = false, found = false;
    std::list<int32_t>::iterator lru;  // valid while found
  };
  int32_t first_row_;
  std::vector<Entry> entries_;
  std::vector<int32_t> free_;
  std::list<int32_t> lru_;  // found entries, least recently used first
  std::unordered_map<PrefixHash, int32_t, PrefixHashOf> by_key_;
  std::unordered_map<PrefixHash, std::vector<int32_t>, PrefixHashOf> by_parent_;
};

}  // namespace sparkserve
