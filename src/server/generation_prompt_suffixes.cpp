#include "server/generation_prompt_suffixes.h"

namespace sparkserve {

std::optional<GenerationPromptSuffixes::Suffix> GenerationPromptSuffixes::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

void GenerationPromptSuffixes::put(const std::string& key, Suffix suffix) {
  std::lock_guard<std::mutex> lock(mu_);
  if (map_.size() >= kMaxEntries && !map_.count(key)) map_.clear();
  map_[key] = std::move(suffix);
}

}  // namespace sparkserve
