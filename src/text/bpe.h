// Byte-level BPE model (tokenizer.json "model" of type BPE): vocabulary, merge ranks, and the
// merge loop, applied to the raw bytes of one pre-tokenized piece.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace sparkserve {

using TokenId = int32_t;
// Token ids must lie below this (tables are indexed by id; real vocabularies are far smaller).
inline constexpr int64_t kMaxTokenId = int64_t{1} << 24;

class BpeModel {
 public:
  // `spec` is tokenizer.json "model"; a type other than BPE (Unigram, WordPiece, WordLevel) or an
  // unsupported BPE option is an error naming it.
  static Expected<BpeModel> from_json(const nlohmann::json& spec);

  // Appends the ids of one piece of raw bytes.
  void encode_piece(std::string_view bytes, std::vector<TokenId>& out) const;

  // Number of id slots used by the vocabulary (max id + 1).
  size_t id_limit() const { return id_to_token_.size(); }
  // The vocabulary string of `id` (byte-level characters), or nullptr for an id not in the vocab.
  const std::string* token_string(TokenId id) const;
  // Raw bytes of `id`, or nullptr.
  const std::string* token_bytes(TokenId id) const;
  // Vocabulary id of a token string (byte-level characters), or -1.
  TokenId token_to_id(std::string_view token) const;
  size_t vocab_entries() const { return vocab_entries_; }
  size_t merge_count() const { return merge_count_; }

 private:
  struct MergeTarget {
    int32_t rank;
    TokenId id;
  };
  static uint64_t pair_key(TokenId a, TokenId b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void merge_word(std::string_view bytes, std::vector<TokenId>& out) const;

  std::unordered_map<std::string, TokenId> token_ids_;     // byte-level string -> id
  std::unordered_map<std::string, TokenId> bytes_to_id_;   // raw bytes -> id (reachable tokens)
  std::vector<std::string> id_to_token_;                   // "" for holes
  std::vector<std::string> id_to_bytes_;
  std::vector<uint8_t> id_present_;
  std::unordered_map<uint64_t, MergeTarget> merges_;
  TokenId byte_ids_[256];                                  // id of each single byte, or -1
  bool ignore_merges_ = false;
  size_t vocab_entries_ = 0;
  size_t merge_count_ = 0;
};

}  // namespace sparkserve
