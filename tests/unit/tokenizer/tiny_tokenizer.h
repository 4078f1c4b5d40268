// Builds small tokenizer.json documents for the unit tests.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "text/byte_level.h"
#include "text/tokenizer.h"

namespace sparkserve::testing {

inline const char* kQwen35Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct TinySpec {
  // Extra vocab entries (raw bytes) after the 256 single bytes (ids 0..255 = byte values).
  std::vector<std::string> extra_tokens;
  std::vector<std::pair<std::string, std::string>> merges;  // raw bytes
  nlohmann::json added_tokens = nlohmann::json::array();
  nlohmann::json normalizer = {{"type", "NFC"}};
  std::string pattern = kQwen35Pattern;
  bool ignore_merges = false;
  bool merges_as_strings = false;
};

// Vocab: ids 0..255 are the single bytes (in byte order), then extra_tokens from 256 on.
inline nlohmann::json tiny_tokenizer_json(const TinySpec& s) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_chars()[b]] = b;
  int id = 256;
  for (const auto& t : s.extra_tokens) vocab[byte_level_encode(t)] = id++;
  nlohmann::json merges = nlohmann::json::array();
  for (const auto& [a, b] : s.merges) {
    if (s.merges_as_strings) merges.push_back(byte_level_encode(a) + " " + byte_level_encode(b));
    else merges.push_back({byte_level_encode(a), byte_level_encode(b)});
  }
  nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  return {
      {"version", "1.0"},
      {"added_tokens", s.added_tokens},
      {"normalizer", s.normalizer},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", s.pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
          byte_level}}}},
      {"post_processor", byte_level},
      {"decoder", byte_level},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
        {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false},
        {"ignore_merges", s.ignore_merges}, {"vocab", vocab}, {"merges", merges}}},
  };
}

inline nlohmann::json added_token(int id, const std::string& content, bool special, bool normalized = false,
                                  bool lstrip = false, bool rstrip = false, bool single_word = false) {
  return {{"id", id}, {"content", content}, {"special", special}, {"normalized", normalized},
          {"lstrip", lstrip}, {"rstrip", rstrip}, {"single_word", single_word}};
}

inline Tokenizer make_tiny(const TinySpec& s, const std::string& config = "") {
  auto t = Tokenizer::from_json_text(tiny_tokenizer_json(s).dump(), config);
  if (!t.ok()) throw std::runtime_error(t.message());
  return std::move(t).value();
}

inline std::vector<TokenId> ids_of(const std::string& bytes) {
  std::vector<TokenId> out;
  for (unsigned char c : bytes) out.push_back(c);
  return out;
}

}  // namespace sparkserve::testing
