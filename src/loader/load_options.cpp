#include "loader/load_options.h"

#include <cctype>
#include <cmath>
#include <cstdio>

namespace sparkserve {

Expected<uint64_t> parse_byte_size(const std::string& text, const std::string& what) {
  auto bad = [&](const std::string& why) {
    return make_error(what + ": '" + text + "' " + why +
                      " (expected a size such as 4GiB, 512MiB, 1.5GB or a plain number of bytes)");
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number = text.substr(0, i);
  std::string unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  if (number.empty() || number == "." || number.find('.') != number.rfind('.')) return bad("is not a size");
  if (number.size() > 24) return bad("is too long");
  for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kib") scale = 1024.0;
  else if (unit == "m" || unit == "mib") scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gib") scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "kb") scale = 1e3;
  else if (unit == "mb") scale = 1e6;
  else if (unit == "gb") scale = 1e9;
  else if (unit == "tb") scale = 1e12;
  else return bad("has an unknown unit '" + text.substr(i) + "'");
  const double value = std::stod(number) * scale;
  if (!std::isfinite(value) || value >= 1.8e19) return bad("is too large");
  const double rounded = std::floor(value);
  if (rounded != value) return bad("is not a whole number of bytes");
  return static_cast<uint64_t>(rounded);
}

Expected<uint64_t> parse_load_buffer(const std::string& text, const std::string& what) {
  SS_ASSIGN_OR_RETURN(uint64_t bytes, parse_byte_size(text, what));
  if (bytes < kMinLoadBuffer)
    return make_error(what + " " + text + " (" + format_bytes(bytes) + ") is below the minimum of " +
                      format_bytes(kMinLoadBuffer) + " (the host staging buffer that weights are streamed through)");
  if (bytes > kMaxLoadBuffer)
    return make_error(what + " " + text + " is above the maximum of " + format_bytes(kMaxLoadBuffer));
  return bytes;
}

std::string format_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[64];
  if (u == 0) std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace sparkserve
