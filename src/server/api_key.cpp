#include "server/api_key.h"

#include <cstddef>

namespace sparkserve {

bool constant_time_equals(std::string_view a, std::string_view b) {
  // Every byte of the longer input is visited whatever the contents; a length difference is
  // folded into the same accumulator instead of returning early.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned diff = a.size() == b.size() ? 0u : 1u;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned>(x ^ y);
  }
  return diff == 0;
}

bool api_key_matches(std::optional<std::string_view> authorization, std::string_view key) {
  if (!authorization) return false;
  std::string_view v = *authorization;
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  constexpr std::string_view kScheme = "bearer";
  if (v.size() <= kScheme.size()) return false;
  for (size_t i = 0; i < kScheme.size(); ++i) {
    char c = v[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    if (c != kScheme[i]) return false;
  }
  v.remove_prefix(kScheme.size());
  if (v.front() != ' ' && v.front() != '\t') return false;
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  return constant_time_equals(v, key);
}

}  // namespace sparkserve
