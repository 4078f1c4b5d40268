// PCRE2 (UTF + UCP, JIT-compiled) regex used by the Split pre-tokenizer. Hugging Face tokenizers
// runs these patterns with Oniguruma; the one class where the two engines differ on the
// patterns tokenizers use is \s (PCRE2's UCP \s adds U+180E), so \s and \S are rewritten to
// Oniguruma's set: the Unicode White_Space property.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace sparkserve {

class Regex {
 public:
  // `literal`: match `pattern` as a plain string (tokenizer.json Split {"String": ...}).
  static Expected<Regex> compile(std::string_view pattern, bool literal = false);

  // Appends the [start, end) byte ranges of all non-empty, non-overlapping matches in `subject`
  // (valid UTF-8), left to right. Fails only if the JIT stack limit is hit.
  Status find_all(std::string_view subject, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
};

// The pattern with \s / \S replaced by explicit White_Space classes (exposed for unit tests).
std::string oniguruma_compatible_pattern(std::string_view pattern);

}  // namespace sparkserve
