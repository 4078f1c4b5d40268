// tokenizer.json "normalizer": null, NFC (HF tokenizers' NFC, see normalizer.cpp)/NFD/NFKC/NFKD (utf8proc), or a Sequence.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace sparkserve {

class Normalizer {
 public:
  enum class Form { kNFC, kNFD, kNFKC, kNFKD };

  // `spec` is the tokenizer.json "normalizer" value; an unknown type is an error naming it.
  static Expected<Normalizer> from_json(const nlohmann::json& spec);

  bool is_identity() const { return steps_.empty(); }
  // `text` must be valid UTF-8 (the tokenizer validates input up front).
  std::string normalize(std::string_view text) const;

 private:
  std::vector<Form> steps_;
};

}  // namespace sparkserve
