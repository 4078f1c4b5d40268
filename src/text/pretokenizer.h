// tokenizer.json "pre_tokenizer": Split (regex or literal string) and ByteLevel, alone or in a
// Sequence. Splits a normalized text fragment into the pieces that BPE encodes independently.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "text/regex.h"

namespace sparkserve {

class PreTokenizer {
 public:
  static Expected<PreTokenizer> from_json(const nlohmann::json& spec);

  // Splits `text` (valid UTF-8) into pieces of raw bytes, appended to `pieces`. A ByteLevel step's
  // character mapping is not applied here: BPE works on raw bytes directly (the mapping is a
  // bijection, so this is equivalent).
  Status split(std::string_view text, std::vector<std::string>& pieces) const;

 private:
  enum class Behavior { kIsolated, kRemoved, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    enum class Kind { kSplit, kByteLevel } kind;
    Regex regex;            // Split pattern, or GPT-2's pattern for ByteLevel(use_regex=true)
    bool use_regex = false;  // ByteLevel only
    bool add_prefix_space = false;  // ByteLevel only
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
  };
  static Status append_steps(const nlohmann::json& spec, std::vector<Step>& steps);
  Status apply(const Step& step, std::vector<std::string>& pieces) const;

  std::vector<Step> steps_;
};

}  // namespace sparkserve
