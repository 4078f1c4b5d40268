// Accounting of the KV cache's blocks. A block is free, or held: by running sequences' block
// tables and by prefix-cache snapshots (its "cache holders"), counted per block. A full block may
// also carry the content hash of the prefix it ends (prefix_hash.h): while it does, a sequence
// with that prefix can share it instead of recomputing it. A hashed block nobody holds stays cached
// in LRU order and is reused last: allocate() takes never-hashed free blocks first, then evicts the
// least recently released cached block. The storage is KvCache (kv_blocks.h).
#pragma once

#include <cstdint>
#include <list>
#include <optional>
#include <unordered_map>
#include <vector>

#include "runtime/prefix_hash.h"

namespace sparkserve {

class KvBlockPool {
 public:
  explicit KvBlockPool(int32_t num_blocks);

  // A block with one holder, or nullopt when none is free or cached.
  std::optional<int32_t> allocate();
  // One more holder (a cached block nobody held leaves the LRU). `cache`: the holder is a
  // prefix-cache entry, not a sequence.
  void retain(int32_t block, bool cache = false);
  // One holder less; the last one makes the block cached (hashed) or free. CHECKs it is held.
  void release(int32_t block, bool cache = false);

  // Records that `block`, full and held, ends the prefix with hash `h`. Ignored when another block
  // already carries `h` (the first stays the one lookups find) or the block already has a hash.
  void register_hash(int32_t block, const PrefixHash& h);
  // The block ending prefix `h`, or -1.
  int32_t lookup(const PrefixHash& h) const;

  int32_t num_blocks() const { return static_cast<int32_t>(blocks_.size()); }
  // Blocks allocate() can hand out: free plus cached-unheld.
  int32_t num_available() const { return static_cast<int32_t>(free_.size() + lru_.size()); }
  int32_t num_cached_unheld() const { return static_cast<int32_t>(lru_.size()); }
  int32_t num_hashed() const { return static_cast<int32_t>(by_hash_.size()); }
  // Blocks some sequence holds (what KV-cache usage reports).
  int32_t num_held_by_sequences() const { return held_by_sequences_; }
  int32_t holders(int32_t block) const { return blocks_[static_cast<size_t>(block)].refs; }

 private:
  struct Block {
    int32_t refs = 0, cache_refs = 0;
    bool hashed = false;
    PrefixHash hash;
    std::list<int32_t>::iterator lru;  // valid while cached and unheld
  };
  void forget_hash(Block& b);
  void count_sequence_hold(const Block& before, const Block& after);

  std::vector<Block> blocks_;
  std::vector<int32_t> free_;  // never-hashed or evicted blocks, LIFO
  std::list<int32_t> lru_;     // hashed blocks nobody holds, least recently released first
  std::unordered_map<PrefixHash, int32_t, PrefixHashOf> by_hash_;
  int32_t held_by_sequences_ = 0;
};

}  // namespace sparkserve
