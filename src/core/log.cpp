#include "core/log.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>

namespace sparkserve {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}  // namespace

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
bool log_enabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

std::optional<LogLevel> parse_log_level(std::string_view name) {
  std::string n(name);
  for (char& c : n) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (n == "debug") return LogLevel::kDebug;
  if (n == "info") return LogLevel::kInfo;
  if (n == "warning" || n == "warn") return LogLevel::kWarning;
  if (n == "error") return LogLevel::kError;
  return std::nullopt;
}

void log_line(LogLevel level, std::string_view message) {
  if (!log_enabled(level)) return;
  static const char* names[] = {"DEBUG", "INFO", "WARNING", "ERROR"};
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%m-%d %H:%M:%S", &tm);
  std::string line = std::string(names[static_cast<int>(level)]) + " " + stamp + "." +
                     (ms < 100 ? (ms < 10 ? "00" : "0") : "") + std::to_string(ms) + " " + std::string(message) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace sparkserve
