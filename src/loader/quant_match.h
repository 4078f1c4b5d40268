// Name matching for quantization configs.
// compressed-tensors targets and ignore entries: "re:<pattern>" is Python re.match = anchored at the
// START only (re:.*in_proj_qkv also matches ...in_proj_qkvz); any other entry is an exact module name
// or a class name ("Linear", "Embedding"). ModelOpt exclude_modules are fnmatch wildcards.
// Names are tried raw first (the namespace the config was written in), then under the prefix aliases
// other tools use: model.language_model. <-> model. <-> language_model.model., model.visual. <->
// visual., lm_head <-> language_model.lm_head.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace sparkserve {

// Module classes as far as a loader can tell them from tensors.
enum class ModuleClass : uint8_t { kLinear, kFusedExperts, kEmbedding, kOther };

class TargetMatcher {
 public:
  // Compiles "re:" patterns with PCRE2 (anchored at the start); errors name the entry.
  static Expected<TargetMatcher> compile(const std::string& entry);
  const std::string& entry() const { return entry_; }
  bool is_regex() const { return regex_ != nullptr; }
  // Exact equality or regex match of the module name.
  bool matches_name(std::string_view name) const;
  // Class-name match: "Linear"/"LinearBase" match Linear modules and fused experts; "Embedding"
  // matches embeddings. Regex entries never match a class.
  bool matches_class(ModuleClass cls) const;

 private:
  struct Regex;
  std::string entry_;
  std::shared_ptr<Regex> regex_;
};

// The raw name first, then its aliases (no duplicates).
std::vector<std::string> module_name_aliases(std::string_view name);

// Python fnmatch.fnmatchcase semantics (*, ?, [seq], [!seq]; '*' also crosses '.').
bool fnmatch_name(const std::string& pattern, const std::string& name);

}  // namespace sparkserve
