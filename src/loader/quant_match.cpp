#include "loader/quant_match.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fnmatch.h>

namespace sparkserve {

struct TargetMatcher::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

Expected<TargetMatcher> TargetMatcher::compile(const std::string& entry) {
  TargetMatcher m;
  m.entry_ = entry;
  if (entry.rfind("re:", 0) == 0) {
    const std::string pattern = entry.substr(3);
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_ANCHORED | PCRE2_UTF, &err, &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      return make_error("invalid regex in \"" + entry + "\" at offset " + std::to_string(offset) + ": " +
                        reinterpret_cast<const char*>(msg));
    }
    m.regex_ = std::make_shared<Regex>();
    m.regex_->code = code;
  }
  return m;
}

bool TargetMatcher::matches_name(std::string_view name) const {
  if (!regex_) return name == entry_;
  // One ovector pair is enough: only whether it matches matters (rc 0 = matched, ovector too small).
  struct MatchData {
    pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
    ~MatchData() { pcre2_match_data_free(md); }
  };
  thread_local MatchData data;
  int rc = pcre2_match(regex_->code, reinterpret_cast<PCRE2_SPTR>(name.data()), name.size(), 0, PCRE2_ANCHORED,
                       data.md, nullptr);
  return rc >= 0;
}

bool TargetMatcher::matches_class(ModuleClass cls) const {
  if (regex_) return false;
  if (entry_ == "Linear" || entry_ == "LinearBase")
    return cls == ModuleClass::kLinear || cls == ModuleClass::kFusedExperts;
  if (entry_ == "Embedding") return cls == ModuleClass::kEmbedding;
  return false;
}

std::vector<std::string> module_name_aliases(std::string_view name) {
  std::vector<std::string> out{std::string(name)};
  auto add = [&](std::string s) {
    for (const auto& o : out)
      if (o == s) return;
    out.push_back(std::move(s));
  };
  auto swap_prefix = [&](std::string_view from, std::initializer_list<std::string_view> tos) {
    if (!name.starts_with(from)) return false;
    std::string_view rest = name.substr(from.size());
    for (auto to : tos) add(std::string(to) + std::string(rest));
    return true;
  };
  if (swap_prefix("model.language_model.", {"model.", "language_model.model."})) return out;
  if (swap_prefix("language_model.model.", {"model.language_model.", "model."})) return out;
  if (swap_prefix("model.visual.", {"visual."})) return out;
  if (swap_prefix("visual.", {"model.visual."})) return out;
  if (swap_prefix("language_model.lm_head", {"lm_head"})) return out;
  if (swap_prefix("lm_head", {"language_model.lm_head"})) return out;
  if (swap_prefix("model.", {"model.language_model.", "language_model.model."})) return out;
  return out;
}

bool fnmatch_name(const std::string& pattern, const std::string& name) {
  return ::fnmatch(pattern.c_str(), name.c_str(), 0) == 0;
}

}  // namespace sparkserve
