// Content hashes of token prefixes for the prefix cache. A KV block is found by the hash of every
// token up to its end, chained block by block: H(0) = 0, H(q+1) = extend(H(q), tokens of block q);
// a GDN state snapshot at position n = q*block_size + r by extend(H(q), its r tail tokens).
//
// extend is SipHash-2-4 (a keyed PRF) under two independent 128-bit keys, giving 128 bits. The
// keys are random per process, so nobody can craft a prompt whose prefix collides with another
// user's and be served that user's cached state (the attack on unkeyed prefix hashes); an
// accidental collision has probability ~2^-128 per pair. Cache entries persisted to disk would
// store the keys with them.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace sparkserve {

struct PrefixHash {
  uint64_t lo = 0, hi = 0;
  bool operator==(const PrefixHash&) const = default;
};

struct PrefixHashOf {
  size_t operator()(const PrefixHash& h) const { return static_cast<size_t>(h.lo); }
};

// SipHash-2-4 of `bytes` under the 128-bit key (k0, k1) (the reference's key bytes 0-7 and 8-15,
// little-endian).
uint64_t siphash24(uint64_t k0, uint64_t k1, std::span<const uint8_t> bytes);

class PrefixHasher {
 public:
  PrefixHasher();                                // random keys
  explicit PrefixHasher(uint64_t seed);          // fixed keys derived from seed (tests)
  explicit PrefixHasher(const std::array<uint64_t, 4>& keys) : key_(keys) {}
  // The hash of a prefix extended by `tokens`.
  PrefixHash extend(const PrefixHash& prefix, std::span<const int32_t> tokens) const;

 private:
  std::array<uint64_t, 4> key_;
};

}  // namespace sparkserve
