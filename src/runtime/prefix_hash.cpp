#include "runtime/prefix_hash.h"

#include <random>

namespace sparkserve {
namespace {

uint64_t rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

void sip_round(uint64_t& v0, uint64_t& v1, uint64_t& v2, uint64_t& v3) {
  v0 += v1;
  v1 = rotl(v1, 13);
  v1 ^= v0;
  v0 = rotl(v0, 32);
  v2 += v3;
  v3 = rotl(v3, 16);
  v3 ^= v2;
  v0 += v3;
  v3 = rotl(v3, 21);
  v3 ^= v0;
  v2 += v1;
  v1 = rotl(v1, 17);
  v1 ^= v2;
  v2 = rotl(v2, 32);
}

uint64_t load_le64(const uint8_t* p, size_t n) {
  uint64_t x = 0;
  for (size_t i = 0; i < n; ++i) x |= static_cast<uint64_t>(p[i]) << (8 * i);
  return x;
}

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// SipHash-2-4's state over a message fed as little-endian 64-bit words.
struct SipState {
  uint64_t v0, v1, v2, v3;
  SipState(uint64_t k0, uint64_t k1)
      : v0(k0 ^ 0x736f6d6570736575ULL), v1(k1 ^ 0x646f72616e646f6dULL), v2(k0 ^ 0x6c7967656e657261ULL),
        v3(k1 ^ 0x7465646279746573ULL) {}
  void word(uint64_t m) {
    v3 ^= m;
    sip_round(v0, v1, v2, v3);
    sip_round(v0, v1, v2, v3);
    v0 ^= m;
  }
  // `last`: the message's remaining (< 8) bytes, its length's low byte on top.
  uint64_t finish(uint64_t last) {
    word(last);
    v2 ^= 0xff;
    for (int i = 0; i < 4; ++i) sip_round(v0, v1, v2, v3);
    return v0 ^ v1 ^ v2 ^ v3;
  }
};

}  // namespace

uint64_t siphash24(uint64_t k0, uint64_t k1, std::span<const uint8_t> bytes) {
  SipState st(k0, k1);
  const size_t n = bytes.size(), full = n / 8 * 8;
  for (size_t i = 0; i < full; i += 8) st.word(load_le64(bytes.data() + i, 8));
  return st.finish(load_le64(bytes.data() + full, n - full) | (static_cast<uint64_t>(n & 0xff) << 56));
}

PrefixHasher::PrefixHasher() {
  std::random_device rd;
  for (uint64_t& k : key_) k = (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

PrefixHasher::PrefixHasher(uint64_t seed) {
  for (uint64_t& k : key_) k = splitmix64(seed);
}

PrefixHash PrefixHasher::extend(const PrefixHash& prefix, std::span<const int32_t> tokens) const {
  // The message: prefix.lo | prefix.hi | token ids, little-endian (the token count is implied by the
  // length SipHash folds in). Its 64-bit words are read straight from the ids (two per word), and
  // both keys' states take each word in the same pass: the engine hashes every block of a prompt
  // at admission (~750 for a 12K-token agent turn), so no buffer is built per block.
  SipState a(key_[0], key_[1]), b(key_[2], key_[3]);
  for (const uint64_t m : {prefix.lo, prefix.hi}) {
    a.word(m);
    b.word(m);
  }
  const size_t n = tokens.size();
  size_t t = 0;
  for (; t + 2 <= n; t += 2) {
    const uint64_t m = static_cast<uint64_t>(static_cast<uint32_t>(tokens[t])) |
                       static_cast<uint64_t>(static_cast<uint32_t>(tokens[t + 1])) << 32;
    a.word(m);
    b.word(m);
  }
  const uint64_t bytes = 16 + 4 * static_cast<uint64_t>(n);
  const uint64_t last = (t < n ? static_cast<uint64_t>(static_cast<uint32_t>(tokens[t])) : 0) | ((bytes & 0xff) << 56);
  return PrefixHash{a.finish(last), b.finish(last)};
}

}  // namespace sparkserve
